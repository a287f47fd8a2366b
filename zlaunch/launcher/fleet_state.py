"""The fleet change an attempt is heading for: preemption notices with their deadlines, hosts
that may join, and the save such a change asks of the ranks.

Owned by the attempt's machine (``zlaunch/launcher/state.py``), which feeds it the events
``PreemptionNotice`` and ``HostReturned`` and answers with its usual actions: ask every rank to
save at its next step boundary, stop, note, record. Pure like the machine: no clock (times are
passed in), no I/O. What a notice does and whether a host joins now are the two tables below
(`notice_answer`, `grow_answer`), tested case by case in
``tests/unit/launcher/test_fleet_state.py``; which hosts the next attempt then runs on is
``zlaunch/launcher/fleet_policy.py``.

Phases (`FleetPhase`)::

    STEADY --notice, or a host may join (and --grow-interval passed)--> SAVING
    SAVING --the requested save is complete (the runtime says so)--> SAVED
    SAVING --deadline passed | nobody answers the save | no save possible--> STOPPING
    STEADY --notice with nothing to save to--> STOPPING
    SAVING --nobody answers a grow's save--> STEADY (the grow is dropped for this attempt)

Once every rank has exited, an attempt that was not STEADY ends with ``Ending.FLEET_CHANGED``
and the job goes on with its next attempt.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from zlaunch.rundir import RunStatus

__all__ = [
    "FleetPhase",
    "FleetStep",
    "Notice",
    "NoticeAnswer",
    "GrowAnswer",
    "FleetFacts",
    "FleetIntent",
    "FleetOutcome",
    "notice_answer",
    "grow_answer",
    "notice_words",
    "grow_words",
]


class FleetPhase(enum.Enum):
    """Where the attempt's fleet change stands."""

    STEADY = "steady"
    """No change under way: the attempt runs on its hosts."""
    SAVING = "saving"
    """Every rank was asked to save at its next step boundary, so that the next attempt can
    run on other hosts; they exit once it is written."""
    SAVED = "saved"
    """The save the change asked for is complete (a rank said so): the ranks are exiting."""
    STOPPING = "stopping"
    """The change stops the ranks without a new checkpoint: nothing can save, nobody
    answered, or a deadline passed first. The next attempt resumes from the last checkpoint."""


@dataclass(frozen=True)
class Notice:
    """A host's preemption notice: it goes away at ``deadline`` (monotonic seconds). A slow
    host taken out (``slow``, --slow-node exclude) leaves the same way but does not go away:
    its deadline is infinite, the save is waited for as long as the ranks take."""

    host: str
    deadline: float
    why: str
    at: float
    slow: bool = False


class NoticeAnswer(enum.Enum):
    """What a preemption notice does, by the attempt's state (`notice_answer`)."""

    SAVE = "save"
    """Ask every rank to save at its next step; the next attempt runs without the host."""
    JOIN_SAVE = "join save"
    """A save for a change is under way: the host leaves with it (the earliest deadline holds)."""
    STOP = "stop"
    """Nothing can save (no --checkpoint-dir, --save-on none, a script that does not save on
    request, or ranks still starting): stop now; the next attempt runs without the host."""
    AT_RESTART = "at restart"
    """The attempt is stopping anyway (a failure, a signal, a deadline): the next one leaves
    the host out."""
    WITH_USER_SAVE = "with user save"
    """The user's own save is under way (Ctrl-C, ``zlaunch stop --save``): the job ends with
    it, as asked; the notice is recorded."""


class GrowAnswer(enum.Enum):
    """What a host that may join does to a running attempt, by its state (`grow_answer`)."""

    GROW = "grow"
    """Ask every rank to save at its next step; the next attempt adds the host."""
    WAIT = "wait"
    """Not yet: the attempt has run less than --grow-interval, or a checkpoint is being written
    (a job never grows mid-save); asked again as time passes."""
    WITH_CHANGE = "with change"
    """A change is under way (a preemption's save): the host joins its next attempt."""
    NOT_NOW = "not now"
    """The attempt is stopping or still starting: whatever restart follows may take it."""
    CANNOT = "cannot"
    """No save is possible (no --checkpoint-dir, --save-on none, a script that did not answer
    a save request): growing would lose the job's progress, so it does not."""


@dataclass(frozen=True)
class FleetFacts:
    """What the two tables look at, taken from the machine at the time of the event."""

    phase: RunStatus
    stopping: bool
    user_save: bool
    """The user asked the ranks to save and exit (Ctrl-C with --checkpoint-dir, the save
    signal): the job ends after that save."""
    can_save: bool
    """--checkpoint-dir, a save signal, and no save request of this attempt went unanswered."""
    fleet: FleetPhase
    checkpointing: bool = False
    """A rank said a checkpoint is being written (the script's own save)."""
    started: bool = True
    """Some rank finished setting up (the runtime said it is ready, or a step was reached)."""
    grow_due: bool = True
    """--grow-interval has passed since the attempt started."""


