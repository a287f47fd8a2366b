"""The job's lifecycle, transition by transition: events in, actions out, no threads,
processes or sockets (zlaunch/launcher/state.py, zlaunch/launcher/restart_policy.py)."""

from __future__ import annotations

import signal

import pytest

from zlaunch.launcher.restart_policy import GiveUp, GoOnWithout, Restart, RestartPolicy, Retry
from zlaunch.launcher.state import (
    SAVE_ACK_WAIT,
    STOP_SLACK,
    AgentCutOff,
    AgentFinished,
    AgentLost,
    AttemptMachine,
    AttemptPlanned,
    CaptureStacks,
    Ending,
    HangDue,
    HangPhase,
    HangStacksIn,
    Note,
    Policy,
    RankExited,
    RankSlot,
    RankStarted,
    RecordRanks,
    RequestStacks,
    SaveAcknowledged,
    SetStatus,
    SignalRanks,
    SignalReceived,
    StacksReady,
    StepReached,
    StopRanks,
    Tick,
)
from zlaunch.rundir.records import REASON_HANG, Failure, RankPhase, RunStatus
from zlaunch.wire import protocol

HOSTS = ("node1", "node2")
SLOTS = tuple(RankSlot(rank=r, local_rank=r % 2, host=HOSTS[r // 2], node=r // 2) for r in range(4))
SAVE = int(signal.SIGUSR1)


def running(policy: Policy | None = None) -> AttemptMachine:
    """Two nodes, two ranks each, every rank started (pids 100+rank)."""
    machine = AttemptMachine(HOSTS, policy or Policy(grace=3.0))
    machine.handle(AttemptPlanned(SLOTS), now=0.0)
    for slot in SLOTS:
        machine.handle(RankStarted(slot.rank, 100 + slot.rank), now=0.0)
    return machine


def kinds(actions) -> list[type]:
    return [type(a) for a in actions]


def notes(actions) -> list[str]:
    return [a.text for a in actions if isinstance(a, Note)]


# ---- rank and job phases ----------------------------------------------------------------


def test_plan_moves_the_job_to_running_and_every_rank_to_starting():
    machine = AttemptMachine(HOSTS, Policy(grace=3.0))
    assert machine.phase is RunStatus.STARTING
    actions = machine.handle(AttemptPlanned(SLOTS), now=0.0)
    assert actions == [SetStatus(RunStatus.RUNNING), RecordRanks()]
    assert machine.phase is RunStatus.RUNNING
    assert {r: s.phase for r, s in machine.ranks.ranks.items()} == dict.fromkeys(
        range(4), RankPhase.STARTING
    )
    machine.handle(RankStarted(2, 4242), now=0.0)
    assert machine.ranks[2].phase is RankPhase.RUNNING and machine.ranks[2].pid == 4242


# (event, expected action kinds, phase after, failures recorded)
FIRST_EVENTS = [
    pytest.param(RankExited(1, 101, 0, None), [RecordRanks], RunStatus.RUNNING, 0, id="clean-exit"),
    pytest.param(
        RankExited(1, 101, 3, None, ("boom",)),
        [RecordRanks, Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        1,
        id="first-failure",
    ),
    pytest.param(
        RankExited(1, 101, None, int(signal.SIGKILL)),
        [RecordRanks, Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        1,
        id="killed-by-signal",
    ),
    pytest.param(
        AgentLost(1, "connection to the agent lost"),
        [RecordRanks, Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        1,
        id="lost-agent",
    ),
    pytest.param(
        SignalReceived(int(signal.SIGTERM)),
        [Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        0,
        id="sigterm",
    ),
    pytest.param(
        SignalReceived(int(signal.SIGINT)),
        [Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        0,
        id="ctrl-c",
    ),
    pytest.param(
        AgentCutOff(0, "stopping workers: no heartbeat for 5.2s"),
        [Note, SetStatus, StopRanks],
        RunStatus.STOPPING,
        1,
        id="cut-off-is-the-failure",
    ),
    pytest.param(StepReached(7), [], RunStatus.RUNNING, 0, id="step"),
    pytest.param(StacksReady(0), [RecordRanks], RunStatus.RUNNING, 0, id="stacks-ready"),
    pytest.param(Tick(), [], RunStatus.RUNNING, 0, id="tick"),
]


@pytest.mark.parametrize("event,expected,phase,failures", FIRST_EVENTS)
def test_transitions_from_running(event, expected, phase, failures):
    machine = running()
    actions = machine.handle(event, now=10.0)
    assert kinds(actions) == expected
    assert machine.phase is phase
    assert len(machine.failures) == failures
    stops = [a for a in actions if isinstance(a, StopRanks)]
    assert all(stop.grace == 3.0 for stop in stops)


def test_first_failure_is_the_root_cause_with_its_last_lines():
    machine = running()
    actions = machine.handle(RankExited(1, 101, 3, None, ("a", "b")), now=1.0)
    assert notes(actions) == ["rank 1 on node1 exited with code 3; stopping all 4 ranks"]
    [failure] = machine.failures
    assert (failure.rank, failure.host, failure.exit_code, failure.pid) == (1, "node1", 3, 101)
    assert failure.last_lines == ("a", "b") and failure.node_rank == 0 and failure.local_rank == 1


def test_failures_while_stopping_are_the_stops_doing():
    machine = running()
    machine.handle(RankExited(1, 101, 3, None), now=1.0)
    actions = machine.handle(RankExited(0, 100, None, int(signal.SIGTERM)), now=1.5)
    assert kinds(actions) == [RecordRanks]
    actions = machine.handle(AgentLost(1, "connection to the agent lost"), now=2.0)
    assert kinds(actions) == [RecordRanks]
    assert [f.rank for f in machine.failures] == [1]
    assert machine.ranks[2].phase is RankPhase.LOST and machine.ranks[2].exit_code == 1
    outcome = machine.outcome()
    assert outcome.ending == Ending.RANKS_FAILED and outcome.exit_code == 3
    assert outcome.stopped_ranks == (0, 2, 3)
    assert outcome.message == "rank 1 on node1 exited with code 3; job stopped (exit code 3)"


def test_lost_agent_loses_its_unfinished_ranks_and_names_its_host():
    machine = running()
    machine.handle(RankExited(2, 102, 0, None), now=0.5)
    actions = machine.handle(AgentLost(1, "no word", {3: ("last",)}), now=1.0)
    assert notes(actions) == ["node2: no word"]
    assert machine.ranks[2].phase is RankPhase.EXITED and machine.ranks[3].phase is RankPhase.LOST
    assert machine.failures[0].rank == 3 and machine.failures[0].last_lines == ("last",)
    assert machine.failures[0].message == "no word"
    assert machine.lost_nodes == {1} and machine.agent_done == [False, True]


def test_second_ctrl_c_kills_now_and_a_third_changes_nothing():
    machine = running()
    first = machine.handle(SignalReceived(int(signal.SIGINT)), now=1.0)
    assert first[-1] == StopRanks(3.0)
    assert "Ctrl-C again to kill now" in notes(first)[0]
    second = machine.handle(SignalReceived(int(signal.SIGINT)), now=1.2)
    assert second == [Note("killing all ranks now", error=True), StopRanks(0.0)]
    assert machine.stop_grace == 0.0
    assert machine.handle(SignalReceived(int(signal.SIGTERM)), now=1.3) == []
    assert machine.outcome().ending == Ending.INTERRUPTED
    assert machine.outcome().exit_code == 130


def test_first_ctrl_c_with_a_checkpoint_dir_saves_then_the_second_stops():
    machine = running(Policy(grace=3.0, checkpoint_dir=True, save_signal=SAVE))
    first = machine.handle(SignalReceived(int(signal.SIGINT)), now=1.0)
    assert kinds(first) == [Note, SignalRanks] and first[1] == SignalRanks(SAVE)
    assert machine.save_requested and not machine.stopping
    second = machine.handle(SignalReceived(int(signal.SIGINT)), now=2.0)
    assert kinds(second) == [Note, SetStatus, StopRanks]
    assert notes(second)[0].endswith("; no checkpoint is written now")


@pytest.mark.parametrize(
    "policy,ending",
    [
        (
            Policy(grace=3.0),
            "; no checkpoint is written (--checkpoint-dir makes Ctrl-C save first)",
        ),
        (Policy(grace=3.0, checkpoint_dir=True), "; no checkpoint is written (--save-on none)"),
    ],
)
def test_ctrl_c_says_why_nothing_is_saved(policy, ending):
    machine = running(policy)
    assert notes(machine.handle(SignalReceived(int(signal.SIGINT)), now=1.0))[0].endswith(ending)


def test_ctrl_c_before_the_plan_stops_without_saving():
    machine = AttemptMachine(HOSTS, Policy(grace=3.0, checkpoint_dir=True, save_signal=SAVE))
    actions = machine.handle(SignalReceived(int(signal.SIGINT)), now=0.0)
    assert kinds(actions) == [Note, SetStatus, StopRanks] and machine.interrupt == signal.SIGINT


def test_save_signal_is_forwarded_once_and_refused_without_a_checkpoint_dir():
    machine = running(Policy(grace=3.0, checkpoint_dir=True, save_signal=SAVE))
    assert kinds(machine.handle(SignalReceived(SAVE), now=1.0)) == [Note, SignalRanks]
    assert machine.handle(SignalReceived(SAVE), now=1.1) == []
    bare = running(Policy(grace=3.0, save_signal=SAVE))
    assert notes(bare.handle(SignalReceived(SAVE), now=1.0)) == [
        "SIGUSR1 ignored: no --checkpoint-dir to save to"
    ]


UNANSWERED = (
    "no rank answered the save request in 5 s: this script does not handle SIGUSR1 "
    "(runtime.initialize jobs do; a script can save on it itself, see 'Saving from your own "
    "script' in docs/checkpoints.md); training goes on; "
)
AFTER_CTRL_C = "Ctrl-C again stops every rank without a checkpoint (TERM, then KILL after 3 s)"


def _ask_by_ctrl_c(machine):
    machine.handle(SignalReceived(int(signal.SIGINT)), now=1.0)


def _ask_by_save_signal(machine):
    machine.handle(SignalReceived(SAVE), now=1.0)


# (how the save was asked, events after it as (time, event), notes said by then)
SAVE_ANSWERS = [
    pytest.param(_ask_by_ctrl_c, [(1.0 + SAVE_ACK_WAIT - 0.1, Tick())], [], id="not-yet"),
    pytest.param(
        _ask_by_ctrl_c,
        [(1.0 + SAVE_ACK_WAIT, Tick()), (9.0, Tick()), (20.0, Tick())],
        [UNANSWERED + AFTER_CTRL_C],
        id="nobody-answers-said-once",
    ),
    pytest.param(
        _ask_by_save_signal,
        [(1.0 + SAVE_ACK_WAIT, Tick())],
        [UNANSWERED + "Ctrl-C stops every rank without a checkpoint"],
        id="save-signal-nobody-answers",
    ),
    pytest.param(
        _ask_by_ctrl_c,
        [(2.0, SaveAcknowledged(3)), (9.0, Tick())],
        [],
        id="one-rank-answers",
    ),
    pytest.param(
        _ask_by_ctrl_c,
        [(2.0, SaveAcknowledged(42)), (9.0, Tick())],
        [UNANSWERED + AFTER_CTRL_C],
        id="answer-of-an-unknown-rank",
    ),
    pytest.param(
        _ask_by_ctrl_c,
        [(2.0, RankExited(0, 100, 3, None)), (9.0, Tick())],
        [],
        id="already-stopping",
    ),
]


@pytest.mark.parametrize("ask,events,said", SAVE_ANSWERS)
def test_a_save_request_nobody_answers_is_said_once(ask, events, said):
    machine = running(Policy(grace=3.0, checkpoint_dir=True, save_signal=SAVE))
    ask(machine)
    found = []
    for now, event in events:
        found += [n for n in notes(machine.handle(event, now=now)) if n.startswith("no rank")]
    assert found == said


def test_stacks_request_goes_to_ready_ranks_of_connected_agents():
    machine = running()
    for rank in (0, 1, 2):
        machine.handle(StacksReady(rank), now=0.0)
    actions = machine.handle(SignalReceived(int(protocol.STACKS_SIGNAL)), now=1.0)
    assert actions[1] == RequestStacks({0: (0, 1), 1: (2,)})
    assert notes(actions)[0].startswith("stack dump requested from 3 rank(s)")
    assert notes(actions)[0].endswith("; ranks 3 cannot dump (not Python, or still starting)")
    assert machine.phase is RunStatus.RUNNING


def test_hang_collects_stacks_then_stops_with_the_hang_as_root_cause():
    machine = running()
    machine.handle(StacksReady(0), now=0.0)
    actions = machine.handle(HangDue(idle_s=31.0, timeout_s=30.0), now=31.0)
    assert kinds(actions) == [Note, Note, RequestStacks, CaptureStacks]
    assert actions[-1] == CaptureStacks((0,), idle_s=31.0)
    assert machine.hang is HangPhase.CAPTURING
    assert machine.handle(HangDue(idle_s=32.0, timeout_s=30.0), now=32.0) == []  # once
    hang = Failure(host="node1, node2", rank="all", exit_code=124, reason=REASON_HANG, message="m")
    assert kinds(machine.handle(HangStacksIn(hang), now=36.0)) == [SetStatus, StopRanks]
    assert machine.hang is HangPhase.DECLARED
    assert machine.handle(HangDue(idle_s=40.0, timeout_s=30.0), now=40.0) == []  # never again
    for slot in SLOTS:
        machine.handle(RankExited(slot.rank, None, None, int(signal.SIGTERM)), now=37.0)
    outcome = machine.outcome()
    assert (
        outcome.exit_code == 124
        and outcome.message == "the job hung: m; job stopped (exit code 124)"
    )
    assert outcome.summary == "hung, 4 ranks stopped"


def test_no_hang_is_declared_while_stopping_or_interrupted():
    machine = running()
    machine.handle(SignalReceived(int(signal.SIGTERM)), now=1.0)
    assert machine.handle(HangDue(idle_s=31.0, timeout_s=30.0), now=31.0) == []


def test_agents_that_do_not_finish_stopping_are_dropped_after_grace_and_slack():
    machine = running()
    machine.handle(RankExited(0, 100, 1, None), now=10.0)
    machine.handle(AgentFinished(0), now=11.0)
    assert machine.handle(Tick(), now=10.0 + 3.0 + STOP_SLACK) == []
    actions = machine.handle(Tick(), now=10.0 + 3.0 + STOP_SLACK + 0.1)
    assert notes(actions) == ["node2: agent did not finish stopping; dropping the connection"]
    assert machine.agent_done == [True, True]
    assert machine.done


# ---- outcomes ---------------------------------------------------------------------------


def finished(*exits) -> AttemptMachine:
    machine = running()
    for rank, code, sig in exits:
        machine.handle(RankExited(rank, None, code, sig), now=1.0)
    for node in range(2):
        machine.handle(AgentFinished(node), now=2.0)
    return machine


@pytest.mark.parametrize(
    "exits,ending,code",
    [
        ([(r, 0, None) for r in range(4)], Ending.SUCCEEDED, 0),
        ([(0, 0, None), (1, 0, None), (2, 0, None)], Ending.INCOMPLETE, 1),
        (
            [(3, 7, None)] + [(r, None, int(signal.SIGTERM)) for r in range(3)],
            Ending.RANKS_FAILED,
            7,
        ),
        ([(2, None, int(signal.SIGSEGV))], Ending.RANKS_FAILED, 128 + int(signal.SIGSEGV)),
    ],
)
def test_outcome_table(exits, ending, code):
    outcome = finished(*exits).outcome()
    assert (outcome.ending, outcome.exit_code) == (ending, code)
    assert outcome.status is (
        RunStatus.SUCCEEDED if ending == Ending.SUCCEEDED else RunStatus.FAILED
    )


def test_scheduler_ending_is_an_interruption_not_a_crash():
    machine = finished((0, None, int(signal.SIGTERM)))
    outcome = machine.outcome(ended_by_scheduler="slurm cancelled the job")
    assert outcome.ending == Ending.INTERRUPTED and outcome.exit_code == 143
    assert outcome.status is RunStatus.INTERRUPTED
    assert finished(*[(r, 0, None) for r in range(4)]).outcome("slurm").ending == Ending.SUCCEEDED


# ---- after an attempt -------------------------------------------------------------------


def failed_outcome():
    return finished((1, 3, None)).outcome()


def test_restart_budget_is_spent_one_failure_at_a_time():
    policy = RestartPolicy(max_restarts=2, min_nodes=None)
    assert policy.after(failed_outcome(), {"node2"}, now=0.0) == Restart(frozenset(), 1)
    assert policy.after(failed_outcome(), set(), now=1.0) == Restart(frozenset(), 0)
    assert policy.after(failed_outcome(), set(), now=2.0) == GiveUp()


@pytest.mark.parametrize(
    "outcome",
    [
        finished(*[(r, 0, None) for r in range(4)]).outcome(),
        finished((0, 0, None)).outcome(),
        finished().outcome(),
    ],
    ids=["succeeded", "incomplete", "nothing-exited"],
)
def test_only_failed_ranks_are_restarted(outcome):
    assert RestartPolicy(max_restarts=3, min_nodes=None).after(outcome, set(), now=0.0) == GiveUp()


def test_interrupted_attempt_is_not_restarted():
    machine = running()
    machine.handle(SignalReceived(int(signal.SIGINT)), now=0.0)
    policy = RestartPolicy(max_restarts=3, min_nodes=None)
    assert policy.after(machine.outcome(), set(), now=0.0) == GiveUp()


def test_min_nodes_restarts_without_the_lost_hosts():
    policy = RestartPolicy(max_restarts=1, min_nodes=1)
    assert policy.after(failed_outcome(), {"node2"}, now=0.0) == Restart(frozenset({"node2"}), 0)


@pytest.mark.parametrize(
    "min_nodes,restarted,now,decision",
    [
        (None, False, 0.0, GiveUp()),  # unreachable at the first start: the job fails
        (None, True, 29.0, Retry(2.0)),  # a restart waits for a host coming back
        (None, True, 31.0, GiveUp()),  # ... for a while
        (1, True, 31.0, GoOnWithout(frozenset({"node2"}))),  # then goes on without it
    ],
)
def test_unreachable_hosts_table(min_nodes, restarted, now, decision):
    policy = RestartPolicy(max_restarts=1, min_nodes=min_nodes)
    if restarted:
        policy.after(failed_outcome(), set(), now=0.0)
    assert policy.unreachable({"node2"}, now=now) == decision
    if isinstance(decision, GoOnWithout):  # a new window for the hosts that are left
        assert policy.unreachable({"node1"}, now=now + 1.0) == Retry(2.0)


def test_a_cut_off_node_is_the_root_cause_not_its_ranks_sigterm_exits():
    # An agent that no longer hears the controller stops its workers: they die of its SIGTERM.
    machine = running()
    actions = machine.handle(AgentCutOff(1, "stopping workers: no heartbeat for 5.2s"), now=1.0)
    assert notes(actions) == [
        "node2: stopping workers: no heartbeat for 5.2s (the agent no longer hears zlaunch: "
        "ranks 2-3 stopped by it)"
    ]
    assert machine.phase is RunStatus.STOPPING and machine.lost_nodes == {1}
    for rank in (2, 3, 0, 1):
        machine.handle(RankExited(rank, 100 + rank, None, int(signal.SIGTERM)), now=2.0)
    (root,) = machine.failures
    assert (root.rank, root.host, root.signal_name) == (2, "node2", None)
    assert "no heartbeat for 5.2s" in root.how()


def test_a_cut_off_while_stopping_is_only_said():
    machine = running()
    machine.handle(RankExited(0, 100, 3, None), now=1.0)
    actions = machine.handle(AgentCutOff(1, "stopping workers: no heartbeat for 6.0s"), now=2.0)
    assert kinds(actions) == [Note]
    assert [f.rank for f in machine.failures] == [0]
