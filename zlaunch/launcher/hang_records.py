"""A rank's collective records as the controller takes them: each one checked, a bad one dropped
and said (pure).

The records come from a file the rank itself writes (zlaunch/worker/collective_records.py), so they
are whatever the rank, or anything it runs, put there: ``{"records": [1]}`` crashed the hang
report with a raw TypeError and no failure.json was written. `decode_records` keeps each record
whose every field has its type and bound and drops the others, saying which and why; the hang
report and `zlaunch stacks` (zlaunch/launcher/hang_suspect.py) then read only well-formed
records, field by field as the writer's `normalize` documents them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Decoded", "MAX_RECORDS", "decode_records", "record_problem"]

MAX_RECORDS = 4096
"""Records taken from one rank (16 per group: 256 groups); the newest are kept."""
_MAX_TEXT = 256  # a group name, an operation, a dtype
_MAX_RANKS = 1 << 20  # a group's ranks
_MAX_TENSORS = 1024  # tensors of one collective
_MAX_DIMS = 16  # dimensions of one tensor
_STATES = ("issued", "completed")


@dataclass(frozen=True)
class Decoded:
    """The well-formed records, oldest first, and what was dropped (empty when nothing)."""

    records: list[dict[str, Any]]
    problems: tuple[str, ...] = ()
    dropped: int = 0

    def note(self, rank: int) -> str | None:
        """One sentence for the console, or None when every record was kept."""
        if not self.dropped:
            return None
        shown = "; ".join(self.problems[:3]) + ("; ..." if len(self.problems) > 3 else "")
        return (
            f"rank {rank} sent {self.dropped} collective record(s) zlaunch cannot read, left "
            f"out of the hang report ({shown})"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _is_int(value) and 0 <= value < 1 << 63


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= _MAX_TEXT


def _ranks(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= _MAX_RANKS and all(map(_count, value))


def _shape(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= _MAX_DIMS and all(map(_count, value))


def _sizes(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= _MAX_TENSORS and all(map(_shape, value))


def _dtypes(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= _MAX_TENSORS and all(map(_text, value))


def _time(value: Any) -> bool:
    if _is_int(value):
        return abs(value) < 1e15
    return isinstance(value, float) and math.isfinite(value)


# field -> (what it must be, the check, its value when absent: None = required)
_FIELDS: dict[str, tuple[str, Callable[[Any], bool], Any]] = {
    "group": (f"a name of at most {_MAX_TEXT} characters", _text, None),
    "desc": (f"a text of at most {_MAX_TEXT} characters", _text, ""),
    "ranks": ("a list of ranks", _ranks, []),
    "seq": ("a count", _count, None),
    "op": (f"a name of at most {_MAX_TEXT} characters", _text, None),
    "sizes": ("a list of tensor shapes", _sizes, []),
    "dtypes": ("a list of dtype names", _dtypes, []),
    "state": ("issued or completed", lambda v: v in _STATES, None),
    "time": ("seconds since the epoch", _time, 0.0),
}


def record_problem(raw: Any) -> str | None:
    """Why ``raw`` is not a collective record, or None when it is one."""
    if not isinstance(raw, dict):
        return f"not an object but {type(raw).__name__}"
    for key, (what, check, default) in _FIELDS.items():
        if key not in raw:
            if default is None:
                return f"no {key}"
            continue
        if not check(raw[key]):
            return f"{key} is not {what}"
    return None


def decode_records(raw: Any) -> Decoded:
    """The records of one rank's ``collectives`` event (its ``records`` value): each kept with
    exactly the known fields (defaults filled in), or dropped and said."""
    if not isinstance(raw, list):
        return Decoded([], (f"records are not a list but {type(raw).__name__}",), 1)
    problems: list[str] = []
    dropped = 0
    if len(raw) > MAX_RECORDS:
        problems.append(f"{len(raw) - MAX_RECORDS} beyond the {MAX_RECORDS} newest")
        dropped += len(raw) - MAX_RECORDS
        raw = raw[-MAX_RECORDS:]
    records = []
    for index, item in enumerate(raw):
        why = record_problem(item)
        if why is not None:
            dropped += 1
            if len(problems) < 8:
                problems.append(f"record {index}: {why}")
            continue
        records.append({key: item.get(key, spec[2]) for key, spec in _FIELDS.items()})
    return Decoded(records, tuple(problems), dropped)
