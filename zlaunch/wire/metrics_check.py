"""A metrics event from a rank, checked once where the controller accepts it (pure, stdlib).

Events arrive from the events fd, which every child of a worker inherits: a row may hold
anything JSON can say, NaN and 400-digit integers included. Everything downstream (the plain
line, the live panel, ``metrics.jsonl`` and its readers: ``status``, ``plot``) formats these
values as numbers, so they are checked here, field by field, and what is bad is dropped:
the field alone when the row is still a row without it, the whole event when its ``step`` or
``source`` is bad. Readers of ``metrics.jsonl`` pass its rows through the same check, so a row
written before this check existed cannot crash ``zlaunch status`` either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["checked_metrics", "MetricsVerdict", "MAX_STEP", "MAX_TEXT_CHARS"]

MAX_STEP = 2**53  # a step count beyond what a float holds exactly is not a step
MAX_TEXT_CHARS = 200
_FLOAT_MAX = 1e308  # an integer above this overflows float(): division, formats

# Counts: integers (a float that is a whole number is taken as one), never negative.
_COUNTS = frozenset(
    {"samples", "total_steps", "skipped_steps", "memory_bytes", "memory_peak_bytes",
     "comm_bytes", "world_size", "flops_per_step"}
)  # fmt: skip
# Measures that may legitimately be NaN or infinite: a diverged loss is news, not garbage.
_MAY_DIVERGE = frozenset({"loss", "grad_norm", "loss_scale"})
# host and slow (the slow hosts, zlaunch/launcher/stragglers.py): added by the controller
_TEXTS = frozenset({"memory_kind", "peak_source", "straggler", "host", "slow"})
_FLAGS = frozenset({"report"})
_SOURCES = ("engine", "user")


@dataclass(frozen=True)
class MetricsVerdict:
    """``row``: the event with bad fields dropped (None: dropped whole); ``problems``: why."""

    row: dict[str, Any] | None
    problems: tuple[str, ...]


def checked_metrics(event: dict[str, Any]) -> MetricsVerdict:
    """The metrics event ``event`` with every field of a wrong type or range left out."""
    source = event.get("source", "engine")
    if source not in _SOURCES:
        return MetricsVerdict(None, (f"source {_show(source)} is not 'engine' or 'user'",))
    step = event.get("step")
    if not _is_int(step) or not 0 <= step <= MAX_STEP:
        return MetricsVerdict(None, (f"step {_show(step)} is not a count",))
    row: dict[str, Any] = {}
    problems = []
    for key, value in event.items():
        if not isinstance(key, str) or len(key) > MAX_TEXT_CHARS:
            problems.append(f"field name {_show(key)} is too long")
            continue
        why = _problem(key, value, source)
        if why is None:
            row[key] = value
        else:
            problems.append(f"{key} {_show(value)} {why}")
    return MetricsVerdict(row, tuple(problems))


def _problem(key: str, value: Any, source: str) -> str | None:
    """Why ``value`` cannot stand in field ``key``; None when it can."""
    if key in ("kind", "source", "step") or value is None:
        return None
    if key in _TEXTS:
        return None if _is_text(value) else "is not a short text"
    if key in _FLAGS:
        return None if isinstance(value, bool) else "is not true or false"
    if key in _COUNTS:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if _is_int(value) and 0 <= value <= _FLOAT_MAX:
            return None
        return "is not a count"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if source == "user" and _is_text(value):
            return None  # a script may log a short label
        return "is not a number"
    if _is_int(value):
        return None if abs(value) <= _FLOAT_MAX else "is too large"
    if math.isfinite(value) or key in _MAY_DIVERGE or source == "user":
        return None
    return "is not finite"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT_CHARS


def _show(value: Any) -> str:
    """A bad value as a short text (never the whole of a huge one)."""
    if _is_int(value) and abs(value) > 10**30:
        return f"<an integer of {value.bit_length()} bits>"  # str() refuses 4,300+ digits
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
