"""A rank's own step time: wall time between laps less the time blocked in collectives."""

from __future__ import annotations

import time

from runtime.observe.profiling.busy import BusyClock


def test_a_lap_is_the_wall_time_less_the_blocked_time():
    clock = BusyClock()
    assert clock.lap() is None  # not started: no step to measure yet
    clock.start()
    time.sleep(0.05)
    clock.on_done("all_reduce", 4, 4, 0.03, 0.03, 2)
    clock.on_done("all_gather", 4, 4, 0.01, 0.01, 2)
    first = clock.lap()
    assert first is not None and 0.005 < first < 0.05  # 50 ms wall, 40 ms of it blocked
    clock.start()  # a later forward does not restart the clock: steps run lap to lap
    time.sleep(0.02)
    second = clock.lap()
    assert second is not None and second >= 0.02
    clock.on_done("all_reduce", 4, 4, 5.0, 5.0, 2)  # more blocked than the wall: never negative
    assert clock.lap() == 0.0
