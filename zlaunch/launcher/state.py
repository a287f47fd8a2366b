"""The life of one job attempt as a state machine: typed events in, actions out.

Nothing here touches a thread, a process, a socket, a file or a clock. The runner
(``zlaunch/launcher/job.py``) turns agent frames, signals and timers into events, hands each one to
:meth:`AttemptMachine.handle` with the current (monotonic) time, and carries out the actions it
returns; when every agent is done it asks :meth:`AttemptMachine.outcome`. What happens after an
attempt (restart, restart on fewer hosts, give up) is :mod:`zlaunch.launcher.restart_policy`.

Phases (``RunStatus``)::

    STARTING --AttemptPlanned--> RUNNING
    STARTING/RUNNING --rank exits non-zero | agent lost | hang | SIGINT/SIGTERM--> STOPPING
    STOPPING --second Ctrl-C--> STOPPING (grace 0: kill now)
    RUNNING --preemption notice | a host may join--> RUNNING, the ranks saving for a fleet
            change (zlaunch/launcher/fleet_state.py), then ending: FLEET_CHANGED
    any --every agent done--> outcome(): SUCCEEDED | FAILED | INTERRUPTED | FLEET_CHANGED

Only the first failure stops the job (it is the root cause); failures while stopping are the
stop's own doing and are not recorded as failures.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from zlaunch.errors import assert_never
from zlaunch.launcher.fleet_state import (
    FleetFacts,
    FleetIntent,
    FleetOutcome,
    FleetPhase,
    FleetStep,
    GrowAnswer,
    NoticeAnswer,
    grow_words,
    notice_answer,
    notice_words,
)
from zlaunch.launcher.slow_nodes import slow_kept_words, slow_out_words
from zlaunch.launcher.world_check import GroupReport, alone_warning
from zlaunch.rundir import Failure, RankPhase, RankRow, RunStatus
from zlaunch.text import rank_ranges
from zlaunch.wire import frames, protocol

__all__ = [
    "EXIT_LOST_AGENT",
    "STOP_SLACK",
    "SAVE_ACK_WAIT",
    "RankSlot",
    "RankState",
    "AttemptPlanned",
    "RankStarted",
    "RankExited",
    "StacksReady",
    "SaveAcknowledged",
    "SaveReady",
    "CheckpointState",
    "CheckpointReported",
    "PreemptionNotice",
    "SlowHost",
    "HostReturned",
    "GroupReported",
    "StepReached",
    "AgentCutOff",
    "AgentLost",
    "AgentFinished",
    "SignalReceived",
    "HangDue",
    "HangStacksIn",
    "Tick",
    "StopRanks",
    "SignalRanks",
    "RequestStacks",
    "CaptureStacks",
    "Note",
    "SetStatus",
    "RecordRanks",
    "RecordFleet",
    "Ending",
    "HangPhase",
    "Outcome",
    "AttemptMachine",
    "Policy",
    "AttemptEvent",
    "Action",
    "RankTable",
    "signal_name",
]

EXIT_LOST_AGENT = 1
STOP_SLACK = 5.0
"""After a stop, how long past the grace period to wait for agents before dropping them."""
SAVE_ACK_WAIT = 5.0
"""After asking the ranks to save, how long before saying that none of them answers."""


def signal_name(signum: int | None) -> str | None:
    if not signum:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class RankSlot:
    """Where a rank of the plan runs."""

    rank: int
    local_rank: int
    host: str
    node: int


@dataclass
class RankState:
    slot: RankSlot
    pid: int | None = None
    phase: RankPhase = RankPhase.STARTING
    exit_code: int | None = None
    signal: int | None = None
    stacks: bool = False
    exit_step: int | None = None
    """The job's last step when this rank ended."""

    @property
    def rank(self) -> int:
        return self.slot.rank


# ---- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptPlanned:
    """The plan is made and its specs are about to go out: these ranks will start."""

    ranks: tuple[RankSlot, ...]


@dataclass(frozen=True)
class RankStarted:
    rank: int
    pid: int


@dataclass(frozen=True)
class RankExited:
    rank: int
    pid: int | None
    code: int | None
    signal: int | None
    last_lines: tuple[str, ...] = ()
    at: str = field(default_factory=_now_iso)


@dataclass(frozen=True)
class StacksReady:
    """The rank's runtime dumps its stacks on protocol.STACKS_SIGNAL."""

    rank: int


@dataclass(frozen=True)
class SaveAcknowledged:
    """The rank heard the save signal and will save at its next step (the runtime says so)."""

    rank: int


@dataclass(frozen=True)
class SaveReady:
    """The rank listens for the save signal (the runtime's save hook, or a script's
    `zlaunch.save_request.SaveRequest`): from now on it can be asked to save."""

    rank: int


