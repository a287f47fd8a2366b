"""One line a worker wrote to its events fd -> the event the agent forwards (stdlib only).

The events fd is inherited by everything a worker starts, so a line on it may be anything: not
JSON, JSON that is not an object, or an object nested deeply enough that decoding or encoding
it again overflows the interpreter's stack (``"[" * 100000`` raised RecursionError, which
killed the agent and cost the job a healthy host). Whatever the line is, the agent forwards
typed events (`zlaunch/wire/events.py`): the event the line holds when it is a JSON object nested at
most MAX_EVENT_DEPTH deep that decodes as one, else an ``invalid`` event that says why (and
holds the start of the line when it was not JSON).
"""

from __future__ import annotations

import json
from typing import Any

from zlaunch.wire import events, frames

__all__ = ["parse_event", "MAX_EVENT_DEPTH", "INVALID_TEXT_CHARS"]

# Events are flat records (metrics, readiness); 16 levels leave room for any structure a
# script means to send and stay far below the interpreter's recursion limit on both ends.
MAX_EVENT_DEPTH = 16
# How much of a refused line the invalid event keeps (it shows up in the controller's note).
INVALID_TEXT_CHARS = 4096


def parse_event(raw: bytes) -> list[events.WorkerEvent]:
    """The event ``raw`` (one line, no newline) holds, or an ``invalid`` event saying why not
    (after a metrics event kept without its bad fields: the one that names them)."""
    try:
        event = json.loads(raw)
    except RecursionError:
        return _invalid(raw, f"nested deeper than {MAX_EVENT_DEPTH} levels")
    except ValueError:  # not JSON, bad UTF-8, an integer of too many digits
        return _invalid(raw, None)
    if not isinstance(event, dict):
        return _invalid(raw, "not a JSON object")
    if _deeper_than(event, MAX_EVENT_DEPTH):
        return _invalid(raw, f"nested deeper than {MAX_EVENT_DEPTH} levels")
    return events.accept(event)


def _invalid(raw: bytes, why: str | None) -> list[events.WorkerEvent]:
    text = frames.line_text(raw[:INVALID_TEXT_CHARS])
    if why is not None:
        text = f"event {why} ({len(raw)} bytes): {text}"
    return [events.Invalid(text)]


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` deep; iterative, so no depth can overflow."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
