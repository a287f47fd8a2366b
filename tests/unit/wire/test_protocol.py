"""Framing between controller and agents: typed frames, exact round trips, validation on
decode, chunk boundaries, odd bytes."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.wire.test_events import ANY_EVENT
from zlaunch.wire import events, frames, protocol

WORKER = frames.WorkerSpec(rank=1, local_rank=0, argv=["python", "-u", "t.py"], env={"A": "b"})
# One frame of every kind, and its exact bytes on the wire (the JSON keys the agent and the
# controller of another zlaunch version read).
FRAMES = [
    (
        frames.Hello("n1", 42, "/usr/bin/python3", "10.0.0.2", "10.0.0.1", 29500),
        b'{"t":"hello","hostname":"n1","pid":42,"python":"/usr/bin/python3",'
        b'"addr":"10.0.0.2","client_addr":"10.0.0.1","port":29500}',
    ),
    (frames.Out(3, "e", ["a", ""]), b'{"t":"out","r":3,"s":"e","l":["a",""]}'),
    (frames.Out(3, "o", ["a"], True), b'{"t":"out","r":3,"s":"o","l":["a"],"p":true}'),
    (frames.Started(2, 99), b'{"t":"started","r":2,"pid":99}'),
    (frames.Exited(2, 99, 3, None), b'{"t":"exited","r":2,"pid":99,"code":3,"signal":null}'),
    (frames.Exited(2, None, None, 9), b'{"t":"exited","r":2,"pid":null,"code":null,"signal":9}'),
    (frames.Event(0, [events.Metrics(1), events.SaveAck()]), b'{"t":"event","r":0,"e":[{"kind":"metrics","source":"engine","step":1},{"kind":"save_ack"}]}'),
    (frames.Error("no route"), b'{"t":"error","msg":"no route"}'),
    (frames.Error("cut off", protocol.CAUSE_NO_HEARTBEAT), b'{"t":"error","msg":"cut off","cause":"no_heartbeat"}'),
    (frames.Bye(), b'{"t":"bye"}'),
    (
        frames.Spec(cwd="/w", master_addr="n1", grace=5.0, heartbeat_timeout=15.0, env={"S": "1"}, workers=[WORKER]),
        b'{"t":"spec","cwd":"/w","master_addr":"n1","grace":5.0,"heartbeat_timeout":15.0,"env":{"S":"1"},'
        b'"workers":[{"rank":1,"local_rank":0,"argv":["python","-u","t.py"],"env":{"A":"b"}}]}',
    ),
    (frames.Heartbeat(), b'{"t":"hb"}'),
    (frames.Stop(2.5), b'{"t":"stop","grace":2.5}'),
    (frames.Signal(10), b'{"t":"signal","sig":10}'),
    (frames.Signal(37, [0, 2]), b'{"t":"signal","sig":37,"ranks":[0,2]}'),
]  # fmt: skip


@pytest.mark.parametrize(("frame", "wire"), FRAMES, ids=lambda f: getattr(f, "KIND", None))
def test_every_kind_round_trips_through_its_exact_wire_bytes(frame, wire):
    assert frames.encode(frame) == wire + b"\n"
    assert frames.decode(wire) == frame
    assert type(frames.decode(wire)) is type(frame)


def test_every_kind_is_in_the_table():
    assert {type(frame).KIND for frame, _ in FRAMES} == set(frames.FRAME_TYPES)


def test_frame_round_trip_is_one_line():
    frame = frames.Out(3, protocol.STDERR, ["a", "", "ü ∑ \t x"])
    data = frames.encode(frame)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert frames.decode(data) == frame


def test_non_utf8_output_survives_byte_for_byte():
    raw = b"\xff\xfe bad \xc3 utf8 \x00 nul \xe2\x82\xac"
    frame = frames.Out(0, "o", [frames.line_text(raw)])
    back = frames.decode(frames.encode(frame))
    assert frames.line_bytes(back.lines[0]) == raw


def test_optional_fields_may_be_absent_and_unknown_keys_are_ignored():
    spec = frames.decode(b'{"t":"spec","grace":1,"heartbeat_timeout":2,"workers":'
                           b'[{"rank":0,"local_rank":0,"argv":["x"]}],"later":1}')  # fmt: skip
    assert spec == frames.Spec(grace=1.0, heartbeat_timeout=2.0, workers=[
        frames.WorkerSpec(0, 0, ["x"])])  # fmt: skip
    assert isinstance(spec.grace, float)
    assert frames.decode(b'{"t":"signal","sig":2,"ranks":null}') == frames.Signal(2)


@pytest.mark.parametrize(
    ("exited", "code", "signal", "exit_code"),
    [
        (frames.Exited.of_returncode(1, 7, 0), 0, None, 0),
        (frames.Exited.of_returncode(1, 7, 3), 3, None, 3),
        (frames.Exited.of_returncode(1, 7, -9), None, 9, 137),
        (frames.Exited.of_returncode(1, None, 127), 127, None, 127),
    ],
)
def test_exited_from_a_popen_return_code(exited, code, signal, exit_code):
    assert (exited.code, exited.signal, exited.exit_code) == (code, signal, exit_code)


@pytest.mark.parametrize("bad", [b"not json", b"[1, 2]", b'{"x": 1}', b'{"t": 5}'])
def test_malformed_frames_raise_protocol_error(bad):
    with pytest.raises(frames.ProtocolError):
        frames.decode(bad)


@pytest.mark.parametrize(
    ("wire", "names"),
    [
        ({"t": "nope"}, ["unknown frame kind", "'nope'"]),
        ({"t": "hello", "hostname": "h", "pid": 1, "python": "p", "addr": None, "port": 1},
         ["hello", "'client_addr'", "missing"]),
        ({"t": "hello", "hostname": "h", "pid": "1", "python": "p", "addr": None,
          "client_addr": None, "port": 1}, ["hello", "'pid'", "an integer", "a string"]),
        ({"t": "out", "r": 0, "s": "x", "l": []}, ["out", "'s'"]),
        ({"t": "out", "r": 0, "s": "o", "l": [1]}, ["out", "'l'", "a list of strings"]),
        ({"t": "out", "r": 0, "s": "o", "l": [], "p": 1}, ["out", "'p'"]),
        ({"t": "out", "r": True, "s": "o", "l": []}, ["out", "'r'", "a boolean"]),
        ({"t": "started", "r": 0}, ["started", "'pid'", "missing"]),
        ({"t": "exited", "r": 0, "pid": None, "code": "3", "signal": None},
         ["exited", "'code'", "an integer or null"]),
        ({"t": "exited", "r": 0, "pid": None, "code": 3}, ["exited", "'signal'", "missing"]),
        ({"t": "event", "r": 0, "e": {}}, ["event", "'e'", "a list"]),
        ({"t": "error"}, ["error", "'msg'", "missing"]),
        ({"t": "error", "msg": "m", "cause": 1}, ["error", "'cause'"]),
        ({"t": "spec", "grace": 1, "heartbeat_timeout": 1}, ["spec", "'workers'", "missing"]),
        ({"t": "spec", "grace": "1", "heartbeat_timeout": 1, "workers": []}, ["spec", "'grace'", "a number"]),
        ({"t": "spec", "grace": 1, "heartbeat_timeout": 1, "workers": [{"rank": 0, "argv": []}]},
         ["spec", "'workers[0].local_rank'", "missing"]),
        ({"t": "spec", "grace": 1, "heartbeat_timeout": 1, "workers": [7]}, ["spec", "workers[0]", "object"]),
        ({"t": "spec", "grace": 1, "heartbeat_timeout": 1, "workers": [], "env": {"A": 1}},
         ["spec", "'env'", "an object of strings"]),
        ({"t": "stop"}, ["stop", "'grace'", "missing"]),
        ({"t": "signal", "sig": 2.0}, ["signal", "'sig'", "an integer", "a number"]),
        ({"t": "signal", "sig": 2, "ranks": ["0"]}, ["signal", "'ranks'"]),
    ],
)  # fmt: skip
def test_decode_names_the_kind_and_the_field_that_is_wrong(wire, names):
    data = json.dumps(wire).encode()
    with pytest.raises(frames.ProtocolError) as err:
        frames.decode(data)
    for name in names:
        assert name in str(err.value)
    assert f"({len(data)} bytes)" in str(err.value)


def test_decode_errors_never_show_the_values():
    data = json.dumps({"t": "spec", "grace": 1, "heartbeat_timeout": 1, "env": {"K": "hunter2"},
                       "workers": [{"rank": 0, "local_rank": "hunter2", "argv": []}]}).encode()  # fmt: skip
    with pytest.raises(frames.ProtocolError) as err:
        frames.decode(data)
    assert "hunter2" not in str(err.value)


_TEXT = st.text(max_size=8)
_INT = st.integers(-(2**31), 2**31)
_OPT_INT = st.none() | _INT
_OPT_TEXT = st.none() | _TEXT
_ENV = st.dictionaries(_TEXT, _TEXT, max_size=3)
_WORKERS = st.lists(st.builds(frames.WorkerSpec, _INT, _INT, st.lists(_TEXT), _ENV), max_size=3)
_NUMBER = st.floats(allow_nan=False, allow_infinity=False)
ANY_FRAME = st.one_of(
    st.builds(frames.Hello, _TEXT, _INT, _TEXT, _OPT_TEXT, _OPT_TEXT, _INT),
    st.builds(frames.Out, _INT, st.sampled_from("oe"), st.lists(_TEXT), st.booleans()),
    st.builds(frames.Started, _INT, _INT),
    st.builds(frames.Exited, _INT, _OPT_INT, _OPT_INT, _OPT_INT),
    st.builds(frames.Event, _INT, st.lists(ANY_EVENT, max_size=3)),
    st.builds(frames.Error, _TEXT, _OPT_TEXT),
    st.builds(frames.Bye),
    st.builds(frames.Spec, cwd=_OPT_TEXT, master_addr=_OPT_TEXT, grace=_NUMBER,
              heartbeat_timeout=_NUMBER, env=_ENV, workers=_WORKERS),
    st.builds(frames.Heartbeat),
    st.builds(frames.Stop, _NUMBER),
    st.builds(frames.Signal, _INT, st.none() | st.lists(_INT, max_size=3)),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(ANY_FRAME)
def test_any_frame_round_trips(frame):
    data = frames.encode(frame)
    assert data.count(b"\n") == 1
    assert frames.decode(data) == frame


def test_line_splitter_never_breaks_or_merges_lines_whatever_the_chunking():
    rng = random.Random(7)
    lines = [f"line {i} " + "x" * rng.randint(0, 300) for i in range(2000)]
    stream = "".join(line + "\n" for line in lines).encode() + b"tail without newline"
    for _ in range(5):
        splitter = frames.LineSplitter()
        got = []
        pos = 0
        while pos < len(stream):
            step = rng.randint(1, 5000)
            got.extend(splitter.feed(stream[pos : pos + step]))
            pos += step
        got.extend(splitter.finish())
        assert got == [line.encode() for line in lines] + [b"tail without newline"]


def test_line_splitter_keeps_empty_lines_and_finish_is_empty_after_newline():
    splitter = frames.LineSplitter()
    assert splitter.feed(b"a\n\n\nb") == [b"a", b"", b""]
    assert splitter.feed(b"\n") == [b"b"]
    assert splitter.finish() == []


def test_frame_reader_handles_frames_split_across_chunks():
    sent = [frames.Heartbeat()] + [frames.Out(i, "o", [str(i)] * i) for i in range(50)]
    data = b"".join(frames.encode(f) for f in sent)
    reader = frames.FrameReader()
    got = []
    for i in range(0, len(data), 7):
        got.extend(reader.feed(data[i : i + 7]))
    got.extend(reader.finish())
    assert got == sent


@pytest.mark.parametrize(
    ("code", "sig", "expected"), [(0, None, 0), (3, None, 3), (None, 9, 137), (None, 15, 143)]
)
def test_exit_code_of_follows_the_shell_convention(code, sig, expected):
    assert frames.exit_code_of(code, sig) == expected


def test_frame_reader_drops_a_mistyped_frame_alone_and_reports_it():
    bad: list[frames.ProtocolError] = []
    reader = frames.FrameReader(on_bad=bad.append)
    data = (
        frames.encode(frames.Heartbeat())
        + b'{"t":"exited","r":0,"pid":null,"code":"3","signal":null}\n'
        + frames.encode(frames.Bye())
    )
    assert list(reader.feed(data)) == [frames.Heartbeat(), frames.Bye()]
    assert len(bad) == 1 and "exited" in str(bad[0]) and "'code'" in str(bad[0])