class CheckpointState(enum.Enum):
    SAVING = "saving"
    SAVED = "saved"
    FAILED = "failed"


@dataclass(frozen=True)
class CheckpointReported:
    """A rank says a checkpoint is being written, is complete, or failed."""

    rank: int
    state: CheckpointState
    step: int | None = None
    requested: bool = False
    """The save the save signal asked for (not one of the script's own)."""


@dataclass(frozen=True)
class PreemptionNotice:
    """The host of ``node`` goes away at ``deadline`` (monotonic seconds): its agent got the
    preemption signal, or the --preemption-check command said so."""

    node: int
    deadline: float
    why: str


@dataclass(frozen=True)
class SlowHost:
    """The host of ``node`` stayed slow for the sustained window and --slow-node exclude takes
    it out (``why``: its figure): like a preemption notice without a deadline, every rank saves
    at its next step boundary and the next attempt runs without the host."""

    node: int
    why: str


@dataclass(frozen=True)
class HostReturned:
    """``host`` answers and the next attempt could run on it too (the launcher probed it and
    checked that the fleet with it is one the job can run on): the job may grow."""

    host: str


@dataclass(frozen=True)
class GroupReported:
    """The rank's script ended having joined a default process group of ``size`` (0: none)."""

    rank: int
    size: int
    accelerate: bool = False
    accelerate_processes: int | None = None


@dataclass(frozen=True)
class StepReached:
    step: int


@dataclass(frozen=True)
class AgentCutOff:
    """The agent stopped its workers because it no longer hears the controller."""

    node: int
    why: str = "the agent stopped its workers: no heartbeat from the controller"
    at: str = field(default_factory=_now_iso)


@dataclass(frozen=True)
class AgentLost:
    """The connection to an agent broke (or it went silent): its ranks are gone."""

    node: int
    why: str
    last_lines: dict[int, tuple[str, ...]] = field(default_factory=dict)
    at: str = field(default_factory=_now_iso)


@dataclass(frozen=True)
class AgentFinished:
    """The agent said bye: every worker of its node is gone."""

    node: int


@dataclass(frozen=True)
class SignalReceived:
    """A signal to the controller: SIGINT, SIGTERM, the save signal, the stacks signal."""

    signum: int


@dataclass(frozen=True)
class HangDue:
    """No rank reached a step boundary for --hang-timeout (zlaunch/launcher/hang.py's watch)."""

    idle_s: float
    timeout_s: float


@dataclass(frozen=True)
class HangStacksIn:
    """The hang's stack capture is over: the failure record built from it."""

    failure: Failure


@dataclass(frozen=True)
class Tick:
    """Time passed (the runner's loop wakes at least four times a second)."""


AttemptEvent = (
    AttemptPlanned
    | RankStarted
    | RankExited
    | StacksReady
    | SaveAcknowledged
    | SaveReady
    | CheckpointReported
    | PreemptionNotice
    | SlowHost
    | HostReturned
    | GroupReported
    | StepReached
    | AgentCutOff
    | AgentLost
    | AgentFinished
    | SignalReceived
    | HangDue
    | HangStacksIn
    | Tick
)

# ---- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StopRanks:
    """Tell every agent still connected to TERM its workers, wait ``grace``, KILL."""

    grace: float


@dataclass(frozen=True)
class SignalRanks:
    """Deliver ``sig`` to every worker of every agent still connected."""

    sig: int


@dataclass(frozen=True)
class RequestStacks:
    """Ask these ranks (node -> ranks) to dump their stacks to stderr."""

    by_node: dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class CaptureStacks:
    """Collect these ranks' stack dumps from their output for the hang report."""

    ranks: tuple[int, ...]
    idle_s: float = 0.0
    """How long no rank had made progress when the hang was declared (for the report)."""


@dataclass(frozen=True)
class Note:
    text: str
    error: bool = False


@dataclass(frozen=True)
class SetStatus:
    status: RunStatus


@dataclass(frozen=True)
class RecordRanks:
    """Rank states changed: rewrite ranks.json, update the view."""


@dataclass(frozen=True)
class RecordFleet:
    """The fleet change under way changed (`AttemptMachine.fleet`): update the view."""


Action = (
    StopRanks
    | SignalRanks
    | RequestStacks
    | CaptureStacks
    | Note
    | SetStatus
    | RecordRanks
    | RecordFleet
)


class HangPhase(enum.Enum):
    """The hang watch of one attempt, owned by the machine: the runner's timer raises HangDue
    only while WATCHING, the stack capture lives only while CAPTURING, and a hang is declared
    once."""

    WATCHING = "watching"
    CAPTURING = "capturing"
    DECLARED = "declared"


