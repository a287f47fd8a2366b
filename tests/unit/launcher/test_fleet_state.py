"""Fleet changes as events of the attempt's machine (zlaunch/launcher/fleet_state.py and its
use in zlaunch/launcher/state.py): what a preemption notice does in each state, when a host
that may join makes the job grow, and how the attempt ends. Events in, actions out."""

from __future__ import annotations

import signal

import pytest

from zlaunch.launcher.fleet_state import (
    FleetFacts,
    FleetPhase,
    GrowAnswer,
    NoticeAnswer,
    grow_answer,
    notice_answer,
)
from zlaunch.launcher.state import (
    SAVE_ACK_WAIT,
    AgentLost,
    AttemptMachine,
    AttemptPlanned,
    CheckpointReported,
    CheckpointState,
    Ending,
    HostReturned,
    Note,
    Policy,
    PreemptionNotice,
    RankExited,
    RankSlot,
    RankStarted,
    RecordFleet,
    RecordRanks,
    SaveAcknowledged,
    SaveReady,
    SetStatus,
    SignalRanks,
    SignalReceived,
    StepReached,
    StopRanks,
    Tick,
)
from zlaunch.rundir.records import RunStatus

HOSTS = ("node1", "node2", "node3")
SLOTS = tuple(RankSlot(rank=r, local_rank=0, host=HOSTS[r], node=r) for r in range(3))
SAVE = int(signal.SIGUSR1)
SAVES = Policy(grace=2.0, checkpoint_dir=True, save_signal=SAVE, grow_interval=30.0)

RUN = RunStatus.RUNNING


def facts(**changes) -> FleetFacts:
    base = dict(phase=RUN, stopping=False, user_save=False, can_save=True, fleet=FleetPhase.STEADY)
    return FleetFacts(**{**base, **changes})


# ---- what a notice does, by state -------------------------------------------------------

NOTICES = [
    pytest.param(facts(), NoticeAnswer.SAVE, id="running-saves"),
    pytest.param(facts(can_save=False), NoticeAnswer.STOP, id="nothing-to-save-to-stops"),
    pytest.param(facts(started=False), NoticeAnswer.STOP, id="ranks-still-setting-up-stop"),
    pytest.param(facts(phase=RunStatus.STARTING), NoticeAnswer.STOP, id="before-the-plan-stops"),
    pytest.param(facts(stopping=True), NoticeAnswer.AT_RESTART, id="stopping-leaves-at-restart"),
    pytest.param(facts(fleet=FleetPhase.STOPPING), NoticeAnswer.AT_RESTART, id="change-stopping"),
    pytest.param(facts(user_save=True), NoticeAnswer.WITH_USER_SAVE, id="user-save-ends-the-job"),
    pytest.param(facts(fleet=FleetPhase.SAVING), NoticeAnswer.JOIN_SAVE, id="joins-a-save"),
    pytest.param(facts(fleet=FleetPhase.SAVED), NoticeAnswer.JOIN_SAVE, id="joins-a-saved"),
    pytest.param(facts(checkpointing=True), NoticeAnswer.SAVE, id="saves-after-a-running-save"),
    pytest.param(facts(grow_due=False), NoticeAnswer.SAVE, id="no-interval-for-notices"),
]


@pytest.mark.parametrize("state,answer", NOTICES)
def test_what_a_notice_does(state, answer):
    assert notice_answer(state) is answer


