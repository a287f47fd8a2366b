"""Framing between controller and agents: exact round trips, chunk boundaries, odd bytes."""

import random

import pytest

from zlaunch import protocol


def test_frame_round_trip_is_one_line():
    frame = {"t": protocol.OUT, "r": 3, "s": protocol.STDERR, "l": ["a", "", "ü ∑ \t x"]}
    data = protocol.encode(frame)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert protocol.decode(data) == frame


def test_non_utf8_output_survives_byte_for_byte():
    raw = b"\xff\xfe bad \xc3 utf8 \x00 nul \xe2\x82\xac"
    frame = {"t": protocol.OUT, "r": 0, "s": "o", "l": [protocol.line_text(raw)]}
    back = protocol.decode(protocol.encode(frame))
    assert protocol.line_bytes(back["l"][0]) == raw


@pytest.mark.parametrize("bad", [b"not json", b"[1, 2]", b'{"x": 1}', b'{"t": 5}'])
def test_malformed_frames_raise_protocol_error(bad):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(bad)


def test_line_splitter_never_breaks_or_merges_lines_whatever_the_chunking():
    rng = random.Random(7)
    lines = [f"line {i} " + "x" * rng.randint(0, 300) for i in range(2000)]
    stream = "".join(line + "\n" for line in lines).encode() + b"tail without newline"
    for _ in range(5):
        splitter = protocol.LineSplitter()
        got = []
        pos = 0
        while pos < len(stream):
            step = rng.randint(1, 5000)
            got.extend(splitter.feed(stream[pos : pos + step]))
            pos += step
        got.extend(splitter.finish())
        assert got == [line.encode() for line in lines] + [b"tail without newline"]


def test_line_splitter_keeps_empty_lines_and_finish_is_empty_after_newline():
    splitter = protocol.LineSplitter()
    assert splitter.feed(b"a\n\n\nb") == [b"a", b"", b""]
    assert splitter.feed(b"\n") == [b"b"]
    assert splitter.finish() == []


def test_frame_reader_handles_frames_split_across_chunks():
    frames = [{"t": protocol.HEARTBEAT}] + [
        {"t": protocol.OUT, "r": i, "s": "o", "l": [str(i)] * i} for i in range(50)
    ]
    data = b"".join(protocol.encode(f) for f in frames)
    reader = protocol.FrameReader()
    got = []
    for i in range(0, len(data), 7):
        got.extend(reader.feed(data[i : i + 7]))
    got.extend(reader.finish())
    assert got == frames


@pytest.mark.parametrize(
    ("code", "sig", "expected"), [(0, None, 0), (3, None, 3), (None, 9, 137), (None, 15, 143)]
)
def test_exit_code_of_follows_the_shell_convention(code, sig, expected):
    assert protocol.exit_code_of(code, sig) == expected