class Ending(enum.Enum):
    """How an attempt ended; `Outcome.status` is what the run directory records of it."""

    SUCCEEDED = "succeeded"
    RANKS_FAILED = "ranks failed"
    INTERRUPTED = "interrupted"
    INCOMPLETE = "incomplete"
    """Every agent is done but some ranks never reported an exit."""
    FLEET_CHANGED = "fleet changed"
    """The ranks saved (or were stopped) so that the next attempt runs on other hosts: a host
    was preempted, or one may join (`Outcome.fleet` says which)."""


@dataclass(frozen=True)
class Outcome:
    ending: Ending
    exit_code: int
    message: str = ""
    failures: tuple[Failure, ...] = ()
    stopped_ranks: tuple[int, ...] = ()
    summary: str = ""
    signal_while_stopping: int | None = None
    """A SIGINT/SIGTERM that arrived after a failure had started the stop: it does not replace
    the failure as the root cause, but no restart follows it."""
    warnings: tuple[str, ...] = ()
    """What the job's end must say even when it succeeded (ranks that ran alone)."""
    fleet: FleetOutcome | None = None
    """The attempt's fleet change, whatever its ending: preempted hosts leave the next
    attempt, hosts that may join join it."""

    @property
    def status(self) -> RunStatus:
        return {
            Ending.SUCCEEDED: RunStatus.SUCCEEDED,
            Ending.INTERRUPTED: RunStatus.INTERRUPTED,
            Ending.FLEET_CHANGED: RunStatus.RESTARTING,
        }.get(self.ending, RunStatus.FAILED)


@dataclass(frozen=True)
class Policy:
    """What the user asked for that the machine's decisions depend on."""

    grace: float
    checkpoint_dir: bool = False
    save_signal: int | None = None
    """--save-on's signal number (None: --save-on none)."""
    grow_interval: float = 60.0
    """--grow-interval: an attempt runs at least this long before it may grow."""
    goes_on_without: bool = True
    """The job may go on without a preempted host (--min-nodes); else it ends after the save."""