GROWS = [
    pytest.param(facts(), GrowAnswer.GROW, id="running-grows"),
    pytest.param(facts(grow_due=False), GrowAnswer.WAIT, id="too-soon-waits"),
    pytest.param(facts(checkpointing=True), GrowAnswer.WAIT, id="never-mid-save"),
    pytest.param(facts(started=False), GrowAnswer.WAIT, id="ranks-not-listening-yet"),
    pytest.param(facts(phase=RunStatus.STARTING), GrowAnswer.WAIT, id="before-the-plan"),
    pytest.param(facts(fleet=FleetPhase.SAVING), GrowAnswer.WITH_CHANGE, id="joins-a-change"),
    pytest.param(facts(stopping=True), GrowAnswer.NOT_NOW, id="stopping"),
    pytest.param(facts(user_save=True), GrowAnswer.NOT_NOW, id="the-job-ends"),
    pytest.param(facts(fleet=FleetPhase.STOPPING), GrowAnswer.NOT_NOW, id="change-stopping"),
    pytest.param(facts(can_save=False), GrowAnswer.CANNOT, id="nothing-to-save-to"),
]


@pytest.mark.parametrize("state,answer", GROWS)
def test_when_a_host_that_may_join_grows_the_job(state, answer):
    assert grow_answer(state) is answer


# ---- the machine ------------------------------------------------------------------------


def listening(policy: Policy = SAVES) -> AttemptMachine:
    """Three nodes, a rank each, all started at t=0 and listening for the save signal."""
    machine = AttemptMachine(HOSTS, policy)
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    for slot in SLOTS:
        machine.handle(RankStarted(slot.rank, 100 + slot.rank), now=0.0)
        machine.handle(SaveReady(slot.rank), now=0.0)
    machine.handle(StepReached(4), now=1.0)
    return machine


def exit_all(machine: AttemptMachine, now: float, code: int = 0) -> None:
    for rank in range(3):
        machine.handle(RankExited(rank, 100 + rank, code, None), now=now)


def kinds(actions) -> list[type]:
    return [type(a) for a in actions]


def notes(actions) -> list[str]:
    return [a.text for a in actions if isinstance(a, Note)]


def test_a_notice_saves_then_the_attempt_ends_without_the_host():
    machine = listening()
    actions = machine.handle(PreemptionNotice(1, deadline=40.0, why="SIGTERM to its agent"), 10.0)
    assert kinds(actions) == [Note, SignalRanks, RecordFleet] and actions[1] == SignalRanks(SAVE)
    assert notes(actions) == [
        "node2: preemption notice (SIGTERM to its agent); it goes in 30 s: every rank saves at "
        "its next step, then the job goes on without it"
    ]
    assert not machine.stopping and not machine.save_requested  # not the user's save
    machine.handle(SaveAcknowledged(0), now=10.5)
    assert kinds(machine.handle(CheckpointReported(0, CheckpointState.SAVING, 5), 11.0)) == []
    done = machine.handle(CheckpointReported(0, CheckpointState.SAVED, 5, requested=True), 12.0)
    assert done == [RecordFleet()] and machine.fleet.phase is FleetPhase.SAVED
    assert machine.handle(Tick(), now=50.0) == []  # the deadline no longer matters
    exit_all(machine, 12.5)
    outcome = machine.outcome()
    assert outcome.ending is Ending.FLEET_CHANGED and outcome.status is RunStatus.RESTARTING
    assert outcome.message == "node2 preempted: saved at step 5"
    assert [n.host for n in outcome.fleet.leaving] == ["node2"]
    assert outcome.fleet.saved and outcome.fleet.saved_step == 5
    assert not outcome.fleet.missed_deadline and outcome.failures == ()


def test_a_second_notice_leaves_with_the_save_under_way_and_a_repeat_is_ignored():
    machine = listening()
    machine.handle(PreemptionNotice(1, 40.0, "check"), now=10.0)
    again = machine.handle(PreemptionNotice(1, 45.0, "check"), now=11.0)
    assert again == []
    other = machine.handle(PreemptionNotice(2, 20.0, "check"), now=11.0)
    assert notes(other) == [
        "node3: preemption notice (check); it goes in 9 s: it leaves with the change under way"
    ]
    assert SignalRanks(SAVE) not in other
    assert machine.fleet.deadline() == 20.0  # the earliest deadline holds


