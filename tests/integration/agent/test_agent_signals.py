"""What the agent signals. Real worker processes, no controller:
a stop never reaches a stranger's group, the stacks signal reaches only the process that
armed itself, and what a worker started outside its group does not outlive the job."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

from zlaunch.agent.procs import boot_ticks
from zlaunch.agent.workers import EVENTS, WorkerGroup, start_worker
from zlaunch.wire import events, frames, protocol


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed orphan may wait for a reaper that is slow to come)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def group():
    sel = selectors.DefaultSelector()
    workers = WorkerGroup(sel)
    started: list = []

    def start(rank: int, argv: list[str], cgroup: bool = False):
        spec = frames.WorkerSpec(rank, rank, argv)
        worker = start_worker(spec, None, {}, workers.tag, workers.cgroup if cgroup else None)
        workers.add(worker)
        started.append(worker)
        return worker

    yield workers, start
    workers.kill_remaining()
    for worker in started:
        worker.proc.kill()
        worker.proc.wait()
        worker.proc.stdout.close()
        worker.proc.stderr.close()
        os.close(next(fd for fd, stream in worker.pipes.items() if stream == EVENTS))
    workers.close()
    sel.close()


def _reaped(workers: WorkerGroup, worker) -> None:
    deadline = time.monotonic() + 10
    while not workers.reap(worker):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_stop_never_signals_the_group_of_a_reaped_leader_now_a_strangers(group):
    workers, start = group
    worker = start(0, [sys.executable, "-c", "pass"])
    _reaped(workers, worker)
    # The kernel gives the old pid to a stranger that leads its own group (pid reuse): the
    # stranger is simulated by a group whose id the reaped worker's group id now names.
    time.sleep(0.05)  # a later start than the reap, as a process with a reused pid has
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        worker.pgid = stranger.pid
        workers.signal_groups(signal.SIGTERM)
        workers.kill_remaining()
        time.sleep(0.2)
        assert stranger.poll() is None, "a stranger's process group was signalled"
        assert not workers.any_group_alive()
    finally:
        stranger.kill()
        stranger.wait()


def test_what_a_reaped_leader_left_in_its_group_is_still_stopped_even_without_the_tag(group):
    workers, start = group
    # env -i: the child does not carry the job tag; it is found as an old member of the group
    worker = start(0, ["bash", "-c", "env -i sleep 30 & echo $!; exit 0"])
    child = int(worker.proc.stdout.readline())
    _reaped(workers, worker)
    time.sleep(0.05)  # the reap is a tick later than the child's start
    assert worker.reaped_at <= boot_ticks() and workers.any_group_alive()
    workers.signal_groups(signal.SIGTERM)
    assert _wait_gone(child)


def test_a_setsid_child_does_not_outlive_the_job(group):
    workers, start = group
    worker = start(0, ["bash", "-c", "setsid sleep 30 & echo $!; exit 0"])
    child = int(worker.proc.stdout.readline())
    _reaped(workers, worker)
    deadline = time.monotonic() + 5
    while os.getsid(child) != child:  # setsid(1) runs in the child, a moment after the fork
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert workers.any_group_alive()  # so the agent does not say bye while it runs
    workers.signal_groups(signal.SIGTERM)
    assert _wait_gone(child)
    assert not workers.any_group_alive()


ARMED_CHILD = (
    "import os, sys, time\n"
    "from zlaunch.worker.stack_dumper import arm\n"
    "arm()\n"
    "print('armed', flush=True)\n"
    "time.sleep(30)\n"
)


def test_a_wrapper_survives_zlaunch_stacks_and_the_armed_child_dumps(group, monkeypatch):
    workers, start = group
    monkeypatch.setenv(protocol.STACKS_SIGNAL_ENV, str(int(protocol.STACKS_SIGNAL)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    wrapper = start(0, ["bash", "-c", f'{sys.executable} -c "$0"; exit 7', ARMED_CHILD])
    assert wrapper.proc.stdout.readline() == b"armed\n"
    events_fd = next(fd for fd, stream in wrapper.pipes.items() if stream == EVENTS)
    event = frames.decode(b'{"t":"event","r":0,"e":[' + os.read(events_fd, 4096).strip() + b"]}")
    (ready,) = event.events
    assert isinstance(ready, events.StacksReady) and ready.pid != wrapper.pid
    workers.note_armed(0, ready.pid, ready.dumper)
    workers.signal_processes(int(protocol.STACKS_SIGNAL), [0])
    time.sleep(0.5)
    assert wrapper.proc.poll() is None, "the stacks signal killed the wrapper"
    os.set_blocking(wrapper.proc.stderr.fileno(), False)
    assert b"Current thread" in wrapper.proc.stderr.read()  # the dump, from the child


def test_a_claimed_pid_outside_the_job_is_not_believed(group):
    workers, start = group
    worker = start(0, [sys.executable, "-c", "import time; time.sleep(30)"])
    stranger = subprocess.Popen(["sleep", "30"], env={})
    try:
        workers.note_armed(0, stranger.pid)
        assert worker.armed_pid is None
        workers.signal_processes(int(protocol.STACKS_SIGNAL), None)
        time.sleep(0.1)
        assert stranger.poll() is None and worker.proc.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_child_that_leaves_the_group_and_clears_its_environment_is_ended_by_the_job_cgroup(
    group,
):
    workers, start = group
    if workers.cgroup is None:
        pytest.skip("no cgroup2 hierarchy this agent may create a cgroup in")
    path = workers.cgroup.path
    worker = start(0, ["bash", "-c", "setsid env -i sleep 30 & echo $!; exit 0"], cgroup=True)
    child = int(worker.proc.stdout.readline())
    _reaped(workers, worker)
    deadline = time.monotonic() + 5
    while os.getsid(child) != child:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # neither the tag (env -i) nor the old group (setsid) finds it: only the cgroup does
    assert child in workers.cgroup.pids() and workers.any_group_alive()
    workers.kill_remaining()
    assert _wait_gone(child)
    assert not workers.any_group_alive()
    workers.close()
    assert not os.path.exists(path)