class RankTable:
    """The ranks of one attempt and where each stands."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankState] = {}
        self.last_step: int | None = None
        """The job's latest step (from the ranks' step metrics)."""

    def __len__(self) -> int:
        return len(self.ranks)

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    def __getitem__(self, rank: int) -> RankState:
        return self.ranks[rank]

    def get(self, rank: int) -> RankState | None:
        return self.ranks.get(rank)

    def plan(self, slots: Sequence[RankSlot]) -> None:
        self.ranks = {slot.rank: RankState(slot) for slot in slots}

    def live(self) -> list[RankState]:
        return [s for s in self.ranks.values() if not s.phase.over]

    def started(self, rank: int, pid: int) -> bool:
        state = self.ranks.get(rank)
        if state is None:
            return False
        state.pid = pid
        if state.phase is RankPhase.STARTING:
            state.phase = RankPhase.RUNNING
        return True

    def exited(self, event: RankExited) -> RankState | None:
        state = self.ranks.get(event.rank)
        if state is None:
            return None
        state.signal = event.signal
        state.exit_code = frames.exit_code_of(event.code, event.signal)
        state.phase = RankPhase.EXITED
        state.exit_step = self.last_step
        if event.pid:
            state.pid = event.pid
        return state

    def lose_node(self, node: int) -> list[RankState]:
        """Every unfinished rank of ``node`` is lost (its agent's connection broke)."""
        lost = [s for s in self.live() if s.slot.node == node]
        for state in lost:
            state.exit_code = EXIT_LOST_AGENT
            state.phase = RankPhase.LOST
            state.exit_step = self.last_step
        return lost

    def stopped_by_us(self, failed: set) -> tuple[int, ...]:
        """Ranks that did not fail themselves but ended by the stop."""
        return tuple(
            s.rank
            for s in self.ranks.values()
            if s.rank not in failed and (s.exit_code != 0 or s.signal)
        )

    def rows(self, progress: dict[int, str], output_at: dict[int, float]) -> list[RankRow]:
        return [
            RankRow(
                rank=s.rank,
                local_rank=s.slot.local_rank,
                host=s.slot.host,
                node_rank=s.slot.node,
                pid=s.pid,
                state=s.phase,
                exit_code=s.exit_code,
                signal=s.signal,
                signal_name=signal_name(s.signal),
                stacks=s.stacks,
                last_step=s.exit_step if s.phase.over else self.last_step,
                progress=progress.get(s.rank),
                last_output=output_at.get(s.rank),
            )
            for s in sorted(self.ranks.values(), key=lambda s: s.rank)
        ]


class AttemptMachine:
    """One attempt of a job: its ranks' phases, its failures, and whether it is stopping."""

    def __init__(self, hosts: Sequence[str], policy: Policy):
        self.hosts = tuple(hosts)
        """Per node: the host's display name."""
        self.policy = policy
        self.phase = RunStatus.STARTING
        self.ranks = RankTable()
        self.agent_done = [False] * len(self.hosts)
        self.failures: list[Failure] = []
        self.lost_nodes: set[int] = set()
        """Nodes whose agent broke off or stopped hearing the controller (zlaunch/launcher/elastic.py)."""
        self.stop_started: float | None = None
        self.stop_grace = policy.grace
        self.interrupt: int | None = None
        """The signal that started the stop (None: a failure started it, or nothing did)."""
        self.signal_while_stopping: int | None = None
        self.sigint_count = 0
        self.save_requested = False
        self.save_asked_at: float | None = None
        """When the ranks were asked to save; None once one answered or the silence was said."""
        self.hang = HangPhase.WATCHING
        self.groups: dict[int, GroupReport] = {}
        """Per rank, the process group its script joined (zlaunch/launcher/world_check.py)."""
        self.fleet = FleetIntent()
        """The fleet change this attempt is heading for (zlaunch/launcher/fleet_state.py)."""
        self.planned_at: float | None = None
        """When the plan went out (--grow-interval counts from here)."""
        self.save_ready: set[int] = set()
        """Ranks that listen for the save signal."""
        self.checkpointing = False
        """A rank said a checkpoint is being written and has not said it is complete."""

    # ---- queries ----------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return all(self.agent_done)

    @property
    def stopping(self) -> bool:
        return self.stop_started is not None

    # ---- transitions ------------------------------------------------------------------------

    def handle(self, event: AttemptEvent, now: float) -> list[Action]:
        """Apply ``event`` at monotonic time ``now``; the actions to carry out, in order."""
        match event:
            case AttemptPlanned():
                return self._on_AttemptPlanned(event, now)
            case RankStarted():
                return self._on_RankStarted(event, now)
            case StacksReady():
                return self._on_StacksReady(event, now)
            case SaveAcknowledged():
                return self._on_SaveAcknowledged(event, now)
            case SaveReady():
                return self._on_SaveReady(event, now)
            case CheckpointReported():
                return self._on_CheckpointReported(event, now)
            case PreemptionNotice():
                return self._on_PreemptionNotice(event, now)
            case SlowHost():
                return self._on_SlowHost(event, now)
            case HostReturned():
                return self._on_HostReturned(event, now)
            case GroupReported():
                return self._on_GroupReported(event, now)
            case StepReached():
                return self._on_StepReached(event, now)
            case RankExited():
                return self._on_RankExited(event, now)
            case AgentCutOff():
                return self._on_AgentCutOff(event, now)
            case AgentLost():
                return self._on_AgentLost(event, now)
            case AgentFinished():
                return self._on_AgentFinished(event, now)
            case HangDue():
                return self._on_HangDue(event, now)
            case HangStacksIn():
                return self._on_HangStacksIn(event, now)
            case Tick():
                return self._on_Tick(event, now)
            case SignalReceived():
                return self._on_SignalReceived(event, now)
            case _:
                assert_never(event)

    def _on_AttemptPlanned(self, event: AttemptPlanned, now: float) -> list[Action]:
        self.ranks.plan(event.ranks)
        self.planned_at = now
        if self.phase is RunStatus.STARTING:
            self.phase = RunStatus.RUNNING
        return [SetStatus(RunStatus.RUNNING), RecordRanks()]

    def _on_RankStarted(self, event: RankStarted, now: float) -> list[Action]:
        return [RecordRanks()] if self.ranks.started(event.rank, event.pid) else []

    def _on_StacksReady(self, event: StacksReady, now: float) -> list[Action]:
        state = self.ranks.get(event.rank)
        if state is None or state.stacks:
            return []
        state.stacks = True
        return [RecordRanks()]

    def _on_SaveAcknowledged(self, event: SaveAcknowledged, now: float) -> list[Action]:
        if event.rank in self.ranks:
            self.save_asked_at = None  # someone saves: the runtime makes every rank join it
            self.fleet.answered()
        return []

    def _on_SaveReady(self, event: SaveReady, now: float) -> list[Action]:
        if event.rank in self.ranks:
            self.save_ready.add(event.rank)
        return []

    def _on_CheckpointReported(self, event: CheckpointReported, now: float) -> list[Action]:
        if event.rank not in self.ranks:
            return []
        self.checkpointing = event.state is CheckpointState.SAVING
        if (
            event.state is CheckpointState.SAVED
            and event.requested
            and self.fleet.saved(event.step)
        ):
            return [RecordFleet()]
        return []

    # ---- the fleet: preemption notices and hosts that may join ------------------------------

    def _fleet_facts(self, now: float) -> FleetFacts:
        interval_over = (
            self.planned_at is not None and now - self.planned_at >= self.policy.grow_interval
        )
        return FleetFacts(
            phase=self.phase,
            stopping=self.stopping,
            user_save=self.save_requested,
            can_save=self._can_save(),
            fleet=self.fleet.phase,
            checkpointing=self.checkpointing,
            started=bool(self.ranks) and self.save_ready >= set(self.ranks.ranks),
            grow_due=interval_over,
        )

    def _can_save(self) -> bool:
        return (
            self.policy.checkpoint_dir
            and self.policy.save_signal is not None
            and self.fleet.unanswered is None
        )

    def _why_no_save(self, facts: FleetFacts) -> str:
        if not self.policy.checkpoint_dir:
            return "no --checkpoint-dir to save to"
        if self.policy.save_signal is None:
            return "--save-on none"
        if self.fleet.unanswered is not None:
            return self.fleet.unanswered
        if not facts.started:
            return "the ranks do not listen for the save signal (yet)"
        return "no save possible"

    def _on_PreemptionNotice(self, event: PreemptionNotice, now: float) -> list[Action]:
        if not 0 <= event.node < len(self.hosts):
            return []
        host = self.hosts[event.node]
        facts = self._fleet_facts(now)
        answer = self.fleet.notice(event.node, host, event.deadline, event.why, facts, now)
        if answer is None:
            return []  # said before
        why = self._why_no_save(facts) if answer is NoticeAnswer.STOP else ""
        words = notice_words(
            host, event.why, event.deadline - now, answer, why, self.policy.goes_on_without
        )
        note = Note(words, error=True)
        match answer:
            case NoticeAnswer.SAVE:
                return [note, *self._fleet_save(now)]
            case NoticeAnswer.STOP:
                return [note, *self._stop(self.policy.grace, now), RecordFleet()]
            case NoticeAnswer.JOIN_SAVE | NoticeAnswer.AT_RESTART | NoticeAnswer.WITH_USER_SAVE:
                return [note, RecordFleet()]
            case _:
                assert_never(answer)

    def _on_SlowHost(self, event: SlowHost, now: float) -> list[Action]:
        if not 0 <= event.node < len(self.hosts) or event.node in self.fleet.notices:
            return []
        host = self.hosts[event.node]
        facts = self._fleet_facts(now)
        answer = notice_answer(facts)
        if answer in (NoticeAnswer.STOP, NoticeAnswer.WITH_USER_SAVE):
            # Taking a slow host out must not cost the job's progress: without a save it stays.
            why = (
                self._why_no_save(facts)
                if answer is NoticeAnswer.STOP
                else "the job ends with the save under way"
            )
            return [Note(slow_kept_words(host, event.why, why), error=True)]
        self.fleet.notice(event.node, host, math.inf, event.why, facts, now, slow=True)
        note = Note(slow_out_words(host, event.why, answer), error=True)
        if answer is NoticeAnswer.SAVE:
            return [note, *self._fleet_save(now)]
        return [note, RecordFleet()]

    def _on_HostReturned(self, event: HostReturned, now: float) -> list[Action]:
        facts = self._fleet_facts(now)
        answer = self.fleet.returned(event.host, facts)
        if answer is None:
            return []
        return self._grow_actions(answer, (event.host,), facts, now)

    def _grow_actions(
        self, answer: GrowAnswer, hosts: Sequence[str], facts: FleetFacts, now: float
    ) -> list[Action]:
        match answer:
            case GrowAnswer.GROW:
                note = Note(grow_words(hosts, answer), error=True)
                return [note, *self._fleet_save(now)]
            case GrowAnswer.WITH_CHANGE:
                return [Note(grow_words(hosts, answer), error=True), RecordFleet()]
            case GrowAnswer.CANNOT:
                if self.fleet.cannot_grow_said:
                    return []
                self.fleet.cannot_grow_said = True
                return [Note(grow_words(hosts, answer, self._why_no_save(facts)), error=True)]
            case GrowAnswer.WAIT:
                return [RecordFleet()]
            case GrowAnswer.NOT_NOW:
                return []
            case _:
                assert_never(answer)

    def _fleet_save(self, now: float) -> list[Action]:
        """Every rank saves at its next step boundary, for the change (not the user's save:
        the job goes on after it)."""
        self.fleet.ask_save(now)
        return [SignalRanks(self.policy.save_signal), RecordFleet()]

    def _fleet_tick(self, now: float) -> list[Action]:
        facts = self._fleet_facts(now)
        step = self.fleet.due(facts, now, SAVE_ACK_WAIT)
        match step:
            case FleetStep.NOTHING:
                return []
            case FleetStep.GROW | FleetStep.JOIN | FleetStep.CANNOT:
                hosts = self.fleet.take_waiting(step)
                answer = {
                    FleetStep.GROW: GrowAnswer.GROW,
                    FleetStep.JOIN: GrowAnswer.WITH_CHANGE,
                    FleetStep.CANNOT: GrowAnswer.CANNOT,
                }[step]
                return self._grow_actions(answer, hosts, facts, now)
            case FleetStep.DEADLINE_PASSED | FleetStep.UNANSWERED:
                note = Note(self.fleet.stop_words(step), error=True)
                return [note, *self._stop(self.policy.grace, now), RecordFleet()]
            case FleetStep.GROW_UNANSWERED | FleetStep.SLOW_UNANSWERED:
                return [Note(self.fleet.stop_words(step), error=True), RecordFleet()]
            case _:
                assert_never(step)

    def _on_GroupReported(self, event: GroupReported, now: float) -> list[Action]:
        if event.rank in self.ranks:
            self.groups[event.rank] = GroupReport(
                event.size, event.accelerate, event.accelerate_processes
            )
        return []

    def _on_StepReached(self, event: StepReached, now: float) -> list[Action]:
        self.ranks.last_step = event.step
        return []

    def _on_RankExited(self, event: RankExited, now: float) -> list[Action]:
        state = self.ranks.exited(event)
        if state is None:
            return []
        actions: list[Action] = [RecordRanks()]
        if state.exit_code != 0 and not self.stopping and self.fleet.going(state.slot.node):
            # A preempted host's rank ended (its host is going): expected, not a failure.
            return [*actions, *self._preempted_host_went(state.slot.node, now)]
        if state.exit_code != 0 and not self.stopping:
            self.failures.append(_rank_failure(state, event.last_lines, event.at))
            actions.append(
                Note(
                    f"rank {state.rank} on {state.slot.host} {_exit_words(state)}; "
                    f"stopping all {len(self.ranks)} ranks",
                    error=True,
                )
            )
            actions += self._stop(self.policy.grace, now)
        return actions

    def _on_AgentCutOff(self, event: AgentCutOff, now: float) -> list[Action]:
        # The node's ranks now die of their agent's SIGTERM: the cut-off is the failure, not
        # the first of those exits (which would read as a rank killed for no reason).
        self.lost_nodes.add(event.node)
        host = self.hosts[event.node]
        cut = [s for s in self.ranks.live() if s.slot.node == event.node]
        if not cut or self.stopping:
            return [Note(f"{host}: {event.why}", error=True)]
        ranks = rank_ranges(s.rank for s in cut)
        why = f"{event.why} (the agent no longer hears zlaunch: ranks {ranks} stopped by it)"
        self.failures.append(_rank_failure(cut[0], (), event.at, why))
        return [Note(f"{host}: {why}", error=True), *self._stop(self.policy.grace, now)]

    def _on_AgentLost(self, event: AgentLost, now: float) -> list[Action]:
        self.agent_done[event.node] = True
        self.lost_nodes.add(event.node)
        lost = self.ranks.lose_node(event.node)
        actions: list[Action] = [RecordRanks()] if lost else []
        if lost and not self.stopping and self.fleet.going(event.node):
            return [*actions, *self._preempted_host_went(event.node, now)]
        if lost and not self.stopping:
            first = lost[0]
            self.failures.append(
                _rank_failure(first, event.last_lines.get(first.rank, ()), event.at, event.why)
            )
            actions.append(Note(f"{self.hosts[event.node]}: {event.why}", error=True))
            actions += self._stop(self.policy.grace, now)
        return actions

    def _preempted_host_went(self, node: int, now: float) -> list[Action]:
        """A preempted host's ranks ended, or its agent went, before the attempt did."""
        if self.fleet.phase is FleetPhase.SAVED:
            return []  # the checkpoint is complete: the ranks were on their way out
        step = self.fleet.host_went()
        return [
            Note(self.fleet.stop_words(step, self.hosts[node]), error=True),
            *self._stop(self.policy.grace, now),
            RecordFleet(),
        ]

    def _on_AgentFinished(self, event: AgentFinished, now: float) -> list[Action]:
        self.agent_done[event.node] = True
        return []

    def _on_HangDue(self, event: HangDue, now: float) -> list[Action]:
        if self.stopping or self.interrupt is not None or self.hang is not HangPhase.WATCHING:
            return []
        self.hang = HangPhase.CAPTURING
        return [
            Note(
                f"no rank reached a step boundary for {event.idle_s:.0f} s (--hang-timeout "
                f"{event.timeout_s:g}); collecting every rank's stacks, then stopping",
                error=True,
            ),
            *self._request_stacks(_STACKS_WORDS),
            CaptureStacks(tuple(s.rank for s in self.ranks.live() if s.stacks), event.idle_s),
        ]

    def _on_HangStacksIn(self, event: HangStacksIn, now: float) -> list[Action]:
        self.hang = HangPhase.DECLARED
        if self.stopping:
            return []
        self.failures.append(event.failure)
        return self._stop(self.policy.grace, now)

    def _on_Tick(self, event: Tick, now: float) -> list[Action]:
        fleet = self._fleet_tick(now)
        if fleet:
            return fleet
        if self._save_unanswered(now):
            self.save_asked_at = None
            return [Note(self._unanswered_save_words(), error=True)]
        if not self.stopping or now - self.stop_started <= self.stop_grace + STOP_SLACK:
            return []
        actions: list[Action] = []
        for node, done in enumerate(self.agent_done):
            if not done:
                self.agent_done[node] = True
                actions.append(
                    Note(
                        f"{self.hosts[node]}: agent did not finish stopping; dropping the "
                        "connection",
                        error=True,
                    )
                )
        return actions

    def _on_SignalReceived(self, event: SignalReceived, now: float) -> list[Action]:
        signum = event.signum
        if signum == self.policy.save_signal:  # --save-on: every rank saves, then exits 0
            return self._forward_save(signum, now)
        if signum == protocol.STACKS_SIGNAL:  # `zlaunch stacks`
            return self._request_stacks(_STACKS_WORDS)
        if signum == signal.SIGINT:
            self.sigint_count += 1
            if self._saves_on_ctrl_c():
                self.save_requested = True
                self.save_asked_at = now
                return [
                    Note(
                        "Ctrl-C: every rank saves a checkpoint at its next step, then exits "
                        "(Ctrl-C again to stop now without saving)",
                        error=True,
                    ),
                    SignalRanks(self.policy.save_signal),
                ]
        if self.stopping:
            # A stop is under way (a failure, or an earlier signal): the first failure stays the
            # root cause whatever arrives now, and Ctrl-C kills at once, as the notes promise.
            if self.interrupt is None and self.signal_while_stopping is None:
                self.signal_while_stopping = signum
            if signum == signal.SIGINT:
                return [Note("killing all ranks now", error=True), *self._stop(0.0, now)]
            return []
        if self.interrupt is None:
            self.interrupt = signum
            note = Note(
                f"{signal_name(signum)}: stopping all ranks (grace {self.policy.grace:g}s; "
                f"Ctrl-C again to kill now){self._no_save_words()}",
                error=True,
            )
            return [note, *self._stop(self.policy.grace, now)]
        return []

    # ---- pieces -----------------------------------------------------------------------------

    def _stop(self, grace: float, now: float) -> list[Action]:
        actions: list[Action] = []
        if self.stop_started is None:
            self.stop_started = now
            self.phase = RunStatus.STOPPING
            actions.append(SetStatus(RunStatus.STOPPING))
            self.stop_grace = grace
        else:
            self.stop_grace = min(self.stop_grace, grace)
        actions.append(StopRanks(grace))
        return actions

    def _forward_save(self, signum: int, now: float) -> list[Action]:
        name = signal_name(signum)
        if not self.policy.checkpoint_dir:
            return [Note(f"{name} ignored: no --checkpoint-dir to save to", error=True)]
        if self.stopping or self.save_requested:
            return []
        self.save_requested = True
        self.save_asked_at = now
        return [
            Note(f"{name}: every rank saves a checkpoint at its next step, then exits"),
            SignalRanks(signum),
        ]

    def _saves_on_ctrl_c(self) -> bool:
        """The first Ctrl-C of a running job with --checkpoint-dir saves, then stops."""
        return (
            self.sigint_count == 1
            and self.interrupt is None
            and not self.stopping
            and not self.save_requested
            and self.policy.checkpoint_dir
            and self.policy.save_signal is not None
            and self.phase is RunStatus.RUNNING
        )

    def _save_unanswered(self, now: float) -> bool:
        """Asked to save SAVE_ACK_WAIT ago, no rank answered, and the job still runs."""
        return (
            self.save_asked_at is not None
            and not self.stopping
            and now - self.save_asked_at >= SAVE_ACK_WAIT
        )

    def _unanswered_save_words(self) -> str:
        name = signal_name(self.policy.save_signal)
        again = (
            f"Ctrl-C again stops every rank without a checkpoint (TERM, then KILL after "
            f"{self.policy.grace:g} s)"
            if self.sigint_count
            else "Ctrl-C stops every rank without a checkpoint"
        )
        return (
            f"no rank answered the save request in {SAVE_ACK_WAIT:g} s: this script does not "
            f"handle {name} (runtime.initialize jobs do; a script can save on it itself, see "
            f"'Saving from your own script' in docs/checkpoints.md); training goes on; {again}"
        )

    def _no_save_words(self) -> str:
        if self.save_requested:
            return "; no checkpoint is written now"
        if not self.policy.checkpoint_dir:
            return "; no checkpoint is written (--checkpoint-dir makes Ctrl-C save first)"
        if self.policy.save_signal is None:
            return "; no checkpoint is written (--save-on none)"
        return ""

    def _request_stacks(self, words: str) -> list[Action]:
        """Ask every live rank whose runtime listens to dump its stacks; say who cannot."""
        live = self.ranks.live()
        ready = [s for s in live if s.stacks]
        others = sorted(s.rank for s in live if not s.stacks)
        text = words.format(ready=len(ready))
        if others:
            text += f"; ranks {rank_ranges(others)} cannot dump (not Python, or still starting)"
        by_node: dict[int, tuple[int, ...]] = {}
        for state in ready:
            if not self.agent_done[state.slot.node]:
                by_node[state.slot.node] = (*by_node.get(state.slot.node, ()), state.rank)
        return [Note(text), RequestStacks(by_node)]

    # ---- the end ----------------------------------------------------------------------------

    def _every_rank_ended_well(self) -> bool:
        return bool(self.ranks) and all(
            s.phase is RankPhase.EXITED and s.exit_code == 0 for s in self.ranks.ranks.values()
        )

    def outcome(self, ended_by_scheduler: str | None = None) -> Outcome:
        """How the attempt ended, once every agent is done. ``ended_by_scheduler``: Slurm's
        word that it ended the job (the ranks died of its SIGTERM: not a crash)."""
        outcome = self._ending(ended_by_scheduler)
        fleet = self.fleet.outcome(every_rank_ended_well=self._every_rank_ended_well())
        if fleet is not None:
            outcome = dataclasses.replace(outcome, fleet=fleet)
        alone = alone_warning(self.groups, len(self.ranks))
        if alone is None:
            return outcome
        return dataclasses.replace(outcome, warnings=(*outcome.warnings, alone))

    def _ending(self, ended_by_scheduler: str | None) -> Outcome:
        if ended_by_scheduler is not None and (self.failures or self.interrupt is not None):
            return Outcome(
                Ending.INTERRUPTED,
                128 + signal.SIGTERM,
                f"{ended_by_scheduler}; all ranks stopped",
            )
        if self.failures:  # the first failure is the root cause, whatever came after it
            return dataclasses.replace(
                _failed(self.failures, self.ranks),
                signal_while_stopping=self.interrupt or self.signal_while_stopping,
            )
        if self.interrupt is not None:
            return Outcome(
                Ending.INTERRUPTED,
                128 + self.interrupt,
                f"stopped by {signal_name(self.interrupt)}; all ranks stopped",
            )
        if not self.save_requested and self.fleet.changed():
            return Outcome(Ending.FLEET_CHANGED, 0, self.fleet.ending_words())
        if self.ranks.live():
            return Outcome(Ending.INCOMPLETE, EXIT_LOST_AGENT, "some ranks never reported an exit")
        return Outcome(Ending.SUCCEEDED, 0)


_STACKS_WORDS = (
    "stack dump requested from {ready} rank(s) by `zlaunch stacks` (not a crash; the dumps go "
    "to the rank logs, that command prints them grouped)"
)


def _failed(failures: Sequence[Failure], ranks: RankTable) -> Outcome:
    """The outcome of an attempt that failed; the first failure is the root cause."""
    root = failures[0]
    code = root.exit_code if root.exit_code is not None else 1
    # a hang's suspects did not fail themselves: zlaunch stopped every rank
    stopped = ranks.stopped_by_us({f.rank for f in failures if not f.is_hang})
    if root.is_hang:
        cause, what = "the job", "hung: " + (root.message or "")
        summary = f"hung, {len(ranks)} ranks stopped"
    else:
        cause = f"rank {root.rank} on {root.host}"
        what = (
            f"was killed by {root.signal_name}"
            if root.signal
            else root.message or f"exited with code {code}"
        )
        summary = f"{len(failures)} failed rank(s) of {len(ranks)}"
    return Outcome(
        Ending.RANKS_FAILED,
        code,
        f"{cause} {what}; job stopped (exit code {code})",
        failures=tuple(failures),
        stopped_ranks=stopped,
        summary=summary,
    )


def _exit_words(state: RankState) -> str:
    if state.signal:
        return f"was killed by {signal_name(state.signal)} (exit code {state.exit_code})"
    return f"exited with code {state.exit_code}"


def _rank_failure(
    state: RankState, last_lines: Sequence[str], at: str, message: str | None = None
) -> Failure:
    return Failure(
        host=state.slot.host,
        rank=state.rank,
        local_rank=state.slot.local_rank,
        node_rank=state.slot.node,
        pid=state.pid,
        exit_code=state.exit_code,
        signal=state.signal,
        signal_name=signal_name(state.signal),
        time=at,
        message=message,
        last_lines=tuple(last_lines),
    )