def test_a_deadline_shorter_than_the_save_stops_and_keeps_the_last_checkpoint():
    machine = listening()
    machine.handle(PreemptionNotice(1, deadline=13.0, why="check"), now=10.0)
    machine.handle(SaveAcknowledged(0), now=10.2)
    machine.handle(CheckpointReported(0, CheckpointState.SAVING, 5), now=11.0)
    assert machine.handle(Tick(), now=12.9) == []
    actions = machine.handle(Tick(), now=13.0)
    assert kinds(actions) == [Note, SetStatus, StopRanks, RecordFleet]
    assert "passed before the save was complete" in notes(actions)[0]
    assert "`latest` still names the last complete one" in notes(actions)[0]
    for rank in range(3):  # the stop's TERM: not failures
        machine.handle(RankExited(rank, 100 + rank, None, int(signal.SIGTERM)), now=14.0)
    outcome = machine.outcome()
    assert outcome.ending is Ending.FLEET_CHANGED and outcome.failures == ()
    assert outcome.fleet.missed_deadline and not outcome.fleet.saved
    assert outcome.fleet.why_unsaved == "the deadline passed before the save was complete"


def test_a_notice_with_nothing_to_save_to_stops_at_once():
    machine = listening(Policy(grace=2.0))
    actions = machine.handle(PreemptionNotice(2, deadline=40.0, why="SIGTERM"), now=10.0)
    assert kinds(actions) == [Note, SetStatus, StopRanks, RecordFleet]
    assert "no --checkpoint-dir to save to: stopping every rank now" in notes(actions)[0]
    for rank in range(3):
        machine.handle(RankExited(rank, 100 + rank, None, int(signal.SIGTERM)), now=11.0)
    outcome = machine.outcome()
    assert outcome.ending is Ending.FLEET_CHANGED and not outcome.fleet.saved


def test_ranks_not_listening_yet_are_stopped_not_signalled():
    machine = AttemptMachine(HOSTS, SAVES)
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    machine.handle(SaveReady(0), now=1.0)  # rank 1 and 2 still import torch
    actions = machine.handle(PreemptionNotice(1, 40.0, "SIGTERM"), now=2.0)
    assert SignalRanks(SAVE) not in actions and StopRanks(2.0) in actions
    assert "do not listen for the save signal (yet)" in notes(actions)[0]


def test_the_preempted_host_going_before_the_save_is_not_a_failure():
    machine = listening()
    machine.handle(PreemptionNotice(1, 40.0, "check"), now=10.0)
    actions = machine.handle(AgentLost(1, "connection to the agent lost"), now=11.0)
    assert StopRanks(2.0) in actions and machine.failures == []
    assert "node2 went before the save was complete" in notes(actions)[0]
    exit_all(machine, 12.0, code=143)
    outcome = machine.outcome()
    assert outcome.ending is Ending.FLEET_CHANGED and outcome.fleet.missed_deadline


def test_a_preempted_rank_ending_after_the_save_is_expected():
    machine = listening()
    machine.handle(PreemptionNotice(1, 40.0, "check"), now=10.0)
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 5, requested=True), now=11.0)
    actions = machine.handle(RankExited(1, 101, None, int(signal.SIGTERM)), now=11.5)
    assert actions == [RecordRanks()]
    assert machine.failures == [] and not machine.stopping


def test_a_rank_failing_elsewhere_during_the_save_is_a_failure_and_the_host_still_leaves():
    machine = listening()
    machine.handle(PreemptionNotice(1, 40.0, "check"), now=10.0)
    machine.handle(RankExited(0, 100, 1, None), now=11.0)  # rank 0 on node1: a real failure
    assert machine.stopping and [f.rank for f in machine.failures] == [0]
    exit_all(machine, 12.0, code=143)
    outcome = machine.outcome()
    assert outcome.ending is Ending.RANKS_FAILED
    assert [n.host for n in outcome.fleet.leaving] == ["node2"]


