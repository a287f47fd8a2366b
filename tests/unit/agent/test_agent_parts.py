"""The agent's parts alone, in this process: worker pipes -> frames, the buffered upstream
link, starting and reaping workers. The agent as a whole is driven in test_agent.py."""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import time

import pytest

from zlaunch.agent.output import MAX_EVENT_BYTES, PROGRESS_INTERVAL, OutputPump
from zlaunch.agent.upstream import MAX_PENDING_OUTPUT, Upstream
from zlaunch.agent.workers import EVENTS, boot_argv
from zlaunch.wire import events, frames, protocol


class FakeWorker:
    """What OutputPump needs of a worker: its rank and its pipes (read ends)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.writers: dict[str, int] = {}
        self.pipes: dict[int, str] = {}
        for stream in (protocol.STDOUT, protocol.STDERR, EVENTS):
            r, w = os.pipe()
            self.pipes[r] = stream
            self.writers[stream] = w

    def write(self, stream: str, data: bytes) -> None:
        os.write(self.writers[stream], data)

    def close(self) -> None:
        for w in self.writers.values():
            os.close(w)


@pytest.fixture
def pump():
    sel = selectors.DefaultSelector()
    sent: list[frames.Frame] = []
    pump = OutputPump(sel, sent.append)
    worker = FakeWorker(rank=3)
    pump.watch(worker)
    yield pump, worker, sent, sel
    worker.close()
    sel.close()


def _fd(worker: FakeWorker, stream: str) -> int:
    return next(fd for fd, s in worker.pipes.items() if s == stream)


def test_output_lines_become_out_frames_and_an_unfinished_line_waits(pump):
    pump, worker, sent, _ = pump
    worker.write(protocol.STDOUT, b"one\ntwo\nthr")
    pump.read(_fd(worker, protocol.STDOUT))
    assert sent == [frames.Out(3, protocol.STDOUT, ["one", "two"])]
    worker.write(protocol.STDOUT, b"ee\n")
    pump.read(_fd(worker, protocol.STDOUT))
    assert sent[-1] == frames.Out(3, protocol.STDOUT, ["three"])


@pytest.mark.parametrize(
    ("written", "events"),
    [
        (b'{"kind": "metrics", "step": 1}\n\n', [events.Metrics(1)]),
        (b"not json\n", [events.Invalid("not json")]),
        (
            b'{"kind": "save_ack"}\n{"b"\n',
            [events.SaveAck(), events.Invalid('{"b"')],
        ),
    ],
)
def test_event_lines_become_one_event_frame_per_read(pump, written, events):
    pump, worker, sent, _ = pump
    worker.write(EVENTS, written)
    pump.read(_fd(worker, EVENTS))
    assert sent == [frames.Event(3, events)]


def test_an_over_long_event_is_dropped_and_reported_with_its_size(pump):
    pump, worker, sent, _ = pump
    fd = _fd(worker, EVENTS)
    big = json.dumps({"kind": "x", "pad": "p" * (MAX_EVENT_BYTES + 100_000)}).encode()
    data = big + b'\n{"kind": "save_ready"}\n'
    for start in range(0, len(data), 32 * 1024):  # a pipe holds 64 KiB: write, then read
        worker.write(EVENTS, data[start : start + 32 * 1024])
        pump.read(fd, drain=True)
        assert sent == [] or start + 32 * 1024 >= len(big)
    (frame,) = sent
    assert isinstance(frame.events[0], events.Invalid)
    assert f"event of {len(big)} bytes dropped" in frame.events[0].text
    assert frame.events[1:] == [events.SaveReady()]


def test_a_progress_line_is_forwarded_at_most_every_interval(pump):
    pump, worker, sent, _ = pump
    fd = _fd(worker, protocol.STDERR)
    worker.write(protocol.STDERR, b"\r 10%")
    pump.read(fd)
    assert sent == [frames.Out(3, protocol.STDERR, ["\r 10%"], partial=True)]
    worker.write(protocol.STDERR, b"\r 20%")
    pump.read(fd)
    assert len(sent) == 1  # held back: the last one went out just now
    assert pump.forward_due_progress(time.monotonic()) is True  # still not due
    assert pump.forward_due_progress(time.monotonic() + PROGRESS_INTERVAL) is False
    assert sent[-1] == frames.Out(3, protocol.STDERR, ["\r 20%"], partial=True)


def test_end_of_every_pipe_closes_it_and_flushes_the_last_line(pump):
    pump, worker, sent, sel = pump
    worker.write(protocol.STDOUT, b"last words")
    worker.close()
    worker.writers.clear()
    pump.drain(worker.rank)
    assert sent == [frames.Out(3, protocol.STDOUT, ["last words"], partial=True)]
    assert not pump.open and not sel.get_map()


def test_pause_stops_watching_the_pipes_and_resume_watches_them_again(pump):
    pump, worker, _, sel = pump
    assert set(sel.get_map()) == set(worker.pipes)
    pump.pause(True)
    assert not sel.get_map()
    pump.pause(False)
    assert set(sel.get_map()) == set(worker.pipes)


def test_upstream_buffers_what_the_link_does_not_take_and_applies_backpressure():
    sel = selectors.DefaultSelector()
    r, w = os.pipe()
    os.set_blocking(w, False)
    behind: list[bool] = []
    upstream = Upstream(w, sel, on_lost=pytest.fail, on_backpressure=behind.append)
    line = "x" * 60_000
    while not behind:  # nobody reads: the pipe fills, then the buffer
        upstream.send(frames.Out(0, "o", [line] * 10))
    assert behind == [True] and w in sel.get_map()
    reader = frames.FrameReader()
    os.set_blocking(r, False)
    count = 0
    while w in sel.get_map():
        try:
            count += len(list(reader.feed(os.read(r, 1 << 20))))
        except BlockingIOError:
            pass
        upstream.flush()
    assert behind == [True, False]
    assert count > MAX_PENDING_OUTPUT // (600_000 + 100)
    os.close(r)
    os.close(w)


def test_upstream_reports_a_closed_link_once_and_drops_later_frames():
    sel = selectors.DefaultSelector()
    r, w = os.pipe()
    os.close(r)
    lost: list[str] = []
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        upstream = Upstream(w, sel, on_lost=lost.append, on_backpressure=pytest.fail)
        upstream.send(frames.Heartbeat())
        upstream.send(frames.Bye())
    finally:
        signal.signal(signal.SIGPIPE, previous)
        os.close(w)
    assert lost == ["controller connection closed"] and not upstream.ok


# the boot as `-m zlaunch.worker.boot` would run it, less the working directory on sys.path
BOOT = 'import sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy._run_module_as_main("zlaunch.worker.boot")'


@pytest.mark.parametrize(
    ("argv", "booted"),
    [
        (["python3", "-u", "train.py", "--x"], ["python3", "-u", "-c", BOOT, "train.py", "--x"]),
        (["/v/bin/python", "-u", "-m", "pkg.main"], ["/v/bin/python", "-u", "-c", BOOT, "-m", "pkg.main"]),
        (["python3", "-u", "-c", "print(1)"], None),
        (["python3", "-u", "-m"], None),
        (["python3", "train.py"], None),
        (["bash", "-u", "run.sh"], None),
    ],
)  # fmt: skip
def test_python_workers_start_behind_worker_boot(argv, booted):
    assert boot_argv(argv) == (booted or argv)


class AgentInProcess:
    """An Agent whose stdout is a pipe read here; its loop does not run."""

    def __init__(self):
        from zlaunch.agent.loop import Agent

        self.stdin_r, self.stdin_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.agent = Agent(stdin_fd=self.stdin_r, stdout_fd=self.out_w)
        self.reader = frames.FrameReader()
        os.set_blocking(self.out_r, False)

    def sent(self) -> list[frames.Frame]:
        try:
            return list(self.reader.feed(os.read(self.out_r, 1 << 20)))
        except BlockingIOError:
            return []

    def close(self) -> None:
        self.agent.sel.close()
        for fd in (self.stdin_r, self.stdin_w, self.out_r, self.out_w):
            os.close(fd)
        os.close(self.agent.signal_r)
        os.close(self.agent.signal_w)


@pytest.fixture
def local_agent():
    agent = AgentInProcess()
    yield agent
    agent.close()


def test_an_unreadable_spec_stops_the_agent_at_once(local_agent):
    from zlaunch.agent.loop import AgentPhase

    agent = local_agent.agent
    before = time.monotonic()
    for _ in agent.frames.feed(b'{"t": "spec", "grace": 1}\n'):
        pass
    assert agent.phase is AgentPhase.STOPPING and agent.kill_at <= time.monotonic()
    assert agent.kill_at >= before
    errors = [f.msg for f in local_agent.sent()]
    assert "unreadable frame" in errors[0] and "'heartbeat_timeout'" in errors[0]
    assert errors[1] == "stopping workers: the spec could not be read"
    assert agent._finished(time.monotonic())  # nothing was started: nothing to wait for


def test_a_spec_after_a_stop_starts_nothing(local_agent):
    from zlaunch.agent.loop import AgentPhase

    agent = local_agent.agent
    agent._handle(frames.Stop(2.0))
    argv = [sys.executable, "-c", "pass"]
    agent._handle(frames.Spec(grace=1.0, heartbeat_timeout=5.0, workers=[
        frames.WorkerSpec(0, 0, argv)]))  # fmt: skip
    assert agent.phase is AgentPhase.STOPPING and not len(agent.workers)
    assert local_agent.sent() == []


@pytest.mark.parametrize(
    ("graces", "kill_within"),
    [((5.0, 1.0), 1.0), ((1.0, 5.0), 1.0), ((0.0, 5.0), 0.0)],
)
def test_a_second_stop_may_bring_the_kill_closer_never_push_it_back(
    local_agent, graces, kill_within
):
    agent = local_agent.agent
    start = time.monotonic()
    for grace in graces:
        agent._handle(frames.Stop(grace))
    assert start + kill_within <= agent.kill_at <= time.monotonic() + kill_within


def test_an_empty_spec_is_a_finished_node(local_agent):
    from zlaunch.agent.loop import AgentPhase

    agent = local_agent.agent
    agent._handle(frames.Spec(grace=1.0, heartbeat_timeout=5.0, workers=[]))
    assert agent.phase is AgentPhase.STOPPING and agent.kill_at is None
    assert agent._finished(time.monotonic())


def test_heartbeats_are_echoed(local_agent):
    local_agent.agent._handle(frames.Heartbeat())
    assert local_agent.sent() == [frames.Heartbeat()]


@pytest.mark.parametrize(
    ("ssh_connection", "client_addr", "addr"),
    [
        (None, None, None),
        ("10.0.0.1 51000 10.0.0.2 22", "10.0.0.1", "10.0.0.2"),
        ("::ffff:10.0.0.1 51000 ::ffff:10.0.0.2 22", "10.0.0.1", "10.0.0.2"),
    ],
)
def test_hello_says_both_ends_of_the_ssh_connection(monkeypatch, ssh_connection, client_addr, addr):
    from zlaunch.agent.loop import hello

    if ssh_connection is None:
        monkeypatch.delenv("SSH_CONNECTION", raising=False)
    else:
        monkeypatch.setenv("SSH_CONNECTION", ssh_connection)
    frame = hello()
    assert (frame.client_addr, frame.addr) == (client_addr, addr)
    assert frame.pid == os.getpid() and 1 <= frame.port <= 65535


# ---- the controller's liveness, as the agent judges it -------------------------------------


def _stale_controller(agent, seconds: float) -> None:
    """The agent last heard the controller ``seconds`` ago, its loop running all along."""
    from zlaunch.wire.liveness import SilenceClock

    agent.sel.register(agent.stdin_fd, selectors.EVENT_READ, "stdin")
    agent.controller = SilenceClock(1, time.monotonic() - seconds, turn=seconds + 1)


def test_a_heartbeat_waiting_unread_is_read_before_the_controller_is_judged(local_agent):
    # A busy agent (starting its workers, not scheduled) finds the controller's heartbeat in
    # its stdin: the controller was not silent, the agent was away.
    agent = local_agent.agent
    _stale_controller(agent, agent.heartbeat_timeout + 2)
    os.write(local_agent.stdin_w, frames.encode(frames.Heartbeat()))
    assert not agent._heartbeat_missed(time.monotonic())
    assert agent.stdin_open and not agent.stopping
    assert local_agent.sent() == [frames.Heartbeat()]  # the echo of what it read


def test_a_silent_controller_is_still_found(local_agent):
    agent = local_agent.agent
    _stale_controller(agent, agent.heartbeat_timeout + 2)
    assert agent._heartbeat_missed(time.monotonic())
    assert agent.stopping and not agent.stdin_open
    (error,) = local_agent.sent()
    assert error.msg.startswith("stopping workers: no heartbeat for 7.")
    assert error.cause == protocol.CAUSE_NO_HEARTBEAT


def test_the_agent_says_it_is_alive_when_it_has_sent_nothing_for_a_second(local_agent):
    from zlaunch.agent.loop import OWN_HEARTBEAT_INTERVAL

    agent = local_agent.agent
    agent.sel.register(agent.stdin_fd, selectors.EVENT_READ, "stdin")
    agent.upstream.sent_at = time.monotonic() - OWN_HEARTBEAT_INTERVAL - 0.1
    agent._turn(time.monotonic())
    assert local_agent.sent() == [frames.Heartbeat()]
    agent._turn(time.monotonic())  # just sent: nothing more this turn
    assert local_agent.sent() == []
