"""run.json as the readers see it: checked field by field (pure, stdlib).

One table of fields (``_FIELDS``) serves both sides: the controller's writer passes every
record through :func:`writable_run_record` (``RunDir.write_record``), which refuses a field
the table does not know or a value its readers would drop, so nothing is written that a
reader cannot read back; the readers pass what they read through :func:`checked_run_record`.

run.json is valid JSON written by the controller, but a reader (``zlaunch ls``, ``logs``,
``status``, ``stop``, ``stacks``) may meet a file an older version, a crashed disk or a person
changed: ``{}``, ``[]``, ``"hosts": [1]``, a NaN or 1e20 ``start_time``. A file that is not an
object is a bad run: RunRecordError, which the listing skips and reports. Any other field of a
wrong type or range is left out (the readers then show ``-`` for it) and named in
``problems``. The fields are the ones the controller writes (zlaunch/rundir/recorder.py,
zlaunch/rundir/layout.py ``plan_record``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["RunRecordError", "checked_run_record", "writable_run_record", "MAX_TIME"]

# A wall-clock time beyond year 5000 is not a time a run started: datetime cannot show it.
MAX_TIME = 95_617_584_000.0


class RunRecordError(ValueError):
    """run.json is not a run's record at all (not an object)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: Any) -> bool:
    if _is_int(value):
        return 0 <= value <= MAX_TIME  # compared as an integer: float() of 10**400 overflows
    return isinstance(value, float) and math.isfinite(value) and 0 <= value <= MAX_TIME


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(test(item) for item in value)


def _is_worker(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _is_int(value.get("rank"))
        and value["rank"] >= 0
        and _is_int(value.get("local_rank"))
        and _list_of(_is_str)(value.get("argv", []))
    )


def _is_node(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _is_str(value.get("host"))
        and _list_of(_is_worker)(value.get("workers", []))
    )


def _is_plan(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and (value.get("world_size") is None or _is_int(value["world_size"]))
        and _list_of(_is_node)(value.get("nodes", []))
    )


def _is_attempt(value: Any) -> bool:
    return isinstance(value, dict) and _is_int(value.get("attempt"))


def _is_warning(value: Any) -> bool:
    return isinstance(value, dict) and _is_int(value.get("attempt")) and _is_str(value.get("text"))


# field -> (what it must be, test); None is accepted for every field
_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "run_id": ("a string", _is_str),
    "status": ("a string", _is_str),
    "controller_pid": ("a pid", lambda v: _is_int(v) and 0 < v < 2**31),
    "controller": ("an object", lambda v: isinstance(v, dict)),
    "start_time": ("a time", _is_time),
    "end_time": ("a time", _is_time),
    "exit_code": ("an exit code", lambda v: _is_int(v) and -(2**31) <= v < 2**31),
    "error": ("a string", _is_str),
    "config": ("a path", _is_str),
    "cwd": ("a path", _is_str),
    "hosts": ("a list of host names", _list_of(_is_str)),
    "program": ("a list of strings", _list_of(_is_str)),
    "checkpoint_dir": ("a path", _is_str),
    "save_on": ("a signal name", _is_str),
    "plan": ("a plan (nodes of workers)", _is_plan),
    "attempts": ("a list of attempts", _list_of(_is_attempt)),
    "warnings": ("a list of attempts' warnings", _list_of(_is_warning)),
}


def checked_run_record(data: Any, run_id: str) -> tuple[dict[str, Any], list[str]]:
    """The record with every bad field left out, and what was wrong. ``run_id`` is the run
    directory's name: the record's own ``run_id`` is only what the file says."""
    if not isinstance(data, dict):
        raise RunRecordError(f"run.json of {run_id} is not a JSON object")
    record: dict[str, Any] = {}
    problems = []
    for key, value in data.items():
        rule = _FIELDS.get(key)
        if rule is None or value is None or rule[1](value):
            record[key] = value
        else:
            problems.append(f"{key} is not {rule[0]}")
    record["run_id"] = run_id
    return record, problems


def writable_run_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record, if every field is one the readers know and holds what they accept.

    A ValueError otherwise: the controller is about to write a field its own readers would
    drop or never look for, which is a bug in the controller, not a user's mistake.
    """
    wrong = []
    for key, value in record.items():
        rule = _FIELDS.get(key)
        if rule is None:
            wrong.append(f"{key} is not a field of run.json (zlaunch/rundir/run_record.py)")
        elif value is not None and not rule[1](value):
            wrong.append(f"{key} is not {rule[0]}: {value!r:.80}")
    if wrong:
        raise ValueError("the controller would write run.json with " + "; ".join(wrong))
    return record
