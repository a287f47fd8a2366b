"""Worker events: what a rank tells the controller besides its output (stdlib only).

A worker (its boot, the runtime, anything it runs) writes one JSON object per line on the
events fd (``ZLAUNCH_EVENTS_FD``); its agent decodes each line into one of the records below
and forwards them in an EVENT frame, and the controller decodes them again from the frame. The
kind is in ``"kind"``; every other key is a field of that kind. Each kind is a frozen
dataclass (its fields carry the wire keys); :func:`emit` writes one, :func:`encode` gives its
JSON object and :func:`decode` is the only way back, checked field by field as the frames are
(`zlaunch/wire/records.py`): an unknown kind, a missing field or one of the wrong type raises
:class:`EventError` naming the kind and the field. Keys a kind does not know are ignored.

:func:`accept` is what both ends do with an object from a worker: it never raises, a refused
object becomes an :class:`Invalid` event that says why, which the controller notes. A metrics
event is decoded by the metrics check (`zlaunch/wire/metrics_check.py`): a bad field is left
out and said, a bad ``step`` or ``source`` refuses the whole event.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union, get_args

from zlaunch.wire import records as rec  # "records" is a field of Collectives
from zlaunch.wire.metrics_check import checked_metrics
from zlaunch.wire.protocol import (
    CHECKPOINT_EVENT,
    COLLECTIVE_MISMATCH,
    COLLECTIVES_EVENT,
    EVENTS_FD_ENV,
    INVALID_EVENT,
    METRICS_EVENT,
    PROCESS_GROUP_EVENT,
    RUNTIME_READY,
    SAVE_ACK_EVENT,
    SAVE_READY_EVENT,
    STACKS_DUMPED,
    STACKS_READY,
    STEP_BUSY_EVENT,
)

__all__ = [
    "EventError",
    "WorkerEvent",
    "EVENT_TYPES",
    "RuntimeReady",
    "Metrics",
    "StepBusy",
    "StacksReady",
    "StacksDumped",
    "Collectives",
    "CollectiveMismatch",
    "ProcessGroup",
    "SaveAck",
    "SaveReady",
    "Checkpoint",
    "CHECKPOINT_STATES",
    "Invalid",
    "encode",
    "line",
    "emit",
    "emit_to",
    "decode",
    "accept",
]


class EventError(ValueError):
    """An object from a worker that is not an event: no kind, an unknown one, a field missing
    or mistyped. ``kind`` is the kind it claimed (None when it claimed none)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


# ---- the kinds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuntimeReady:
    """``runtime.initialize`` finished: the rank's hang watch counts from here (set-up takes
    as long as it takes)."""

    KIND: ClassVar[str] = RUNTIME_READY


_ROW_META = ("kind", "source", "step")


@dataclass(frozen=True, slots=True)
class Metrics:
    """One row of step metrics (`runtime/observe/metrics.py`) or of a script's own values
    (``source`` "user"). ``values``: every other field, as the metrics check kept it;
    ``dropped``: why the check left fields out (found on decode, never on the wire)."""

    KIND: ClassVar[str] = METRICS_EVENT
    step: int
    source: str = "engine"
    values: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Metrics:
        """From a flat row (``kind``, ``source``, ``step`` and the values), as the runtime
        builds it; the decoder checks it where it arrives."""
        values = {k: v for k, v in row.items() if k not in _ROW_META}
        return cls(row["step"], row.get("source", "engine"), values)

    def row(self) -> dict[str, Any]:
        """The flat row ``metrics.jsonl``, the panel and the plain line read."""
        return {"kind": self.KIND, "source": self.source, "step": self.step, **self.values}


