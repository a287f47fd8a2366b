"""Ranks that trained alone: the pure words (zlaunch/launcher/world_check.py) and the machine's outcome."""

from __future__ import annotations

import pytest

from zlaunch.launcher.state import (
    AttemptMachine,
    AttemptPlanned,
    Ending,
    GroupReported,
    Policy,
    RankExited,
    RankSlot,
)
from zlaunch.launcher.world_check import ACCELERATE_CPU_FIX, GroupReport, alone_warning

G = GroupReport


@pytest.mark.parametrize(
    "reports,world,expected",
    [
        ({0: G(2), 1: G(2)}, 2, None),
        ({}, 2, None),  # nobody reported (not Python, killed): nothing to judge
        ({0: G(0)}, 1, None),  # a job of one rank is a world of one by design
        (
            {0: G(0), 1: G(0)},
            2,
            "ranks 0-1 of this 2-rank job trained alone, each a world of one (no process "
            "group of the job's size); call torch.distributed.init_process_group() (or your "
            "library's setup) in it",
        ),
        (
            {0: G(4), 1: G(4), 2: G(0), 3: G(4)},
            4,
            "rank 2 of this 4-rank job trained alone, each a world of one (no process group of "
            "the job's size); call torch.distributed.init_process_group() (or your library's "
            "setup) in it",
        ),
        (
            {0: G(2), 1: G(2), 2: G(2), 3: G(2)},
            4,
            "ranks 0-3 joined a process group of 2, not 4; call "
            "torch.distributed.init_process_group() (or your library's setup) in it",
        ),
        # accelerate on CPU: joined the launcher's group, yet its state trains one process
        (
            {0: G(2, True, 1), 1: G(2, True, 1)},
            2,
            "ranks 0-1 of this 2-rank job trained alone, each a world of one (no process group "
            f"of the job's size); {ACCELERATE_CPU_FIX}",
        ),
        ({0: G(2, True, 2), 1: G(2, True, 2)}, 2, None),
        # accelerate loaded but never set up (its state empty): the group decides
        ({0: G(0, True), 1: G(0, True)}, 2, ...),
    ],
)
def test_alone_warning(reports, world, expected):
    text = alone_warning(reports, world)
    if expected is ...:
        assert text is not None and text.endswith(ACCELERATE_CPU_FIX)
    else:
        assert text == expected


SLOTS = (RankSlot(0, 0, "a", 0), RankSlot(1, 1, "a", 0))


def _ended(*events) -> AttemptMachine:
    machine = AttemptMachine(("a",), Policy(grace=1.0))
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    for event in events:
        machine.handle(event, now=0.0)
    machine.handle(RankExited(0, 10, 0, None), now=0.0)
    machine.handle(RankExited(1, 11, 0, None), now=0.0)
    return machine


def test_a_job_of_lonely_ranks_succeeds_with_a_warning():
    machine = _ended(GroupReported(0, 0), GroupReported(1, 0))
    outcome = machine.outcome()
    assert outcome.ending == Ending.SUCCEEDED and outcome.exit_code == 0
    assert len(outcome.warnings) == 1 and "ranks 0-1 of this 2-rank job" in outcome.warnings[0]


def test_a_joined_job_and_a_report_of_an_unknown_rank_say_nothing():
    assert _ended(GroupReported(0, 2), GroupReported(1, 2), GroupReported(7, 0)).outcome() == (
        _ended().outcome()
    )
    assert _ended().outcome().warnings == ()


def test_failure_json_keeps_the_warning_and_reads_back():
    from zlaunch.rundir.records import Failure, FailureReport

    root = Failure(host="a", rank=1, local_rank=1, node_rank=0, pid=11, exit_code=3)
    report = FailureReport("r", 3, "1 failed rank(s) of 2", root, (root,), warnings=("alone",))
    data = report.to_json()
    assert data["warnings"] == ["alone"]
    assert FailureReport.from_json(data).warnings == ("alone",)
    assert "warnings" not in FailureReport("r", 3, "s", root, (root,)).to_json()
