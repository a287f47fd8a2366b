"""Worker events (`zlaunch/wire/events.py`): every kind round-trips through its JSON object
and its line on the events fd, and every malformed field is refused with the kind and the
field named; whatever an object is, ``accept`` gives events, never an exception."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlaunch.wire import events, frames

_TEXT = st.text(max_size=8)
_PID = st.none() | st.integers(1, 2**22)
_COUNT = st.integers(0, 2**53)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | _FLOAT | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_METRIC_VALUES = st.dictionaries(st.sampled_from(["loss", "lr", "val_loss", "tflops"]), _FLOAT)
BUILDS = {
    events.RuntimeReady: st.builds(events.RuntimeReady),
    events.Metrics: st.builds(
        events.Metrics, _COUNT, st.sampled_from(["engine", "user"]), _METRIC_VALUES
    ),
    events.StepBusy: st.builds(
        events.StepBusy,
        _COUNT,
        st.lists(_FLOAT, max_size=4),
        st.none() | st.lists(_FLOAT, max_size=4),
    ),
    events.StacksReady: st.builds(events.StacksReady, _PID, st.none() | st.just("thread")),
    events.StacksDumped: st.builds(events.StacksDumped, _PID),
    events.Collectives: st.builds(
        events.Collectives, st.lists(_JSON, max_size=3), _FLOAT, st.none() | _TEXT
    ),
    events.CollectiveMismatch: st.builds(
        events.CollectiveMismatch,
        st.dictionaries(_TEXT, _JSON, max_size=3),
        st.dictionaries(_TEXT, _JSON, max_size=3),
    ),
    events.ProcessGroup: st.builds(
        events.ProcessGroup, _COUNT, st.booleans(), st.none() | st.integers(0, 64)
    ),
    events.SaveAck: st.builds(events.SaveAck),
    events.SaveReady: st.builds(events.SaveReady),
    events.Checkpoint: st.builds(
        events.Checkpoint,
        st.sampled_from(events.CHECKPOINT_STATES),
        st.none() | _COUNT,
        st.booleans(),
    ),
    events.Invalid: st.builds(events.Invalid, _TEXT, st.none() | _TEXT, st.booleans()),
}
ANY_EVENT = st.one_of(*BUILDS.values())


def test_every_kind_is_built_by_the_round_trip_strategy():
    assert set(BUILDS) == set(events.EVENT_TYPES.values())


@settings(max_examples=400, deadline=None)
@given(ANY_EVENT)
def test_every_kind_round_trips_through_its_object_and_its_line(event):
    obj = events.encode(event)
    assert obj["kind"] == event.KIND
    assert events.decode(obj) == event
    assert events.decode(json.loads(events.line(event))) == event
    assert events.accept(obj) == [event]


@settings(max_examples=200, deadline=None)
@given(st.lists(ANY_EVENT, max_size=4))
def test_an_event_frame_carries_typed_events_both_ways(found):
    frame = frames.Event(3, found)
    assert frames.decode(frames.encode(frame)) == frame


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        ([1], "an event must be a JSON object"),
        ({"step": 1}, 'an event without a "kind"'),
        ({"kind": 7}, 'an event without a "kind"'),
        ({"kind": "nope"}, "unknown event kind 'nope'"),
        ({"kind": "step_busy", "busy": [1.0]}, "step_busy event: field 'step' is missing"),
        ({"kind": "step_busy", "step": -1, "busy": []}, "field 'step' must be a count"),
        ({"kind": "step_busy", "step": True, "busy": []}, "field 'step' must be a count"),
        ({"kind": "step_busy", "step": 1, "busy": [1, "x"]}, "field 'busy' must be a list of numbers"),
        ({"kind": "step_busy", "step": 1, "busy": [1e400]}, "field 'busy' must be a list of numbers"),
        ({"kind": "step_busy", "step": 1, "busy": [1], "waited": 2}, "field 'waited' must be a list of numbers (finite) or null"),
        ({"kind": "stacks_ready", "pid": "12"}, "stacks_ready event: field 'pid' must be an integer or null"),
        ({"kind": "stacks_ready", "pid": 1, "dumper": 3}, "field 'dumper' must be a string or null"),
        ({"kind": "stacks_dumped", "pid": 1.5}, "stacks_dumped event: field 'pid'"),
        ({"kind": "collectives"}, "collectives event: field 'records' is missing"),
        ({"kind": "collectives", "records": {}}, "field 'records' must be a list, not an object"),
        ({"kind": "collectives", "records": [], "written": "now"}, "field 'written' must be a number"),
        ({"kind": "collectives", "records": [], "unreadable": 1}, "field 'unreadable' must be a string"),
        ({"kind": "collective_mismatch", "mine": [], "peers": {}}, "field 'mine' must be an object"),
        ({"kind": "collective_mismatch", "mine": {}}, "field 'peers' is missing"),
        ({"kind": "process_group"}, "process_group event: field 'size' is missing"),
        ({"kind": "process_group", "size": 2, "accelerate": 1}, "field 'accelerate' must be true or false"),
        ({"kind": "process_group", "size": 2, "accelerate_processes": "2"}, "field 'accelerate_processes'"),
        ({"kind": "checkpoint", "state": "done"}, "checkpoint event: field 'state' must be 'saving' or 'saved' or 'failed'"),
        ({"kind": "checkpoint", "state": "saved", "step": "3"}, "field 'step' must be a count"),
        ({"kind": "checkpoint", "state": "saved", "requested": False}, "field 'requested' must be true"),
        ({"kind": "invalid"}, "invalid event: field 'text' is missing"),
        ({"kind": "metrics"}, "metrics event: step None is not a count"),
        ({"kind": "metrics", "step": 1, "source": "me"}, "metrics event: source 'me' is not"),
    ],
)  # fmt: skip
def test_a_malformed_field_is_refused_naming_the_kind_and_the_field(obj, said):
    with pytest.raises(events.EventError) as err:
        events.decode(obj)
    assert said in str(err.value)
    (invalid,) = events.accept(obj)  # what the agent and the controller do with it
    assert isinstance(invalid, events.Invalid) and said in invalid.text
    kind = obj.get("kind") if isinstance(obj, dict) else None
    assert invalid.about == (kind if isinstance(kind, str) else None)


def test_a_metrics_event_keeps_its_good_fields_and_says_the_bad_ones():
    obj = {"kind": "metrics", "step": 5, "loss": 2.0, "samples": -3, "memory_kind": 7}
    kept, said = events.accept(obj)
    assert kept == events.Metrics(5, "engine", {"loss": 2.0})
    assert said.about == "metrics" and said.kept
    assert "samples -3 is not a count" in said.text and "memory_kind 7" in said.text


def test_a_frame_keeps_its_good_events_beside_a_refused_one():
    raw = b'{"t":"event","r":1,"e":[{"kind":"save_ack"},5,{"kind":"save_ready"}]}'
    frame = frames.decode(raw)
    assert frame.events[0] == events.SaveAck() and frame.events[2] == events.SaveReady()
    assert frame.events[1] == events.Invalid("an event must be a JSON object")


def test_emit_writes_one_line_and_says_when_nobody_listens():
    read_fd, write_fd = os.pipe()
    try:
        assert events.emit(write_fd, events.Checkpoint("saved", 4, requested=True))
        assert events.emit_to({"ZLAUNCH_EVENTS_FD": str(write_fd)}, events.SaveAck())
        os.close(write_fd)
        data = os.read(read_fd, 1 << 16)
    finally:
        os.close(read_fd)
    assert data.splitlines() == [
        b'{"kind": "checkpoint", "state": "saved", "step": 4, "requested": true}',
        b'{"kind": "save_ack"}',
    ]
    assert not events.emit(None, events.SaveAck())
    assert not events.emit_to({}, events.SaveAck())
