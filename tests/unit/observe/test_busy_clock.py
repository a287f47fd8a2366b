"""A rank's own step time: wall time between laps less the time it waited for its peers in
collectives (blocked, less the time its threads were held off the CPU meanwhile)."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

import runtime.observe.profiling.run_delay as run_delay_module
from runtime.observe.profiling.busy import BusyClock
from runtime.observe.profiling.run_delay import RunDelay


class FakeDelay:
    def __init__(self):
        self.main = self.others = 0.0

    def read(self) -> tuple[float, float]:
        main, others = self.main, self.others
        self.main = self.others = 0.0
        return main, others


def test_a_lap_is_the_wall_time_less_the_blocked_time():
    clock = BusyClock(FakeDelay())
    assert clock.lap() is None  # not started: no step to measure yet
    clock.start()
    time.sleep(0.05)
    clock.on_done("all_reduce", 4, 4, 0.03, 0.03, 2)
    clock.on_done("all_gather", 4, 4, 0.01, 0.01, 2)
    first = clock.lap()
    assert first is not None and 0.005 < first < 0.05  # 50 ms wall, 40 ms of it blocked
    assert clock.waited == pytest.approx(0.04)
    clock.start()  # a later forward does not restart the clock: steps run lap to lap
    time.sleep(0.02)
    second = clock.lap()
    assert second is not None and second >= 0.02
    clock.on_done("all_reduce", 4, 4, 5.0, 5.0, 2)  # more blocked than the wall: never negative
    assert clock.lap() == 0.0


def test_time_held_off_the_cpu_while_blocked_is_the_ranks_own(monkeypatch):
    now = [10.0]
    monkeypatch.setattr("runtime.observe.profiling.busy.time.perf_counter", lambda: now[0])
    delay = FakeDelay()
    clock = BusyClock(delay)
    clock.start()
    now[0] += 0.100  # a step of 100 ms, 80 of them blocked in collectives
    clock.on_done("all_reduce", 4, 4, 0.080, 0.080, 3)
    delay.others = 0.050  # gloo's threads held off the CPU for 50 ms of them
    delay.main = 0.020  # and the training thread for 20 ms of its step: 80% of it blocked
    own = clock.lap()
    assert clock.waited == pytest.approx(0.080 - 0.050 - 0.016)
    assert own == pytest.approx(0.100 - clock.waited)
    now[0] += 0.100  # held off for longer than it was blocked: it waited for nobody
    clock.on_done("all_reduce", 4, 4, 0.030, 0.030, 3)
    delay.others = 0.200
    assert clock.lap() == pytest.approx(0.100) and clock.waited == 0.0


def test_run_delay_counts_threads_that_wait_for_a_cpu():
    """Two threads hashing (the GIL released) on one CPU: each waits for it about half the time."""
    delay = RunDelay()
    if not delay.available or not hasattr(os, "sched_setaffinity"):
        pytest.skip("no /proc/self/task or CPU affinity here")
    data = b"x" * (1 << 20)
    stop = time.perf_counter() + 0.4

    def hash_until_stop():
        while time.perf_counter() < stop:
            hashlib.sha256(data).digest()

    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # threads started now inherit the one CPU
    try:
        threads = [threading.Thread(target=hash_until_stop) for _ in range(2)]
        for t in threads:
            t.start()
        delay._rescan()  # the new threads, from their run delay now on
        delay.read()
        time.sleep(0.3)
        main, others = delay.read()  # while both still hash
        for t in threads:
            t.join()
    finally:
        os.sched_setaffinity(0, cpus)
    assert others >= 0.05, (main, others)  # 2 threads x 300 ms on one CPU: ~300 ms waited
    assert main < 0.05  # the main thread slept
    delay._rescan()
    assert all(v >= 0.0 for v in delay.read())  # ended threads forgotten, nothing negative
    delay.close()


def test_without_proc_every_figure_is_zero(monkeypatch, tmp_path):
    monkeypatch.setattr(run_delay_module, "_TASKS", str(tmp_path / "absent"))
    delay = RunDelay()
    assert not delay.available and delay.read() == (0.0, 0.0)
