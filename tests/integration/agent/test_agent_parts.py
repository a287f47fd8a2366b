"""The agent's parts alone, in this process: worker pipes -> frames, the buffered upstream
link, starting and reaping workers. The agent as a whole is driven in test_agent.py."""

from __future__ import annotations

import os
import selectors
import sys

import pytest

from zlaunch.agent.workers import EVENTS, StartFailed, WorkerGroup, start_worker
from zlaunch.wire import frames, protocol


def test_a_missing_program_is_start_failed_with_127_and_no_fd_left_open():
    before = set(os.listdir("/proc/self/fd"))
    entry = frames.WorkerSpec(rank=4, local_rank=0, argv=["/nonexistent/prog"])
    with pytest.raises(StartFailed) as err:
        start_worker(entry, "/", {})
    assert err.value.code == 127 and "rank 4" in str(err.value) and "in /" in str(err.value)
    # no descriptor of its own left open (others' may close meanwhile: GC of earlier tests)
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_worker_group_reaps_an_exit_once():
    sel = selectors.DefaultSelector()
    group = WorkerGroup(sel)
    entry = frames.WorkerSpec(rank=0, local_rank=0, argv=[sys.executable, "-c", "exit(3)"])
    worker = start_worker(entry, None, {})
    group.add(worker)
    worker.proc.wait()
    assert group.reap(worker) is True and worker.returncode == 3
    assert group.reap(worker) is False
    assert group.all_exited() and not group.unwatched()
    assert worker.pidfd is None and not sel.get_map()  # its pidfd closed with the exit
    worker.proc.stdout.close()
    worker.proc.stderr.close()
    os.close(next(fd for fd, stream in worker.pipes.items() if stream == EVENTS))


def test_a_worker_starts_with_the_save_and_a_non_stop_preemption_signal_ignored():
    """Slurm's --signal reaches every process of the job: a rank must not die of the
    preemption signal (USR2 here) its agent turns into the host's notice, nor of the save
    signal before its runtime handles it; SIGTERM stays as it was (the agent's stop)."""
    import signal

    probe = (
        "import signal; print(' '.join(str(signal.getsignal(s) == signal.SIG_IGN) for s in "
        "(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)))"
    )
    entry = frames.WorkerSpec(rank=0, local_rank=0, argv=[sys.executable, "-c", probe])
    worker = start_worker(
        entry, None, {protocol.SAVE_ON_ENV: "SIGUSR1"}, preemption_signal=signal.SIGUSR2
    )
    out, _ = worker.proc.communicate(timeout=30)
    assert out.decode().split() == ["True", "True", "False"]
    plain = start_worker(entry, None, {protocol.SAVE_ON_ENV: "none"})
    out, _ = plain.proc.communicate(timeout=30)
    assert out.decode().split() == ["False", "False", "False"]
    for started in (worker, plain):
        os.close(next(fd for fd, stream in started.pipes.items() if stream == EVENTS))
