"""What a rank writes to its events fd, as the agent parses it (`zlaunch/agent/events.py`):
anything becomes an event or an `invalid` one, its nesting bounded, never an exception."""

from __future__ import annotations

import json

import pytest

from zlaunch.agent.events import MAX_EVENT_DEPTH, parse_event
from zlaunch.wire import events, frames


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
    (event,) = parse_event(raw)
    assert isinstance(event, events.Invalid)
    assert f"nested deeper than {MAX_EVENT_DEPTH} levels" in event.text
    frames.encode(frames.Event(0, [event]))  # and the frame carrying it encodes


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_an_event_that_is_not_an_object_is_invalid(raw):
    assert parse_event(raw) == [
        events.Invalid(f"event not a JSON object ({len(raw)} bytes): {raw.decode()}")
    ]


def test_a_nested_event_within_the_bound_passes_unchanged():
    value: object = 1
    for _ in range(MAX_EVENT_DEPTH - 2):
        value = [value]
    mine = {"group": "0", "seq": 3, "nested": value}
    raw = json.dumps({"kind": "collective_mismatch", "mine": mine, "peers": {}}).encode()
    assert parse_event(raw) == [events.CollectiveMismatch(mine, {})]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"a": 1}', 'an event without a "kind"'),
        (b'{"kind": "x"}', "unknown event kind 'x'"),
        (b'{"kind": "step_busy", "step": 1}', "step_busy event: field 'busy' is missing"),
    ],
)
def test_an_object_that_is_not_one_of_our_events_is_refused_and_said(raw, said):
    (event,) = parse_event(raw)
    assert isinstance(event, events.Invalid) and event.text.startswith(said), event
