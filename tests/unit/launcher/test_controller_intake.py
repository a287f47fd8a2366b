"""The controller's intake and output path at scale, piece by piece: the OUT frame's fast
decode agrees with the field-by-field check, rank logs keep every byte in order however they
are held, ranks.json and run.json stay exact JSON, rank tails and the frame queue stay
bounded, and the console says how many lines it dropped."""

from __future__ import annotations

import dataclasses
import io
import json
import resource
import threading

import pytest

from zlaunch.console import writer as writer_module
from zlaunch.console.terminal import Console
from zlaunch.console.writer import BackgroundWriter
from zlaunch.errors import LaunchError
from zlaunch.job.hostfile import Host
from zlaunch.launcher import agent_links, open_files
from zlaunch.launcher.agent_links import AgentLinks, FrameIn, LinkClosed
from zlaunch.launcher.rank_tail import (
    LINE_CHARS,
    MAX_TAIL_CHARS,
    MIN_TAIL_CHARS,
    RankTail,
    tail_chars,
)
from zlaunch.rundir import recorder as recorder_module
from zlaunch.rundir.recorder import Recorder
from zlaunch.rundir.records import RankPhase, RankRow, RanksFile
from zlaunch.rundir.root import json_text
from zlaunch.transport.link import Link
from zlaunch.wire import frames, records

# ---- the OUT frame's fast decode ----------------------------------------------------------

OUT_OBJECTS = [
    {"t": "out", "r": 3, "s": "o", "l": ["a", "", "\udcff"]},
    {"t": "out", "r": 0, "s": "e", "l": [], "p": True},
    {"t": "out", "r": 7, "s": "o", "l": ["x"], "extra": 1},  # unknown keys are ignored
    {"t": "out", "r": 1, "s": "o", "l": ["a"], "p": False},  # "p" is true or absent
    {"t": "out", "r": 1, "s": "o", "l": ["a"], "p": 1},
    {"t": "out", "r": True, "s": "o", "l": ["a"]},
    {"t": "out", "r": 1.0, "s": "o", "l": ["a"]},
    {"t": "out", "r": 1, "s": "x", "l": ["a"]},
    {"t": "out", "r": 1, "s": ["o"], "l": ["a"]},
    {"t": "out", "r": 1, "s": "o", "l": ["a", 1]},
    {"t": "out", "r": 1, "s": "o", "l": ["a", None]},
    {"t": "out", "r": 1, "s": "o", "l": "a"},
    {"t": "out", "r": 1, "s": "o"},
    {"t": "out", "s": "o", "l": []},
]


def _checked(obj):
    """What the general, field-by-field check makes of ``obj``: a frame or the error text."""
    try:
        return records.load(frames.Out, obj, "")
    except records.FieldError as err:
        return str(err)


@pytest.mark.parametrize("obj", OUT_OBJECTS)
def test_the_fast_out_decode_gives_what_the_field_check_gives(obj):
    line = json.dumps(obj).encode()
    expected = _checked(obj)
    if isinstance(expected, str):
        with pytest.raises(frames.ProtocolError) as err:
            frames.decode(line)
        assert expected in str(err.value)
    else:
        frame = frames.decode(line)
        assert frame == expected and type(frame.lines) is list


# ---- rank logs: held, then written whole and in order -------------------------------------


class MemoryRunDir:
    path = "/runs/r1"

    def __init__(self):
        self.files: dict[int, ByteFile] = {}

    def open_rank_log(self, attempt, host, rank):
        self.files[rank] = ByteFile()
        return self.files[rank]


class ByteFile:
    """A file whose write takes at most 5 bytes at a time (as an unbuffered write may)."""

    def __init__(self):
        self.data = bytearray()
        self.writes = 0
        self.closed = False

    def write(self, data):
        self.writes += 1
        self.data += bytes(data[:5])
        return min(5, len(data))

    def close(self):
        self.closed = True