def notice_answer(facts: FleetFacts) -> NoticeAnswer:
    """What a preemption notice does now."""
    if facts.stopping or facts.fleet is FleetPhase.STOPPING:
        return NoticeAnswer.AT_RESTART
    if facts.user_save:
        return NoticeAnswer.WITH_USER_SAVE
    if facts.fleet in (FleetPhase.SAVING, FleetPhase.SAVED):
        return NoticeAnswer.JOIN_SAVE
    if not facts.can_save or not facts.started or facts.phase is not RunStatus.RUNNING:
        return NoticeAnswer.STOP
    return NoticeAnswer.SAVE


def grow_answer(facts: FleetFacts) -> GrowAnswer:
    """What a host that may join does now."""
    if facts.stopping or facts.fleet is FleetPhase.STOPPING or facts.user_save:
        return GrowAnswer.NOT_NOW
    if facts.fleet in (FleetPhase.SAVING, FleetPhase.SAVED):
        return GrowAnswer.WITH_CHANGE
    if not facts.can_save:
        return GrowAnswer.CANNOT
    if facts.phase is not RunStatus.RUNNING or not facts.started:
        return GrowAnswer.WAIT
    if not facts.grow_due or facts.checkpointing:
        return GrowAnswer.WAIT
    return GrowAnswer.GROW


@dataclass(frozen=True)
class FleetOutcome:
    """What an attempt's end says of its fleet change, for the restart policy and the record."""

    leaving: tuple[Notice, ...] = ()
    """Preempted hosts: the next attempt runs without them."""
    joining: tuple[str, ...] = ()
    """Hosts that may join the next attempt (the job grows)."""
    saved: bool = False
    """The ranks saved for the change (a new checkpoint to resume from)."""
    saved_step: int | None = None
    missed_deadline: bool = False
    """A preemption's deadline passed before the save was complete: it was discarded (never
    half-written: ``latest`` still names the previous checkpoint)."""
    why_unsaved: str | None = None
    """Why the change could not save (said with the outcome)."""


class FleetStep(enum.Enum):
    """What time passing does to the change under way (`FleetIntent.due`)."""

    NOTHING = "nothing"
    GROW = "grow"
    """Hosts that waited may join now: ask the save."""
    JOIN = "join"
    """Hosts that waited join the change under way."""
    CANNOT = "cannot"
    """Hosts that waited cannot join: no save is possible."""
    DEADLINE_PASSED = "deadline passed"
    """A preempted host's deadline passed before the save was complete: stop every rank."""
    UNANSWERED = "unanswered"
    """No rank answered a preemption's save request: stop every rank."""
    GROW_UNANSWERED = "grow unanswered"
    """No rank answered a grow's save request: the attempt goes on, without growing."""
    SLOW_UNANSWERED = "slow unanswered"
    """No rank answered the save request that takes a slow host out: the attempt goes on with
    it (as with --slow-node warn)."""
    HOST_WENT = "host went"
    """A preempted host's ranks ended before the save was complete: stop every rank."""


