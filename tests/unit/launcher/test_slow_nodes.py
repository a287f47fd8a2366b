"""--slow-node exclude: when a slow host may be taken out (zlaunch/launcher/slow_nodes.py), and
what taking it out does to the attempt's machine (a save at the next step boundary, then the
attempt ends for a fleet change without the host; zlaunch/launcher/state.py). Events in,
actions out."""

from __future__ import annotations

import math
import signal

import pytest

from zlaunch.errors import UsageError
from zlaunch.job import Host, LaunchOptions
from zlaunch.launcher.fleet_state import FleetPhase, NoticeAnswer
from zlaunch.launcher.slow_nodes import slow_out_words, slow_why, why_kept
from zlaunch.launcher.state import (
    SAVE_ACK_WAIT,
    AttemptMachine,
    AttemptPlanned,
    CheckpointReported,
    CheckpointState,
    Ending,
    Note,
    Policy,
    PreemptionNotice,
    RankExited,
    RankSlot,
    RankStarted,
    RecordFleet,
    SaveAcknowledged,
    SaveReady,
    SignalRanks,
    SignalReceived,
    SlowHost,
    StepReached,
    Tick,
)
from zlaunch.launcher.stragglers import Finding

HOSTS = ("node1", "node2", "node3")
SLOTS = tuple(RankSlot(rank=r, local_rank=0, host=HOSTS[r], node=r) for r in range(3))
SAVE = int(signal.SIGUSR1)
SAVES = Policy(grace=2.0, checkpoint_dir=True, save_signal=SAVE)
WHY = "1.62x the median step for 30 steps"


# ---- may it be taken out ----------------------------------------------------------------

KEPT = [
    # host, hosts, spares, leaving already, --min-nodes, why it stays (None: taken out)
    pytest.param("node2", HOSTS, 0, (), 2, None, id="two-left-of-min-two"),
    pytest.param("node2", HOSTS, 0, (), 3, "would leave 2 host(s), fewer than --min-nodes 3",
                 id="below-min-stays"),
    pytest.param("node2", HOSTS, 1, (), 3, None, id="a-spare-takes-its-place"),
    pytest.param("node2", HOSTS, 0, ("node3",), 2, "would leave 1 host(s), fewer than --min-nodes 2",
                 id="a-preempted-host-counts"),
    pytest.param("node2", HOSTS, 1, ("node3",), 2, None, id="one-spare-for-two-leaving"),
    pytest.param("node2", HOSTS, 0, ("node2",), 2, None, id="already-leaving-counts-once"),
    pytest.param("node1", ("node1",), 0, (), 1, "would leave 0 host(s), fewer than --min-nodes 1",
                 id="never-the-last-host"),
]  # fmt: skip


@pytest.mark.parametrize("host,hosts,spares,leaving,minimum,kept", KEPT)
def test_when_a_slow_host_may_be_taken_out(host, hosts, spares, leaving, minimum, kept):
    why = why_kept(host, hosts, spares, leaving, minimum)
    if kept is None:
        assert why is None
    else:
        assert why is not None and why.endswith(kept), why


def test_the_figure_it_is_taken_out_for():
    host = Finding("node2", (1,), 1.618, 39, True)
    rank = Finding("node2", (5,), 2.0, 39, True, rank=5)
    assert slow_why(host, 30) == "1.62x the median step for 30 steps"
    assert slow_why(rank, 30) == "rank 5: 2.00x the median step for 30 steps"
    assert slow_out_words("node2", WHY, NoticeAnswer.SAVE) == (
        "node2 stays slow (1.62x the median step for 30 steps); --slow-node exclude takes it "
        "out: every rank saves at its next step, then the job goes on without it"
    )


# ---- the machine ------------------------------------------------------------------------


def listening(policy: Policy = SAVES) -> AttemptMachine:
    machine = AttemptMachine(HOSTS, policy)
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    for slot in SLOTS:
        machine.handle(RankStarted(slot.rank, 100 + slot.rank), now=0.0)
        machine.handle(SaveReady(slot.rank), now=0.0)
    machine.handle(StepReached(40), now=1.0)
    return machine


def notes(actions) -> list[str]:
    return [a.text for a in actions if isinstance(a, Note)]


def test_a_slow_host_is_taken_out_after_a_save_and_the_attempt_ends_without_it():
    machine = listening()
    actions = machine.handle(SlowHost(1, WHY), now=10.0)
    assert [type(a) for a in actions] == [Note, SignalRanks, RecordFleet]
    assert actions[1] == SignalRanks(SAVE) and not machine.save_requested  # not the user's save
    assert notes(actions)[0].startswith("node2 stays slow (1.62x the median step for 30 steps)")
    assert machine.handle(SlowHost(1, WHY), now=10.1) == []  # said once
    assert machine.fleet.describe(10.2) == "node2 slow: taken out; saving at the next step"
    machine.handle(SaveAcknowledged(0), now=10.5)
    assert machine.handle(Tick(), now=1e9) == []  # no deadline: a slow host is not going away
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 41, requested=True), now=12.0)
    for rank in range(3):
        machine.handle(RankExited(rank, 100 + rank, 0, None), now=12.5)
    outcome = machine.outcome()
    assert outcome.ending is Ending.FLEET_CHANGED and outcome.failures == ()
    assert outcome.message == "node2 slow: saved at step 41"
    (notice,) = outcome.fleet.leaving
    assert (notice.host, notice.slow, notice.why, notice.deadline) == ("node2", True, WHY, math.inf)
    assert outcome.fleet.saved and outcome.fleet.saved_step == 41