def test_rank_logs_are_held_then_written_whole_and_in_order(monkeypatch):
    monkeypatch.setattr(recorder_module, "LOG_BUFFER_BYTES", 1000)
    run_dir = MemoryRunDir()
    recorder = Recorder(run_dir, console=None)
    logs = {rank: recorder.open_rank_log(0, "node1", rank) for rank in range(3)}
    expected = {rank: bytearray() for rank in logs}
    for i in range(20):
        for rank, log in logs.items():
            data = f"rank {rank} line {i}\n".encode()
            log.write(data)
            expected[rank] += data
    assert all(len(run_dir.files[r].data) < len(expected[r]) for r in logs)  # some held
    recorder.write_logs()
    assert {r: bytes(f.data) for r, f in run_dir.files.items()} == expected
    logs[1].write(b"last words, no newline")
    logs[1].close()  # a close writes what is held
    assert bytes(run_dir.files[1].data).endswith(b"line 19\nlast words, no newline")
    assert run_dir.files[1].closed


def test_held_rank_log_bytes_are_written_once_the_bound_is_reached(monkeypatch):
    monkeypatch.setattr(recorder_module, "LOG_BUFFER_BYTES", 100)
    run_dir = MemoryRunDir()
    recorder = Recorder(run_dir, console=None)
    log = recorder.open_rank_log(0, "node1", 0)
    for _ in range(9):
        log.write(b"x" * 10)
    assert run_dir.files[0].data == b""
    log.write(b"y" * 10)  # 100 bytes held: all written now
    assert run_dir.files[0].data == b"x" * 90 + b"y" * 10


# ---- ranks.json: exact JSON, and rewritten at a bounded share of the time -----------------


def test_a_rank_row_writes_every_field():
    row = RankRow(5, 1, "node2", 1, 4242, RankPhase.EXITED, 137, 9, "SIGKILL", True, 12, "50%",
                  1.5)  # fmt: skip
    assert row.to_json() == json.loads(json.dumps(dataclasses.asdict(row)))
    assert set(RankRow(0).to_json()) == {f.name for f in dataclasses.fields(RankRow)}
    assert RankRow.from_json(json.loads(json.dumps(row.to_json()))) == row


@pytest.mark.parametrize(
    "data",
    [
        RanksFile(2, 3.5, (RankRow(0, 0, "a", 0, 1, RankPhase.RUNNING), RankRow(1))).to_json(),
        RanksFile(0, 0.0).to_json(),
        {"a": [1, {"b": [], "c": {}}, {"d": {"e": [1, 2, {"f": None}]}}], "g": {1: 2}, "h": 'x"'},
        [],
        "text",
    ],
)
@pytest.mark.parametrize("levels", [0, 1, 2, 3, 9])
def test_json_text_is_the_same_json_at_any_indentation(data, levels):
    assert json.loads(json_text(data, levels)) == json.loads(json.dumps(data))


def test_ranks_json_is_one_rank_a_line():
    rows = tuple(RankRow(r, r, "node1", 0) for r in range(3))
    text = json_text(RanksFile(0, 1.0, rows).to_json(), 2)
    assert [line.strip().rstrip(",") for line in text.splitlines()[4:7]] == [
        json.dumps(row.to_json()) for row in rows
    ]


class Clock:
    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        return self.now

    def time(self):
        return self.now


class SlowRanksDir:
    """A run directory whose ranks.json takes ``cost`` seconds of the clock to write."""

    path = "/runs/r1"

    def __init__(self, clock, cost):
        self.clock = clock
        self.cost = cost
        self.written = 0

    def write_ranks(self, ranks):
        self.clock.now += self.cost
        self.written += 1


@pytest.mark.parametrize("cost", [0.001, 0.2])
def test_ranks_json_takes_a_bounded_share_of_the_time(monkeypatch, cost):
    clock = Clock()
    monkeypatch.setattr(recorder_module, "time", clock)
    run_dir = SlowRanksDir(clock, cost)
    recorder = Recorder(run_dir, console=None)
    assert recorder.ranks_due()
    recorder.ranks(0, [])
    # once a second for a small file; 20 times its duration for a large one (0.2 s: 4 s)
    gap = max(recorder_module.RANKS_MIN_INTERVAL, recorder_module.RANKS_COST_SHARE * cost)
    clock.now += gap * 0.9
    assert not recorder.ranks_due()
    clock.now += gap * 0.2
    assert recorder.ranks_due()