@dataclass
class FleetIntent:
    """The attempt's fleet change: the machine's own state, changed only through the methods
    below, which the machine calls (zlaunch/launcher/state.py)."""

    phase: FleetPhase = FleetPhase.STEADY
    notices: dict[int, Notice] = field(default_factory=dict)
    """Per node: its preemption notice."""
    joining: list[str] = field(default_factory=list)
    """Hosts that join the next attempt."""
    waiting: list[str] = field(default_factory=list)
    """Hosts that may join, held until `grow_answer` says GROW (--grow-interval, a save)."""
    asked_at: float | None = None
    """When the ranks were asked to save for the change; None once a rank answered."""
    acknowledged: bool = False
    """Some rank said it will save."""
    saved_step: int | None = None
    missed_deadline: bool = False
    why_unsaved: str | None = None
    unanswered: str | None = None
    """Why this attempt can no longer be asked to save (its ranks did not answer once)."""
    cannot_grow_said: bool = False

    # ---- queries ----------------------------------------------------------------------------

    @property
    def under_way(self) -> bool:
        return self.phase is not FleetPhase.STEADY

    def going(self, node: int) -> bool:
        """``node`` was preempted (its host is going away: its ranks' ends are expected); a
        slow host taken out is not going anywhere until the attempt ends."""
        notice = self.notices.get(node)
        return notice is not None and not notice.slow

    def deadline(self) -> float | None:
        """The earliest deadline of the notices (when the first preempted host goes)."""
        return min((n.deadline for n in self.notices.values()), default=None)

    def changed(self) -> bool:
        """Whether the attempt ended for the change (asked save answered, or stopped for it)."""
        return self.phase in (FleetPhase.SAVED, FleetPhase.STOPPING) or (
            self.phase is FleetPhase.SAVING and self.acknowledged
        )

    # ---- transitions ------------------------------------------------------------------------

    def notice(
        self,
        node: int,
        host: str,
        deadline: float,
        why: str,
        facts: FleetFacts,
        now: float,
        slow: bool = False,
    ) -> NoticeAnswer | None:
        """A preemption notice for ``node`` (``slow``: the slow host taken out); None when that
        node had one already."""
        if node in self.notices:
            return None
        answer = notice_answer(facts)
        self.notices[node] = Notice(host, deadline, why, now, slow)
        if answer is NoticeAnswer.STOP and self.phase is FleetPhase.STEADY:
            self.phase = FleetPhase.STOPPING
            self.why_unsaved = "no save was possible"
        return answer

    def returned(self, host: str, facts: FleetFacts) -> GrowAnswer | None:
        """``host`` may join; None when it is already joining or waiting."""
        if host in self.joining or host in self.waiting:
            return None
        answer = grow_answer(facts)
        if answer in (GrowAnswer.GROW, GrowAnswer.WITH_CHANGE):
            self.joining.append(host)
        elif answer is GrowAnswer.WAIT:
            self.waiting.append(host)
        return answer

    def ask_save(self, now: float) -> None:
        self.phase = FleetPhase.SAVING
        self.asked_at = now

    def answered(self) -> None:
        """A rank acknowledged a save request."""
        if self.phase is FleetPhase.SAVING:
            self.acknowledged = True
            self.asked_at = None

    def saved(self, step: int | None) -> bool:
        """The requested save is complete; True when that completes the change's save."""
        if self.phase is not FleetPhase.SAVING:
            return False
        self.phase = FleetPhase.SAVED
        self.saved_step = step
        return True

    def due(self, facts: FleetFacts, now: float, ack_wait: float) -> FleetStep:
        """What the time ``now`` does to the change under way."""
        deadline = self.deadline()
        if self.phase is FleetPhase.SAVING:
            if deadline is not None and now >= deadline:
                self.phase = FleetPhase.STOPPING
                self.missed_deadline = True
                self.why_unsaved = "the deadline passed before the save was complete"
                return FleetStep.DEADLINE_PASSED
            if self.asked_at is not None and now - self.asked_at >= ack_wait:
                self.asked_at = None
                self.unanswered = "no rank answered the save request"
                if any(self.going(node) for node in self.notices):
                    self.phase = FleetPhase.STOPPING
                    self.why_unsaved = self.unanswered
                    return FleetStep.UNANSWERED
                # Only hosts that may join, or slow hosts, wanted the save: none of them is
                # going away, so the attempt goes on as it is rather than lose its progress.
                step = FleetStep.SLOW_UNANSWERED if self.notices else FleetStep.GROW_UNANSWERED
                self.phase = FleetPhase.STEADY
                self.joining.clear()
                self.notices.clear()
                return step
        if not self.waiting:
            return FleetStep.NOTHING
        answer = grow_answer(facts)
        if answer is GrowAnswer.GROW:
            return FleetStep.GROW
        if answer is GrowAnswer.WITH_CHANGE:
            return FleetStep.JOIN
        if answer is GrowAnswer.CANNOT:
            return FleetStep.CANNOT
        return FleetStep.NOTHING

    def take_waiting(self, step: FleetStep) -> tuple[str, ...]:
        """The waiting hosts, which `step` lets join (GROW, JOIN) or turns away (CANNOT)."""
        hosts, self.waiting = tuple(self.waiting), []
        if step in (FleetStep.GROW, FleetStep.JOIN):
            self.joining.extend(hosts)
        return hosts

    def host_went(self) -> FleetStep:
        """A preempted host's ranks ended (or its agent went) before the save was complete."""
        self.phase = FleetPhase.STOPPING
        self.missed_deadline = True
        self.why_unsaved = "the preempted host went before the save was complete"
        return FleetStep.HOST_WENT

    # ---- words and the end ------------------------------------------------------------------

    def stop_words(self, step: FleetStep, host: str | None = None) -> str:
        hosts = ", ".join(n.host for n in self.notices.values())
        kept = (
            "no checkpoint is half-written: `latest` still names the last complete one, which "
            "the next attempt resumes from"
        )
        if step is FleetStep.DEADLINE_PASSED:
            return (
                f"the preemption deadline of {hosts} passed before the save was complete; "
                f"stopping every rank ({kept})"
            )
        if step is FleetStep.HOST_WENT:
            return (
                f"{host or hosts} went before the save was complete; stopping every rank ({kept})"
            )
        if step is FleetStep.UNANSWERED:
            return (
                f"no rank answered the save request for the preemption of {hosts}; stopping "
                "every rank (steps since the script's own last checkpoint are lost)"
            )
        if step is FleetStep.SLOW_UNANSWERED:
            return (
                "no rank answered the save request: the slow host stays in the job (as with "
                "--slow-node warn); training goes on"
            )
        return "no rank answered the save request: the job does not grow; training goes on"

    def ending_words(self) -> str:
        parts = _leaving_words(self.notices.values())
        if self.joining:
            parts.append(f"{', '.join(self.joining)} joining")
        what = " and ".join(parts) or "the fleet changed"
        if self.phase is FleetPhase.SAVED and self.saved_step is not None:
            return f"{what}: saved at step {self.saved_step}"
        if self.phase is FleetPhase.STOPPING:
            return f"{what}: stopped without a new checkpoint ({self.why_unsaved})"
        return f"{what}: saved"

    def outcome(self, every_rank_ended_well: bool = False) -> FleetOutcome | None:
        if not self.notices and not self.joining:
            return None
        saved = self.phase is FleetPhase.SAVED or (
            self.phase is FleetPhase.SAVING and self.acknowledged and every_rank_ended_well
        )
        return FleetOutcome(
            leaving=tuple(self.notices[node] for node in sorted(self.notices)),
            joining=tuple(self.joining),
            saved=saved,
            saved_step=self.saved_step,
            missed_deadline=self.missed_deadline,
            why_unsaved=None if saved else self.why_unsaved,
        )

    def describe(self, now: float) -> str:
        """One line for the live panel: what the change under way is waiting for."""
        parts = []
        preempted = [n for n in self.notices.values() if not n.slow]
        if preempted:
            hosts = ", ".join(n.host for n in preempted)
            left = max(0.0, min(n.deadline for n in preempted) - now)
            parts.append(f"{hosts} preempted (goes in {left:.0f} s)")
        slow = [n.host for n in self.notices.values() if n.slow]
        if slow:
            parts.append(f"{', '.join(slow)} slow: taken out")
        if self.joining:
            parts.append(f"{', '.join(self.joining)} joining")
        if self.waiting:
            parts.append(f"{', '.join(self.waiting)} may join")
        state = {
            FleetPhase.STEADY: "",
            FleetPhase.SAVING: "saving at the next step",
            FleetPhase.SAVED: "saved; restarting",
            FleetPhase.STOPPING: "stopping without a new checkpoint",
        }[self.phase]
        return "; ".join(parts + ([state] if state else []))