def test_nobody_answering_a_preemptions_save_stops():
    machine = listening()
    machine.handle(PreemptionNotice(1, 60.0, "check"), now=10.0)
    actions = machine.handle(Tick(), now=10.0 + SAVE_ACK_WAIT)
    assert StopRanks(2.0) in actions and "no rank answered the save request" in notes(actions)[0]


def test_a_host_that_may_join_waits_for_the_interval_then_grows():
    machine = listening()
    assert machine.handle(HostReturned("node4"), now=10.0) == [RecordFleet()]
    assert machine.handle(Tick(), now=29.9) == []
    actions = machine.handle(Tick(), now=30.0)
    assert kinds(actions) == [Note, SignalRanks, RecordFleet]
    assert notes(actions) == [
        "node4 can join: every rank saves at its next step, then the job grows onto it"
    ]
    machine.handle(SaveAcknowledged(2), now=30.2)
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 9, requested=True), now=31.0)
    exit_all(machine, 31.5)
    outcome = machine.outcome()
    assert (
        outcome.ending is Ending.FLEET_CHANGED
        and outcome.message == "node4 joining: saved at step 9"
    )
    assert outcome.fleet.joining == ("node4",) and outcome.fleet.leaving == ()


def test_the_job_never_grows_mid_save():
    machine = listening()
    machine.handle(CheckpointReported(0, CheckpointState.SAVING, 30), now=35.0)
    assert machine.handle(HostReturned("node4"), now=35.5) == [RecordFleet()]
    assert machine.handle(Tick(), now=36.0) == []
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 30), now=37.0)
    assert SignalRanks(SAVE) in machine.handle(Tick(), now=37.1)


def test_a_host_joins_the_save_of_a_preemption():
    machine = listening()
    machine.handle(PreemptionNotice(2, 60.0, "check"), now=10.0)  # before the interval
    actions = machine.handle(HostReturned("node4"), now=11.0)
    assert notes(actions) == ["node4 can join: it joins the next attempt"]
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 5, requested=True), now=12.0)
    exit_all(machine, 12.5)
    fleet = machine.outcome().fleet
    assert fleet.joining == ("node4",) and [n.host for n in fleet.leaving] == ["node3"]


def test_a_grow_nobody_answers_is_dropped_and_training_goes_on():
    machine = listening()
    machine.handle(HostReturned("node4"), now=31.0)
    actions = machine.handle(Tick(), now=31.0 + SAVE_ACK_WAIT)
    assert notes(actions) == [
        "no rank answered the save request: the job does not grow; training goes on"
    ]
    assert not machine.stopping and machine.fleet.phase is FleetPhase.STEADY
    cannot = machine.handle(HostReturned("node5"), now=40.0)
    assert notes(cannot) == [
        "node5 could join, but the job cannot grow: no rank answered the save request"
    ]
    assert machine.handle(HostReturned("node6"), now=41.0) == []  # said once
    exit_all(machine, 50.0)
    assert machine.outcome().ending is Ending.SUCCEEDED


def test_no_grow_while_stopping_or_without_a_checkpoint_dir():
    machine = listening()
    machine.handle(RankExited(0, 100, 1, None), now=40.0)
    assert machine.handle(HostReturned("node4"), now=40.5) == []
    bare = listening(Policy(grace=2.0, grow_interval=0.0))
    assert notes(bare.handle(HostReturned("node4"), now=1.0)) == [
        "node4 could join, but the job cannot grow: no --checkpoint-dir to save to"
    ]


def test_ctrl_c_during_a_fleet_save_ends_the_job_with_that_save():
    machine = listening()
    machine.handle(PreemptionNotice(1, 60.0, "check"), now=10.0)
    machine.handle(SignalReceived(int(signal.SIGINT)), now=10.5)
    assert machine.save_requested
    machine.handle(CheckpointReported(0, CheckpointState.SAVED, 5, requested=True), now=11.0)
    exit_all(machine, 11.5)
    outcome = machine.outcome()
    assert outcome.ending is Ending.SUCCEEDED and outcome.fleet.leaving[0].host == "node2"
