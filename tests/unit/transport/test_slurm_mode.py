"""--slurm-mode and --controller-addr: which way --launcher slurm starts the agents (pure: the
options are built from a made-up allocation, nothing is started)."""

from __future__ import annotations

import os

import pytest

from zlaunch.commands.run_options import build_options
from zlaunch.errors import UsageError
from zlaunch.transport.slurm_one_step import ONE_STEP_ABOVE_NODES, one_step_argv


def _alloc(nodes: int) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NODELIST": f"gpu[001-{nodes:03d}]",
        "SLURM_TASKS_PER_NODE": f"2(x{nodes})",
    }


def _options(tmp_path, environ, **values):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    base = {"PATH": os.environ.get("PATH", "")}
    return build_options(
        script=str(script), script_args=(), environ={**base, **environ}, home=str(tmp_path),
        **values,
    )  # fmt: skip


def test_auto_is_a_step_per_node_up_to_the_threshold_and_one_step_above(tmp_path):
    at = _options(tmp_path, _alloc(ONE_STEP_ABOVE_NODES))
    above = _options(tmp_path, _alloc(ONE_STEP_ABOVE_NODES + 1))
    assert (at.launcher, at.slurm_mode) == ("slurm", "step-per-node")
    assert (above.launcher, above.slurm_mode) == ("slurm", "one-step")
    # the selected nodes count, not the allocation's
    fewer = _options(tmp_path, _alloc(ONE_STEP_ABOVE_NODES + 1), num_nodes=ONE_STEP_ABOVE_NODES)
    assert fewer.slurm_mode == "step-per-node"


def test_the_mode_can_be_chosen_either_way(tmp_path):
    alloc = _alloc(ONE_STEP_ABOVE_NODES + 4)
    assert _options(tmp_path, alloc, slurm_mode="step-per-node").slurm_mode == "step-per-node"
    assert _options(tmp_path, _alloc(2), slurm_mode="One-Step").slurm_mode == "one-step"


def test_a_controller_address_means_one_step_and_is_kept(tmp_path):
    options = _options(tmp_path, _alloc(2), controller_addr="10.1.2.3")
    assert options.slurm_mode == "one-step" and options.controller_addr == "10.1.2.3"
    assert _options(tmp_path, _alloc(2), controller_addr="[fd00::5]").controller_addr == "fd00::5"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"slurm_mode": "tree"}, "--slurm-mode 'tree': expected auto, step-per-node, one-step"),
        ({"controller_addr": "login1:4000"}, "--controller-addr 'login1:4000': expected a host"),
        ({"controller_addr": " "}, "expected a host name or an address"),
        (
            {"slurm_mode": "step-per-node", "controller_addr": "10.1.2.3"},
            "--controller-addr has no effect with --slurm-mode step-per-node",
        ),
        ({"launcher": "ssh", "slurm_mode": "one-step"}, "--slurm-mode has no effect with --l"),
        ({"launcher": "ssh", "controller_addr": "h"}, "--controller-addr has no effect with --l"),
    ],
)
def test_bad_choices_are_refused_naming_the_option(tmp_path, values, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        _options(tmp_path, _alloc(2), **values)


def test_one_srun_for_every_node_with_one_task_each():
    argv = one_step_argv(
        ["gpu001", "gpu002", "gpu003"], "12", ["python3", "-u", "-m", "zlaunch.agent"],
        "10.0.0.1:4000", "zlaunch-agents-abcd", ["--gres=gpu:8"], srun="/usr/bin/srun",
    )  # fmt: skip
    assert argv == [
        "/usr/bin/srun", "--jobid=12", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
        "--nodelist=gpu001,gpu002,gpu003", "--overlap", "--cpu-bind=none",
        "--kill-on-bad-exit=0", "--wait=0", "--label", "--input=none", "--quiet",
        "--job-name=zlaunch-agents-abcd", "--gres=gpu:8", "--",
        "python3", "-u", "-m", "zlaunch.agent", "--connect", "10.0.0.1:4000",
    ]  # fmt: skip
    assert not any("TOKEN" in a.upper() for a in argv)  # the token travels in the environment


def test_an_agent_is_matched_by_its_node_name_or_an_unambiguous_short_name():
    from zlaunch.job.hostfile import Host
    from zlaunch.transport.roster import _index_by_name

    hosts = [Host("gpu1.a.example", (0,)), Host("gpu2.a.example", (0,)), Host("gpu2.b", (0,))]
    index = _index_by_name(hosts)
    assert index["gpu1.a.example"] == 0 and index["gpu1"] == 0
    assert index["gpu2.b"] == 2 and "gpu2" not in index  # two hosts share it: no guess


def test_the_controller_address_is_the_given_one_or_the_route_to_the_nodes():
    from zlaunch.job.hostfile import Host
    from zlaunch.transport.slurm_one_step import controller_address

    assert controller_address([Host("gpu001", (0,))], "10.9.8.7") == "10.9.8.7"
    # a node that is this machine, by loopback: only right when every node is this machine
    assert controller_address([Host("127.0.0.1", (0,)), Host("127.0.0.2", (0,))], None) in (
        "127.0.0.1",
        "127.0.0.2",
    )
    # more nodes than were looked at all reached over loopback: a resolver that is wrong
    many = [Host(f"127.0.0.{i}", (0,)) for i in range(1, 7)]
    with pytest.raises(UsageError, match="cannot tell at which address the nodes reach"):
        controller_address(many, None)


def test_allocation_hosts_says_a_bad_hostlist_as_a_usage_error():
    from zlaunch.errors import UsageError
    from zlaunch.transport.slurm import allocation_hosts

    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[" + "9" * 4400 + "]"}
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST"):
        allocation_hosts(env)