@dataclass(frozen=True, slots=True)
class StepBusy:
    """A rank's own seconds of ``step`` and the steps after it, one number each (wall time
    less the time it waited for its peers), scored by `zlaunch/launcher/stragglers.py`."""

    KIND: ClassVar[str] = STEP_BUSY_EVENT
    step: int = rec.wire("step", rec.COUNT)
    busy: list[float] = rec.wire("busy", rec.NUMBER_LIST)
    waited: list[float] | None = rec.wire(
        "waited", rec.nullable(rec.NUMBER_LIST), omit_default=True, default=None
    )
    """Of each step, the seconds the rank waited for its peers in collectives (None: a
    runtime that does not say; the rank is then scored on its own times alone)."""


@dataclass(frozen=True, slots=True)
class StacksReady:
    """Process ``pid`` dumps its stacks on the stacks signal from now on (from its stacks
    thread when ``dumper`` is "thread"); no pid: the worker itself."""

    KIND: ClassVar[str] = STACKS_READY
    pid: int | None = rec.wire("pid", rec.nullable(rec.INT), default=None)
    dumper: str | None = rec.wire("dumper", rec.nullable(rec.STR), omit_default=True, default=None)


@dataclass(frozen=True, slots=True)
class StacksDumped:
    """Process ``pid``'s stacks thread wrote its dump on stderr."""

    KIND: ClassVar[str] = STACKS_DUMPED
    pid: int | None = rec.wire("pid", rec.nullable(rec.INT), default=None)


@dataclass(frozen=True, slots=True)
class Collectives:
    """A rank's recent collective records, read by its agent from the rank's file; each record
    is checked where it is used (`zlaunch/launcher/hang_records.py`). ``unreadable``: why the
    agent refused the file (then no records)."""

    KIND: ClassVar[str] = COLLECTIVES_EVENT
    records: list[Any] = rec.wire("records", rec.JSON_LIST)
    written: float = rec.wire("written", rec.NUMBER, default=0.0)
    unreadable: str | None = rec.wire(
        "unreadable", rec.nullable(rec.STR), omit_default=True, default=None
    )


@dataclass(frozen=True, slots=True)
class CollectiveMismatch:
    """A rank found its peers in another collective at its position: its own record and a
    few peers' (by rank, as text: JSON keys)."""

    KIND: ClassVar[str] = COLLECTIVE_MISMATCH
    mine: dict[str, Any] = rec.wire("mine", rec.JSON_OBJECT)
    peers: dict[str, Any] = rec.wire("peers", rec.JSON_OBJECT)


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """As the script ends: the largest default process group the rank joined (0: none), and
    whether accelerate was loaded and how many processes it counted."""

    KIND: ClassVar[str] = PROCESS_GROUP_EVENT
    size: int = rec.wire("size", rec.COUNT)
    accelerate: bool = rec.wire("accelerate", rec.BOOL, default=False)
    accelerate_processes: int | None = rec.wire(
        "accelerate_processes", rec.nullable(rec.INT), default=None
    )


@dataclass(frozen=True, slots=True)
class SaveAck:
    """The runtime heard the save signal and will save at the next step boundary (so the
    controller does not say that nobody handles it)."""

    KIND: ClassVar[str] = SAVE_ACK_EVENT


@dataclass(frozen=True, slots=True)
class SaveReady:
    """The rank listens for the save signal from now on: a preemption notice may be answered
    by a save instead of a stop."""

    KIND: ClassVar[str] = SAVE_READY_EVENT


