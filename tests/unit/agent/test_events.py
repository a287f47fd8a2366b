"""What a rank writes to its events fd, as the agent parses it (`zlaunch/agent/events.py`):
anything becomes an event or an `invalid` one, its nesting bounded, never an exception."""

from __future__ import annotations

import json

import pytest

from zlaunch.agent.events import MAX_EVENT_DEPTH, parse_event
from zlaunch.wire import frames, protocol


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"kind": "x", "deep": ' + b"[" * 900 + b"]" * 900 + b"}",
    ],
    ids=["open-brackets", "closed-brackets", "nested-objects", "under-the-stack-limit"],
)
def test_deeply_nested_events_become_invalid_events_never_an_exception(raw):
    event = parse_event(raw)
    assert event["kind"] == protocol.INVALID_EVENT
    assert f"nested deeper than {MAX_EVENT_DEPTH} levels" in event["text"]
    frames.encode(frames.Event(0, [event]))  # and the frame carrying it encodes


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_an_event_that_is_not_an_object_is_invalid(raw):
    assert parse_event(raw) == {
        "kind": protocol.INVALID_EVENT,
        "text": f"event not a JSON object ({len(raw)} bytes): {raw.decode()}",
    }


def test_a_nested_event_within_the_bound_passes_unchanged():
    value: object = 1
    for _ in range(MAX_EVENT_DEPTH - 1):
        value = [value]
    raw = json.dumps({"kind": "x", "v": value}).encode()
    assert parse_event(raw) == json.loads(raw)
