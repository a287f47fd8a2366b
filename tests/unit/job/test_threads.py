"""The ranks' OMP_NUM_THREADS default: the pure rule, the plan, and the start line's words."""

from __future__ import annotations

import pytest

from zlaunch.job.hostfile import Host
from zlaunch.job.options import LaunchOptions
from zlaunch.job.plan import build_plan
from zlaunch.job.threads import default_threads, thread_env, threads_words


@pytest.mark.parametrize(
    "cpus,ranks,expected",
    [(2, 2, 1), (16, 2, 8), (16, 3, 5), (1, 4, 1), (8, 8, 1), (8, 1, 8), (3, 0, 3)],
)
def test_default_is_the_cores_shared_among_the_node_s_ranks(cpus, ranks, expected):
    assert default_threads(cpus, ranks) == expected


def test_the_user_s_value_wins_and_unknown_cores_set_nothing():
    assert thread_env({}, 16, 4) == {"OMP_NUM_THREADS": "4"}
    assert thread_env({"OMP_NUM_THREADS": "7"}, 16, 4) == {}
    assert thread_env({"OMP_NUM_THREADS": ""}, 16, 4) == {}  # set empty is set
    assert thread_env({}, None, 4) == {}


def _options(env: dict[str, str], hosts: tuple[Host, ...]) -> LaunchOptions:
    return LaunchOptions(
        hosts=hosts, program=("train.py",), python="/usr/bin/python3", cwd="/job", env=env
    )


def test_each_node_gets_its_own_cores_divided_by_its_own_ranks():
    hosts = (Host("a", slots=(0, 1)), Host("b", slots=(0, 1, 2, 3)))
    plan = build_plan(
        _options({}, hosts), hosts, master_addr="a", master_port=1, run_id="r", attempt=0,
        usable_cpus=[16, 16],
    )  # fmt: skip
    assert [w.env["OMP_NUM_THREADS"] for w in plan.workers] == ["8", "8", "4", "4", "4", "4"]


def test_a_user_value_reaches_every_rank_unchanged():
    hosts = (Host("a", slots=(0, 1)),)
    options = _options({"OMP_NUM_THREADS": "3"}, hosts)
    plan = build_plan(
        options, hosts, master_addr="a", master_port=1, run_id="r", attempt=0, usable_cpus=[16]
    )
    assert [w.env["OMP_NUM_THREADS"] for w in plan.workers] == ["3", "3"]


def test_start_line_words():
    assert threads_words([("a", 16, 2, "8"), ("b", 16, 2, "8")]) == (
        "OMP_NUM_THREADS=8 (16 cores / 2 ranks; set it to choose)"
    )
    assert threads_words([("a", 16, 2, "8"), ("b", 4, 1, "4")]) == (
        "OMP_NUM_THREADS=8 on a, 4 on b (cores / ranks per node; set it to choose)"
    )
    assert threads_words([("a", 16, 2, None)]) == ""
