"""The typed records of a run directory: what the controller writes and every reader parses.

The controller (``zlaunch/rundir/recorder.py``) writes ``run.json``'s status, ``ranks.json`` and
``failure.json`` through these types, and the read-side commands (``ls``, ``logs``, ``status``,
``stop``, ``stacks``) and the live view read them back through the same types, so a status or a
rank state is spelled in one place. Readers are tolerant: a field an older controller did not
write gets its default, an unknown status reads as ``None``. Standard library only.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "RunStatus",
    "RankPhase",
    "RankRow",
    "RanksFile",
    "Failure",
    "FailureReport",
    "REASON_RANK_FAILED",
    "REASON_HANG",
]


class _Text(str, enum.Enum):
    """An enum whose members are their JSON strings: ``json.dumps`` and f-strings write the
    value, and a member compares equal to it (records written before the enum still read)."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def parse(cls, value: Any):
        """The member spelled ``value``, or None for anything else (a newer or garbled file)."""
        try:
            return cls(value)
        except ValueError:
            return None


class RunStatus(_Text):
    """A run's status in run.json: the job's phase (zlaunch/launcher/state.py moves it)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    """An attempt failed and the next one (--max-restarts) is about to start; not an end."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    LOST = "lost"
    """Never written: what readers say of a run whose file says it runs but whose controller
    is gone (killed without cleanup)."""
    UNKNOWN = "unknown"
    """Never written: what readers say of a status they cannot read."""

    @property
    def ended(self) -> bool:
        return self in _ENDED

    @property
    def live(self) -> bool:
        return self in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STOPPING)


_ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.INTERRUPTED})


class RankPhase(_Text):
    """Where one rank of the current attempt stands (ranks.json's "state")."""

    STARTING = "starting"
    """Its spec was sent; the agent has not reported the process yet."""
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"
    """Its agent's connection broke: how it ended is unknown (it was killed there)."""

    @property
    def over(self) -> bool:
        return self in (RankPhase.EXITED, RankPhase.LOST)


def _from_json(cls, data: dict[str, Any]):
    """``cls`` from a JSON object: known fields only, missing ones at their defaults."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class RankRow:
    """One rank in ranks.json (read by `zlaunch status` and `zlaunch stacks`)."""

    rank: int
    local_rank: int | None = None
    host: str | None = None
    node_rank: int | None = None
    pid: int | None = None
    state: RankPhase | None = RankPhase.STARTING
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    stacks: bool = False
    """Its runtime dumps stacks on protocol.STACKS_SIGNAL (`zlaunch stacks`)."""
    last_step: int | None = None
    progress: str | None = None
    """The latest state of its progress bar (a line redrawn with carriage returns)."""
    last_output: float | None = None
    """Wall time of its last output line or progress state."""

    def to_json(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict (a deep copy): the controller writes one row
        # per rank, 16,384 of them at scale.
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "node_rank": self.node_rank,
            "pid": self.pid,
            "state": self.state.value if self.state is not None else None,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "signal_name": self.signal_name,
            "stacks": self.stacks,
            "last_step": self.last_step,
            "progress": self.progress,
            "last_output": self.last_output,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankRow:
        return _from_json(cls, {**data, "state": RankPhase.parse(data.get("state"))})


@dataclass(frozen=True)
class RanksFile:
    """ranks.json: every rank of the current attempt, rewritten on each start and exit."""

    attempt: int
    time: float
    ranks: tuple[RankRow, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "time": self.time,
            "ranks": [r.to_json() for r in self.ranks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RanksFile:
        rows = data.get("ranks") or []
        return cls(
            attempt=int(data.get("attempt") or 0),
            time=float(data.get("time") or 0.0),
            ranks=tuple(RankRow.from_json(r) for r in rows if isinstance(r, dict) and "rank" in r),
        )


REASON_RANK_FAILED = "rank failed"
REASON_HANG = "hang"


@dataclass(frozen=True)
class Failure:
    """One failure of an attempt, as torchelastic's ProcessFailure: which rank, where, how it
    ended and its last lines. A hang is one failure of "all" ranks with the stack groups."""

    host: str
    rank: int | str | list[int]
    """The rank (a hang's suspects: a list when several; "all" when none stands out)."""
    exit_code: int | None
    reason: str = REASON_RANK_FAILED
    local_rank: int | None = None
    node_rank: int | None = None
    pid: int | list[int] | None = None
    signal: int | None = None
    signal_name: str | None = None
    time: str | None = None
    message: str | None = None
    last_lines: tuple[str, ...] = ()
    hang: dict[str, Any] | None = None
    """For a hang: timeout, idle time, stack groups, ranks without a dump (zlaunch/launcher/hang.py)."""

    @property
    def is_hang(self) -> bool:
        return self.reason == REASON_HANG

    def how(self) -> str:
        """How it ended, in words: the signal, the message, or the exit code."""
        if self.signal_name:
            return f"killed by {self.signal_name}"
        return self.message or f"exit code {self.exit_code}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["last_lines"] = list(self.last_lines)
        if self.hang is None:
            del data["hang"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Failure:
        lines = tuple(data.get("last_lines") or ())
        return _from_json(
            cls, {"host": "?", "rank": "?", "exit_code": None, **data, "last_lines": lines}
        )


@dataclass(frozen=True)
class FailureReport:
    """failure.json: the root cause (the first failure) and every failure of the attempt."""

    run_id: str
    exit_code: int | None
    summary: str
    root_cause: Failure
    failures: tuple[Failure, ...] = ()
    stopped_ranks: tuple[int, ...] = ()
    """Ranks that did not fail themselves but were stopped by zlaunch."""
    log_dir: str | None = None
    reason: str = field(default=REASON_RANK_FAILED)
    warnings: tuple[str, ...] = ()
    """What else the attempt's end said (ranks that never joined the job's process group)."""

    def to_json(self) -> dict[str, Any]:
        extra = {"warnings": list(self.warnings)} if self.warnings else {}
        return {
            "run_id": self.run_id,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "summary": self.summary,
            "root_cause": self.root_cause.to_json(),
            "failures": [f.to_json() for f in self.failures],
            "stopped_ranks": list(self.stopped_ranks),
            "log_dir": self.log_dir,
            **extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FailureReport:
        root = Failure.from_json(data.get("root_cause") or {})
        return cls(
            run_id=str(data.get("run_id") or ""),
            exit_code=data.get("exit_code"),
            summary=str(data.get("summary") or ""),
            root_cause=root,
            failures=tuple(Failure.from_json(f) for f in data.get("failures") or [root.to_json()]),
            stopped_ranks=tuple(data.get("stopped_ranks") or ()),
            log_dir=data.get("log_dir"),
            reason=str(data.get("reason") or REASON_RANK_FAILED),
            warnings=tuple(str(w) for w in data.get("warnings") or ()),
        )
