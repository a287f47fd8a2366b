"""The agent alone, driven over its stdin/stdout pipes as the controller drives it."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.launcher import fake_worker
from zlaunch.wire import events as wire_events
from zlaunch.wire import frames, protocol

FAKE = fake_worker.__file__


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # gone (ENOENT), or reaped between open and read (ESRCH)
        return False


class AgentUnderTest:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "zlaunch.agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.frames: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        reader = frames.FrameReader()
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            for frame in reader.feed(chunk):
                self.frames.put(frame)
        self.frames.put(None)

    def send(self, frame):
        self.proc.stdin.write(frames.encode(frame))
        self.proc.stdin.flush()

    def next(self, kind=None, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            frame = self.frames.get(timeout=max(0.01, deadline - time.monotonic()))
            if frame is None:
                raise AssertionError(f"agent closed its output while waiting for {kind}")
            if kind is None or isinstance(frame, kind):
                return frame

    def until_bye(self, timeout=15.0):
        seen = []
        while True:
            frame = self.next(timeout=timeout)
            seen.append(frame)
            if isinstance(frame, frames.Bye):
                return seen

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent():
    a = AgentUnderTest()
    yield a
    a.close()


def spec(workers, heartbeat_timeout=30.0):
    return frames.Spec(
        cwd="/",
        master_addr="127.0.0.1",
        grace=5.0,
        heartbeat_timeout=heartbeat_timeout,
        workers=[
            frames.WorkerSpec(r, r, argv, {"RANK": str(r), **env})
            for r, (argv, env) in enumerate(workers)
        ],
    )


def py(code):
    return [sys.executable, "-c", code]


def test_hello_then_workers_run_and_every_line_and_exit_is_forwarded(agent, tmp_path):
    hello = agent.next(frames.Hello)
    assert hello.pid == agent.proc.pid and hello.python == sys.executable
    assert hello.addr is None and 1 <= hello.port <= 65535
    code = (
        "import os,sys\n"
        "for i in range(5): print('out', os.environ['RANK'], i)\n"
        "print('to err', file=sys.stderr)\n"
        'os.write(int(os.environ[\'ZLAUNCH_EVENTS_FD\']), b\'{"kind": "metrics", "step": 1}\\n\')\n'
        "print(os.environ['GLOO_SOCKET_IFNAME'], os.environ['NCCL_SOCKET_IFNAME'], repr(os.environ['SECRET']))\n"
        "sys.exit(int(os.environ['RANK']) * 3)\n"
    )
    agent.send(spec([(py(code), {"SECRET": "a b $(x) \n"}), (py(code), {"SECRET": "s"})]))
    seen = agent.until_bye()
    out = {0: [], 1: []}
    err = {0: [], 1: []}
    exits, events, started = {}, {}, {}
    for f in seen:
        if isinstance(f, frames.Out):
            (out if f.stream == protocol.STDOUT else err)[f.rank].extend(f.lines)
        elif isinstance(f, frames.Exited):
            exits[f.rank] = (f.code, f.signal)
            # the exit is reported after the rank's last output
            assert len(out[f.rank]) == 6
        elif isinstance(f, frames.Event):
            events[f.rank] = f.events
        elif isinstance(f, frames.Started):
            started[f.rank] = f.pid
    assert out[0][:5] == [f"out 0 {i}" for i in range(5)]
    assert out[0][5] == "lo lo 'a b $(x) \\n'" and out[1][5] == "lo lo 's'"
    assert err == {0: ["to err"], 1: ["to err"]}
    assert exits == {0: (0, None), 1: (3, None)}
    assert events == {0: [wire_events.Metrics(1)], 1: [wire_events.Metrics(1)]}
    assert set(started) == {0, 1}
    assert agent.proc.wait(timeout=5) == 0


def test_env_values_reach_the_worker_byte_for_byte(agent, tmp_path):
    agent.next(frames.Hello)
    hostile = "$(touch /tmp/pwned); echo ';' \"q\" 'q' \n second line ünï"
    agent.send(
        spec([([sys.executable, FAKE, "--record-dir", str(tmp_path)], {"HOSTILE": hostile})])
    )
    agent.until_bye()
    record = json.loads((tmp_path / "rank-0.json").read_text())
    assert record["env"]["HOSTILE"] == hostile
    assert record["sid"] == record["pid"] == record["pgid"]  # its own session
    assert record["ppid"] == agent.proc.pid
    assert protocol.EVENTS_FD_ENV in record["env"]


def test_signal_death_is_reported_as_signal(agent, tmp_path):
    agent.next(frames.Hello)
    argv = [sys.executable, FAKE, "--record-dir", str(tmp_path), "--signal", "KILL"]
    agent.send(spec([(argv, {})]))
    exited = agent.next(frames.Exited)
    assert exited.code is None and exited.signal == signal.SIGKILL
    agent.next(frames.Bye)


def test_missing_program_is_an_error_and_exit_127(agent):
    agent.next(frames.Hello)
    agent.send(spec([(["/nonexistent/program"], {})]))
    error = agent.next(frames.Error)
    assert "rank 0" in error.msg and "/nonexistent/program" in error.msg
    exited = agent.next(frames.Exited)
    assert exited.code == 127
    agent.next(frames.Bye)


def _hanging_workers(agent, tmp_path, n=2, ignore_sigterm=False, heartbeat_timeout=30.0):
    agent.next(frames.Hello)
    argv = [sys.executable, FAKE, "--record-dir", str(tmp_path), "--hang"]
    if ignore_sigterm:
        argv.append("--ignore-sigterm")
    agent.send(spec([(argv, {})] * n, heartbeat_timeout))
    pids = [agent.next(frames.Started).pid for _ in range(n)]
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"rank-{r}.json").exists() for r in range(n)):
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.05)
    return pids


def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_eof_on_stdin_kills_the_workers(agent, tmp_path):
    pids = _hanging_workers(agent, tmp_path)
    start = time.monotonic()
    agent.proc.stdin.close()
    assert _wait_gone(pids, 5.0), "workers survived the controller closing the agent's stdin"
    assert agent.proc.wait(timeout=5) == 0
    assert time.monotonic() - start < 3.0


def test_missed_heartbeat_kills_the_workers(agent, tmp_path):
    pids = _hanging_workers(agent, tmp_path, heartbeat_timeout=1.0)
    start = time.monotonic()
    assert _wait_gone(pids, 6.0), "workers survived a lost heartbeat"
    assert time.monotonic() - start >= 0.5  # it waited for the heartbeat to be missed
    assert "no heartbeat" in agent.next(frames.Error).msg
    assert agent.proc.wait(timeout=5) == 0


def test_heartbeats_keep_it_alive(agent, tmp_path):
    pids = _hanging_workers(agent, tmp_path, n=1, heartbeat_timeout=1.0)
    for _ in range(6):
        agent.send(frames.Heartbeat())
        time.sleep(0.3)
    assert all(_alive(p) for p in pids)
    agent.send(frames.Stop(2.0))
    assert _wait_gone(pids, 5.0)
    agent.next(frames.Bye)


def test_stop_terms_then_kills_after_grace(agent, tmp_path):
    pids = _hanging_workers(agent, tmp_path, ignore_sigterm=True)
    start = time.monotonic()
    agent.send(frames.Stop(1.0))
    assert _wait_gone(pids, 5.0)
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 3.0, elapsed
    assert (tmp_path / "rank-0.sigterm").exists()  # TERM came first
    exits = [agent.next(frames.Exited) for _ in pids]
    assert {e.signal for e in exits} == {signal.SIGKILL}
    agent.next(frames.Bye)


def test_stop_reaches_grandchildren_in_the_worker_group(agent, tmp_path):
    agent.next(frames.Hello)
    code = (
        "import subprocess,sys,time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    agent.send(spec([(py(code), {})]))
    worker = agent.next(frames.Started).pid
    grandchild = int(agent.next(frames.Out).lines[0])
    agent.send(frames.Stop(2.0))
    assert _wait_gone([worker, grandchild], 5.0)
    agent.next(frames.Bye)


def test_sigterm_to_the_agent_stops_its_workers(agent, tmp_path):
    pids = _hanging_workers(agent, tmp_path)
    agent.proc.send_signal(signal.SIGTERM)
    assert _wait_gone(pids, 8.0)
    assert agent.proc.wait(timeout=5) == 0


def _preemptible_workers(agent, tmp_path, **fields):
    """One hanging worker under a spec that names a preemption signal or check."""
    agent.next(frames.Hello)
    argv = [sys.executable, FAKE, "--record-dir", str(tmp_path), "--hang"]
    agent.send(dataclasses.replace(spec([(argv, {})]), **fields))
    pid = agent.next(frames.Started).pid
    deadline = time.monotonic() + 20
    while not (tmp_path / "rank-0.json").exists():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    return pid


def test_the_preemption_signal_is_said_upstream_once_and_the_workers_keep_running(agent, tmp_path):
    pid = _preemptible_workers(agent, tmp_path, preemption_signal=int(signal.SIGTERM))
    agent.proc.send_signal(signal.SIGTERM)
    notice = agent.next(frames.Error)
    assert notice.cause == protocol.CAUSE_PREEMPTED
    assert notice.msg == "the agent received SIGTERM"
    agent.proc.send_signal(signal.SIGTERM)  # a second one says nothing new
    time.sleep(1.0)
    assert _alive(pid), "a preemption notice stopped the workers: the controller decides"
    assert not any(isinstance(f, frames.Error) for f in list(agent.frames.queue))
    agent.send(frames.Stop(1.0))  # what the controller sends once the ranks saved
    assert _wait_gone([pid], 8.0)


def test_a_preemption_check_that_turns_to_exit_0_is_a_notice(agent, tmp_path):
    flag = tmp_path / "going"
    check = f"test -e {flag}"
    pid = _preemptible_workers(
        agent, tmp_path, preemption_check=check, preemption_check_interval=0.2
    )
    time.sleep(1.0)  # several checks that exit 1: nothing said
    assert not any(isinstance(f, frames.Error) for f in list(agent.frames.queue))
    flag.touch()
    notice = agent.next(frames.Error, timeout=5)
    assert notice.cause == protocol.CAUSE_PREEMPTED
    assert notice.msg == f"--preemption-check {check!r} exited 0"
    assert _alive(pid)
    agent.send(frames.Stop(1.0))
    assert _wait_gone([pid], 8.0)
