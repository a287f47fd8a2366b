"""How a job that can grow is wired: the hosts and batch after hosts joined
(`options_after_grow`), which ready hosts an attempt hands to its machine (room under
--max-nodes, once each, never one the job cannot run with), and which hosts the job's prober
is told to probe (spares from the start, lost hosts after an attempt)."""

from __future__ import annotations

import json

import pytest

from zlaunch.errors import LaunchError
from zlaunch.job import Host, LaunchOptions
from zlaunch.launcher.elastic import options_after_grow
from zlaunch.launcher.job import Attempt, Job, _prober_of
from zlaunch.launcher.state import HostReturned


def host(name: str, slots: int = 1) -> Host:
    return Host(name, tuple(range(slots)))


def opts(tmp_path, hosts, spares=(), max_nodes=3, gas=2, **extra) -> LaunchOptions:
    config = tmp_path / f"ds-{gas}.json"
    config.write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas})
    )
    values = dict(
        hosts=tuple(hosts),
        program=("train.py",),
        python="python3",
        cwd=str(tmp_path),
        config_path=str(config),
        checkpoint_dir=str(tmp_path / "ckpt"),
        max_restarts=1,
        min_nodes=1,
        max_nodes=max_nodes,
        spare_hosts=tuple(spares),
    )
    values.update(extra)
    return LaunchOptions(**values)


# ---- the attempt after hosts joined -----------------------------------------------------------


def test_a_host_that_comes_back_rejoins_in_hostfile_order_with_the_first_batch_back(tmp_path):
    first = opts(tmp_path, [host("a"), host("b"), host("c")], spares=[host("d")], max_nodes=4)
    # b was lost: the job runs on a, c with the 6-sample batch as 6,1,3
    current = opts(tmp_path, [host("a"), host("c")], spares=[host("d")], max_nodes=4, batch="6,1,3")
    grown, fleet = options_after_grow(first, current, [host("b")], ["a", "b", "c", "d"])
    assert [h.name for h in grown.hosts] == ["a", "b", "c"]  # ranks in hostfile order
    assert fleet.joined == ("b",) and fleet.left == ()
    assert grown.batch is None  # back at the world size the config was written for
    assert [h.name for h in grown.spare_hosts] == ["d"]


def test_a_spare_that_joins_leaves_the_spares_and_the_batch_is_kept_at_the_new_world(tmp_path):
    first = opts(tmp_path, [host("a"), host("b")], spares=[host("c"), host("d")], max_nodes=4)
    config = json.loads(open(first.config_path).read())
    config["gradient_accumulation_steps"] = 6  # 12 samples: 2 x 6 on 2 ranks, 4 x 3 on 4
    open(first.config_path, "w").write(json.dumps(config))
    joining = [host("d"), host("c")]
    grown, fleet = options_after_grow(first, first, joining, ["a", "b", "c", "d"])
    assert [h.name for h in grown.hosts] == ["a", "b", "c", "d"]
    assert fleet.joined == ("c", "d") and grown.spare_hosts == ()
    assert grown.batch == "12,1,3"


def test_never_more_than_max_nodes_and_a_host_the_hostfile_does_not_name_goes_last(tmp_path):
    first = opts(tmp_path, [host("a"), host("b")], max_nodes=3, gas=3)  # 6 samples
    grown, fleet = options_after_grow(first, first, [host("z"), host("y")], ["a", "b", "y"])
    assert [h.name for h in grown.hosts] == ["a", "b", "y"] and fleet.joined == ("y",)
    grown, _ = options_after_grow(first, first, [host("z")], ["a", "b"])
    assert [h.name for h in grown.hosts] == ["a", "b", "z"]


def test_a_world_the_global_batch_cannot_be_kept_on_is_refused(tmp_path):
    first = opts(tmp_path, [host("a"), host("b")], max_nodes=3)  # 4 samples: not on 3 ranks
    with pytest.raises(LaunchError, match="cannot restart on 3 ranks"):
        options_after_grow(first, first, [host("c")], ["a", "b", "c"])