def _leaving_words(notices) -> list[str]:
    """``node2 preempted``, ``node3 slow``: the hosts a change takes out, by why."""
    preempted = [n.host for n in notices if not n.slow]
    slow = [n.host for n in notices if n.slow]
    return [
        f"{', '.join(hosts)} {what}"
        for hosts, what in ((preempted, "preempted"), (slow, "slow"))
        if hosts
    ]


def notice_words(
    host: str, why: str, left: float, answer: NoticeAnswer, no_save: str, goes_on: bool = True
) -> str:
    """What the console says of a notice, by what it does; ``goes_on``: the job may run
    without the host (a node range), else it ends after the save."""
    head = f"{host}: preemption notice ({why}); it goes in {max(0.0, left):.0f} s"
    then = "then the job goes on without it" if goes_on else "then the job ends (no --min-nodes)"
    return (
        head
        + {
            NoticeAnswer.SAVE: f": every rank saves at its next step, {then}",
            NoticeAnswer.JOIN_SAVE: ": it leaves with the change under way",
            NoticeAnswer.STOP: f"; {no_save}: stopping every rank now, the next attempt runs "
            "without it from the last checkpoint",
            NoticeAnswer.AT_RESTART: "; the next attempt runs without it",
            NoticeAnswer.WITH_USER_SAVE: "; the save under way ends the job, as asked",
        }[answer]
    )


def grow_words(hosts: tuple[str, ...] | list[str], answer: GrowAnswer, why: str = "") -> str:
    names = ", ".join(hosts)
    if answer is GrowAnswer.GROW:
        return f"{names} can join: every rank saves at its next step, then the job grows onto it"
    if answer is GrowAnswer.WITH_CHANGE:
        return f"{names} can join: it joins the next attempt"
    return f"{names} could join, but the job cannot grow: {why}"