# ---- rank tails: bounded, whatever the ranks print ----------------------------------------


def test_tail_memory_is_shared_out_by_the_number_of_ranks():
    assert tail_chars(1) == MAX_TAIL_CHARS
    assert tail_chars(16_384) == MIN_TAIL_CHARS
    assert MIN_TAIL_CHARS <= tail_chars(4096) <= MAX_TAIL_CHARS
    assert 16_384 * (tail_chars(16_384) + 64 * 100) < 512 * 1024 * 1024


def test_a_tail_holds_at_most_its_characters_and_keeps_the_last_lines():
    tail = RankTail(shown=5, max_chars=10_000)
    for i in range(2000):
        tail.add("o", [f"line {i} " + "x" * 200], False)
    held = sum(len(x) if isinstance(x, str) else len(x.text) for x in tail._lines)
    assert held <= 10_000
    assert tail.lines() == tuple(f"line {i} " + "x" * 200 for i in range(1995, 2000))


def test_a_huge_line_is_held_cut_and_marked():
    tail = RankTail(shown=3)
    tail.add("e", ["y" * (LINE_CHARS * 10), "Traceback (most recent call last):", "boom"], False)
    first, *rest = tail.lines()
    assert first.startswith("y" * LINE_CHARS) and len(first) < LINE_CHARS + 100
    assert f"{LINE_CHARS * 9} more characters in the rank log" in first
    assert rest == ["Traceback (most recent call last):", "boom"]


# ---- the console: drops counted and said -------------------------------------------------


class StuckStream(io.RawIOBase):
    """A reader that does not read until released."""

    def __init__(self):
        self.release = threading.Event()
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, data):
        self.release.wait(10)
        self.data += data
        return len(data)


def test_lines_dropped_at_the_end_are_still_said_and_counted():
    stream = StuckStream()
    out = BackgroundWriter(stream, limit=100)
    err = io.StringIO()
    console = Console(color=False, out=out, err=err)
    for i in range(50):
        console.lines("node1", i, "o", [f"line {i}"])
    assert out.dropped > 0
    stream.release.set()
    console.close(timeout=10)
    out.close(timeout=10)  # a writer the test gave is the test's to close
    text = stream.data.decode()
    shown = text.count("] line ")
    assert shown + out.dropped == 50
    assert f"{out.dropped} line(s) not shown here" in text  # in the stream, where they were
    assert f"zlaunch: {out.dropped} line(s) of rank output were not shown" in err.getvalue()


def test_the_console_limit_is_read_when_a_writer_starts(monkeypatch):
    monkeypatch.setattr(writer_module, "DEFAULT_LIMIT", 123)
    writer = BackgroundWriter(io.BytesIO())
    assert writer.limit == 123
    writer.close(timeout=5)


# ---- the frame queue: bounded, nothing lost, in order -------------------------------------


class EndlessLink(Link):
    """An agent that sends OUT frames as fast as it is read, ``total`` of them."""

    def __init__(self, host, total):
        super().__init__(host)
        self.total = total
        self.sent = 0
        self.lock = threading.Lock()

    def read(self, size=65536):
        with self.lock:
            if self.sent >= self.total:
                return b""
            frame = frames.encode(frames.Out(0, "o", [f"{self.sent:08d}" + "x" * 200]))
            self.sent += 1
            return frame

    def terminate(self, wait=5.0):
        self.closed = True