# ---- which ready hosts an attempt hands to its machine ------------------------------------------


class FakeProber:
    def __init__(self, ready, notes=()):
        self.ready, self.notes = list(ready), list(notes)

    def take_ready(self):
        return list(self.ready)

    def take_notes(self):
        notes, self.notes = self.notes, []
        return notes


class Said:
    def __init__(self):
        self.lines = []

    def note(self, text, error=False):
        self.lines.append(text)


def attempt_with(tmp_path, ready, *, hosts=("a", "b"), max_nodes=3, check=None, notes=()):
    options = opts(tmp_path, [host(n) for n in hosts], max_nodes=max_nodes)
    said = Said()
    attempt = Attempt(options, said, recorder=None, prober=FakeProber(ready, notes))
    attempt.grow_check = check
    handed = []
    attempt._handle = lambda event: handed.append(event) or []
    return attempt, handed, said


def test_ready_hosts_are_handed_once_each_up_to_max_nodes(tmp_path):
    attempt, handed, _ = attempt_with(tmp_path, [host("c"), host("d")], max_nodes=3)
    attempt._offer_ready_hosts()
    attempt._offer_ready_hosts()  # asked again every look: still once
    assert handed == [HostReturned("c")]  # a, b and c make 3: d waits for another attempt
    attempt, handed, _ = attempt_with(tmp_path, [host("c"), host("d")], max_nodes=4)
    attempt._offer_ready_hosts()
    assert handed == [HostReturned("c"), HostReturned("d")]


def test_a_host_already_in_the_attempt_or_at_max_is_never_handed(tmp_path):
    attempt, handed, _ = attempt_with(tmp_path, [host("a")], max_nodes=3)
    attempt._offer_ready_hosts()
    assert handed == []
    attempt, handed, _ = attempt_with(tmp_path, [host("c")], max_nodes=2)
    attempt._offer_ready_hosts()
    assert handed == []


def test_a_host_the_job_cannot_run_with_is_said_once_and_not_handed(tmp_path):
    asked = []

    def check(joining):
        asked.append([h.name for h in joining])
        return "train_batch_size 4 cannot be kept on 3 ranks" if len(joining) == 1 else None

    attempt, handed, said = attempt_with(tmp_path, [host("c")], max_nodes=4, check=check)
    attempt._offer_ready_hosts()
    attempt._offer_ready_hosts()
    assert handed == [] and asked == [["c"]]  # judged once per attempt
    assert said.lines == ["c answers but cannot join: train_batch_size 4 cannot be kept on 3 ranks"]


def test_the_probers_sentences_are_said(tmp_path):
    attempt, _, said = attempt_with(tmp_path, [], notes=["hostfile h lists new host(s) x"])
    attempt._offer_ready_hosts()
    assert said.lines == ["hostfile h lists new host(s) x"]


# ---- what the job's prober is told --------------------------------------------------------------


def test_without_max_nodes_nothing_is_probed(tmp_path):
    options = opts(tmp_path, [host("a")], max_nodes=None, min_nodes=None, max_restarts=0)
    assert _prober_of(options) is None


def test_spares_are_candidates_from_the_start_and_lost_hosts_after_an_attempt(tmp_path):
    options = opts(tmp_path, [host("a"), host("b")], spares=[host("c")], max_nodes=3)
    prober = _prober_of(options)
    assert prober.backoff.hosts == {"c"} and prober.in_job == {"a", "b"}
    assert prober.order() == ["a", "b", "c"]
    job = Job.__new__(Job)  # the wiring alone: no console, no run directory
    job.first = job.options = options
    job.prober = prober
    job._may_come_back({"b"})
    assert prober.backoff.hosts == {"b", "c"}
    assert prober.in_job == {"a"}  # b left the job: an answer makes it ready
    prober.running([host("a"), host("c")])  # the next attempt took the spare
    assert prober.backoff.hosts == {"b"}