def test_a_slow_hosts_rank_failing_is_a_failure_not_a_host_going_away():
    machine = listening()
    machine.handle(SlowHost(1, WHY), now=10.0)
    machine.handle(RankExited(1, 101, 1, None), now=11.0)
    assert machine.stopping and [f.rank for f in machine.failures] == [1]


@pytest.mark.parametrize(
    "policy,said",
    [
        pytest.param(Policy(grace=2.0), "no --checkpoint-dir to save to", id="nothing-to-save-to"),
        pytest.param(Policy(grace=2.0, checkpoint_dir=True), "--save-on none", id="save-on-none"),
    ],
)
def test_without_a_save_the_slow_host_stays_and_nothing_stops(policy, said):
    machine = listening(policy)
    actions = machine.handle(SlowHost(1, WHY), now=10.0)
    assert [type(a) for a in actions] == [Note]
    assert notes(actions) == [
        f"node2 stays slow ({WHY}) but stays in the job: {said} (going on as with --slow-node warn)"
    ]
    assert not machine.stopping and machine.fleet.phase is FleetPhase.STEADY
    assert not machine.fleet.notices


def test_ranks_still_setting_up_keep_the_slow_host():
    machine = AttemptMachine(HOSTS, SAVES)
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    actions = machine.handle(SlowHost(1, WHY), now=1.0)
    assert "do not listen for the save signal (yet)" in notes(actions)[0]
    assert not machine.stopping and not machine.fleet.notices


def test_the_users_save_ends_the_job_and_keeps_the_slow_host():
    machine = listening()
    machine.handle(SignalReceived(int(signal.SIGINT)), now=5.0)  # Ctrl-C: save and end
    assert machine.save_requested
    actions = machine.handle(SlowHost(1, WHY), now=10.0)
    assert "the job ends with the save under way" in notes(actions)[0]
    assert not machine.fleet.notices


def test_a_slow_host_leaves_with_a_preemption_under_way():
    machine = listening()
    machine.handle(PreemptionNotice(2, deadline=40.0, why="check"), now=10.0)
    actions = machine.handle(SlowHost(1, WHY), now=11.0)
    assert SignalRanks(SAVE) not in actions  # the save under way serves both
    assert notes(actions)[0].endswith("--slow-node exclude takes it out with the change under way")
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 41, requested=True), now=12.0)
    for rank in range(3):
        machine.handle(RankExited(rank, 100 + rank, 0, None), now=12.5)
    outcome = machine.outcome()
    assert outcome.message == "node3 preempted and node2 slow: saved at step 41"
    assert {(n.host, n.slow) for n in outcome.fleet.leaving} == {("node2", True), ("node3", False)}


def test_nobody_answering_the_save_keeps_the_slow_host_and_goes_on():
    machine = listening()
    machine.handle(SlowHost(1, WHY), now=10.0)
    actions = machine.handle(Tick(), now=10.0 + SAVE_ACK_WAIT)
    assert notes(actions) == [
        "no rank answered the save request: the slow host stays in the job (as with "
        "--slow-node warn); training goes on"
    ]
    assert not machine.stopping and machine.fleet.phase is FleetPhase.STEADY
    assert machine.fleet.outcome() is None
    again = machine.handle(SlowHost(1, WHY), now=20.0)  # no second save request
    assert [type(a) for a in again] == [Note] and "no rank answered" in notes(again)[0]


# ---- the option ----------------------------------------------------------


def options(**changes) -> LaunchOptions:
    base = dict(
        hosts=(Host("node1", (0,)), Host("node2", (0,))), program=("train.py",), python="python3"
    )
    return LaunchOptions(**{**base, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="no-checkpoint-dir-no-min-nodes"),
        pytest.param({"checkpoint_dir": "/ckpt"}, id="no-min-nodes"),
        pytest.param({"min_nodes": 1, "max_restarts": 1}, id="no-checkpoint-dir"),
    ],
)
def test_exclude_needs_a_checkpoint_dir_and_min_nodes(changes):
    with pytest.raises(UsageError, match="needs --checkpoint-dir DIR and --min-nodes M"):
        options(slow_node="exclude", **changes)


def test_exclude_with_what_it_needs_and_a_wrong_mode():
    ok = options(slow_node="exclude", checkpoint_dir="/ckpt", min_nodes=1, max_restarts=1)
    assert ok.slow_node == "exclude"
    with pytest.raises(UsageError, match="--slow-node must be warn or exclude, got 'drop'"):
        options(slow_node="drop")