def test_the_frame_queue_holds_a_bounded_amount_and_loses_nothing(monkeypatch):
    monkeypatch.setattr(agent_links, "QUEUED_BYTES", 4096)
    monkeypatch.setattr(agent_links, "MIN_READ", 256)
    hosts = [Host("n1", (0,)), Host("n2", (0,))]
    links = AgentLinks(hosts, done=lambda _node: False)
    endless = [EndlessLink(host, 500) for host in hosts]
    for index, link in enumerate(endless):
        links.links[index] = link
        threading.Thread(target=links._read, args=(index, link), daemon=True).start()
    deadline = threading.Event()
    for _ in range(50):  # nobody takes: the readers stop at the bound
        deadline.wait(0.02)
    frame_bytes = len(frames.encode(frames.Out(0, "o", ["0" * 208])))
    held = sum(link.sent for link in endless)
    assert held * frame_bytes <= 4096 + 2 * frame_bytes
    got = {0: [], 1: []}
    closed = set()
    while len(closed) < 2:
        item = links.next(timeout=10)
        assert item is not None, "the readers did not go on once the loop took frames"
        if isinstance(item, FrameIn):
            got[item.node].append(int(item.frame.lines[0][:8]))
        elif isinstance(item, LinkClosed):
            closed.add(item.node)
    assert got == {0: list(range(500)), 1: list(range(500))}
    links.close()


# ---- the open-file limit: a log per rank ----------------------------------------------------


class Limits:
    def __init__(self, soft, hard):
        self.soft, self.hard = soft, hard
        self.set_to = None

    def getrlimit(self, _which):
        return self.soft, self.hard

    def setrlimit(self, _which, limits):
        self.set_to = limits


@pytest.mark.parametrize(
    ("soft", "hard", "set_to"),
    [
        (1024, 524288, (1024 + 3 * 64 + 256, 524288)),  # 1,024 ranks on 64 hosts: raised
        (1024, 1400, (1400, 1400)),  # as far as the hard limit goes
        (4096, 524288, None),  # enough already: left as it is
        (1024, resource.RLIM_INFINITY, (1472, resource.RLIM_INFINITY)),
    ],
)
def test_the_open_file_limit_is_raised_to_what_the_rank_logs_need(monkeypatch, soft, hard, set_to):
    limits = Limits(soft, hard)
    monkeypatch.setattr(open_files, "resource", _FakeResource(limits))
    open_files.ensure_open_files(1024, 64)
    assert limits.set_to == set_to


def test_a_hard_limit_below_the_rank_logs_is_refused_before_the_start(monkeypatch):
    limits = Limits(1024, 1024)
    monkeypatch.setattr(open_files, "resource", _FakeResource(limits))
    with pytest.raises(LaunchError) as err:
        open_files.ensure_open_files(1024, 64)
    assert "1472 open files" in err.value.message and "(1024)" in err.value.message
    assert "ulimit -n 1472" in err.value.hint
    assert limits.set_to is None


class _FakeResource:
    RLIMIT_NOFILE = resource.RLIMIT_NOFILE
    RLIM_INFINITY = resource.RLIM_INFINITY

    def __init__(self, limits):
        self.getrlimit = limits.getrlimit
        self.setrlimit = limits.setrlimit


def test_a_terminal_that_cannot_keep_up_drops_rank_lines_never_notes(monkeypatch):
    from zlaunch.console import live_view
    from zlaunch.console.live_view import LiveView

    monkeypatch.setattr(live_view, "LINES_PER_PRINT", 10)
    screen = io.StringIO()
    err = io.StringIO()
    console = Console(color=False, out=io.BytesIO(), err=err)
    view = LiveView(console, screen)
    for rank in range(30):  # 30 lines in a moment: the first print, then 10 a print
        console.lines("node1", rank, "o", [f"line of rank {rank}"])
    view.queue("zlaunch: a note\n")  # a note always prints
    view.flush_lines(force=True)
    view.close()
    console.close()
    text = screen.getvalue()
    shown = [f"line of rank {r}\n" in text for r in range(30)]
    printed = shown.count(True)
    assert 10 <= printed < 30 and shown == [True] * printed + [False] * (30 - printed)
    assert "zlaunch: a note" in text
    assert f"the console fell behind: {30 - printed} line(s) not shown here" in text
    assert f"zlaunch: {30 - printed} line(s) of rank output were not shown" in err.getvalue()