CHECKPOINT_STATES = ("saving", "saved", "failed")
_STATE = rec.FieldType(" or ".join(map(repr, CHECKPOINT_STATES)), lambda v: v in CHECKPOINT_STATES)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint the rank writes: being written, complete or failed; ``requested``: the
    save signal asked for it."""

    KIND: ClassVar[str] = CHECKPOINT_EVENT
    state: str = rec.wire("state", _STATE)
    step: int | None = rec.wire("step", rec.nullable(rec.COUNT), default=None)
    requested: bool = rec.wire("requested", rec.TRUE, omit_default=True, default=False)


@dataclass(frozen=True, slots=True)
class Invalid:
    """What the agent (or the controller) puts in place of an object it refused, and says.

    ``text`` says why (and holds the start of a line that was not JSON); ``about`` is the kind
    the object claimed, when it claimed one; ``kept``: the event was kept without the fields
    named (a metrics event)."""

    KIND: ClassVar[str] = INVALID_EVENT
    text: str = rec.wire("text", rec.STR)
    about: str | None = rec.wire("about", rec.nullable(rec.STR), omit_default=True, default=None)
    kept: bool = rec.wire("kept", rec.TRUE, omit_default=True, default=False)


WorkerEvent = Union[
    RuntimeReady,
    Metrics,
    StepBusy,
    StacksReady,
    StacksDumped,
    Collectives,
    CollectiveMismatch,
    ProcessGroup,
    SaveAck,
    SaveReady,
    Checkpoint,
    Invalid,
]
EVENT_TYPES: dict[str, type[WorkerEvent]] = {cls.KIND: cls for cls in get_args(WorkerEvent)}

# ---- to and from JSON -----------------------------------------------------------------------

_KIND_CHARS = 40  # how much of an unknown kind a message repeats


def encode(event: WorkerEvent) -> dict[str, Any]:
    """The event's JSON object, its kind in ``"kind"``."""
    if isinstance(event, Metrics):
        return event.row()
    return {"kind": event.KIND, **rec.dump(event)}


def line(event: WorkerEvent, default: Callable[[Any], Any] | None = None) -> bytes:
    """The event as one line of the events fd. ``default`` turns what JSON cannot say into
    what it can (the runtime's one-element tensors); NaN and infinity are written as JSON's
    common extension, which the decoders read: a diverged loss is news."""
    return (json.dumps(encode(event), default=default) + "\n").encode()


def emit(fd: int | None, event: WorkerEvent, default: Callable[[Any], Any] | None = None) -> bool:
    """Write the event on the events fd ``fd``; False when there is none or it is gone (no
    agent to tell: the caller goes on). One write of a line under PIPE_BUF is atomic, so the
    events of a rank's processes never interleave."""
    if fd is None:
        return False
    try:
        os.write(fd, line(event, default))
    except OSError:
        return False
    return True


def emit_to(environ: Mapping[str, str], event: WorkerEvent) -> bool:
    """:func:`emit` on the events fd that ``environ`` names (``ZLAUNCH_EVENTS_FD``)."""
    raw = environ.get(EVENTS_FD_ENV, "")
    return emit(int(raw) if raw.isdigit() else None, event)


def decode(obj: Any) -> WorkerEvent:
    """One event from its JSON object, checked field by field (a metrics event by the
    metrics check: its bad fields are left out and said in ``dropped``)."""
    if not isinstance(obj, dict):
        raise EventError("an event must be a JSON object")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise EventError('an event without a "kind"')
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise EventError(f"unknown event kind {kind[:_KIND_CHARS]!r}", kind[:_KIND_CHARS])
    if cls is Metrics:
        return _metrics(obj)
    try:
        return rec.load(cls, obj, "")
    except rec.FieldError as err:
        raise EventError(f"{kind} event: {err}", kind) from None


def _metrics(obj: dict[str, Any]) -> Metrics:
    verdict = checked_metrics(obj)
    if verdict.row is None:
        raise EventError(f"{METRICS_EVENT} event: {'; '.join(verdict.problems)}", METRICS_EVENT)
    kept = Metrics.of_row(verdict.row)
    return Metrics(kept.step, kept.source, kept.values, verdict.problems)


def accept(obj: Any) -> list[WorkerEvent]:
    """What an object from a worker stands for, never raising: its event; an Invalid event in
    its place when it is refused; a metrics event kept without bad fields followed by the
    Invalid event that names them."""
    try:
        event = decode(obj)
    except EventError as err:
        return [Invalid(str(err), err.kind)]
    if isinstance(event, Metrics) and event.dropped:
        said = Invalid("; ".join(event.dropped), METRICS_EVENT, kept=True)
        return [Metrics(event.step, event.source, event.values), said]
    return [event]
