"""A host held to a quarter core by a cgroup CPU quota, scored from the numbers measured on the
namespace test cluster (three hosts on two cores, one rank each, node2 throttled): per step and
rank the wall time, the time blocked in collectives and the time the rank's threads were held
off the CPU (milliseconds, steps 5-64 of a runtime job).

Most of node2's stall fell inside its collectives, so wall less blocked (the old own time) did
not name it; with the stall taken out of its waits (runtime/observe/profiling/busy.py) it is
named, exactly, and its peers are seen waiting for it."""

from __future__ import annotations

import pytest

import runtime.observe.profiling.busy as busy_module
from runtime.observe.profiling.busy import BusyClock
from zlaunch.launcher.stragglers import StragglerWatch, window_figure

HOSTS = {0: "node1", 1: "node2", 2: "node3"}
MEASURED = {  # rank: (wall, blocked, held off the CPU), ms per step
    0: (
        "37 36 29 27 80 25 20 59 19 21 61 19 20 65 17 75 24 25 73 22 26 49 24 56 27 22 61 23 87 "
        "30 68 22 77 23 18 65 22 66 30 71 35 72 26 66 33 19 64 73 32 37 39 28 71 21 21 59 19 18 "
        "60 34",
        "29 23 15 17 69 15 12 51 5 12 52 9 11 55 9 67 15 17 57 15 20 41 16 39 13 15 52 11 75 9 60 "
        "14 66 10 10 56 10 55 23 61 19 57 11 53 19 7 56 64 23 29 27 20 62 14 12 51 13 9 54 25",
        "25 20 17 4 8 8 6 6 14 4 17 7 6 9 9 6 9 5 32 14 8 12 16 22 15 6 7 15 23 17 12 9 15 12 8 "
        "17 15 14 17 8 17 23 14 18 16 9 12 9 14 11 18 4 29 4 13 9 12 14 20 26",
    ),
    1: (
        "32 45 38 17 88 22 17 56 24 18 58 22 23 61 23 70 27 22 70 29 25 40 32 56 30 13 69 25 85 "
        "22 67 24 78 21 20 64 29 70 20 80 31 61 29 76 32 52 24 81 35 20 56 28 65 18 20 64 14 20 "
        "57 30",
        "26 37 28 5 73 12 7 15 16 11 52 16 11 10 16 63 21 9 13 22 17 12 26 50 12 7 7 17 23 11 10 "
        "17 11 9 12 17 21 61 14 66 18 51 7 65 19 45 14 65 27 13 23 19 55 12 14 58 9 15 48 23",
        "4 10 17 11 135 5 14 102 8 3 77 4 15 143 16 58 18 12 103 11 18 59 13 113 33 8 75 13 79 "
        "14 102 7 62 8 2 58 13 58 12 67 22 87 16 57 18 42 27 91 21 11 88 24 121 7 6 50 5 2 45 8",
    ),
    2: (
        "32 46 28 25 79 25 24 55 18 24 58 21 18 63 18 78 21 28 63 26 25 49 24 65 26 13 65 23 82 "
        "29 68 24 78 21 19 68 22 66 26 75 33 66 29 68 36 23 63 79 27 27 48 28 67 25 13 60 21 23 "
        "61 25",
        "26 29 19 17 71 11 19 39 13 18 51 13 13 55 10 71 13 22 54 17 16 43 15 59 13 6 58 17 71 22 "
        "58 15 69 15 13 58 15 59 19 69 23 57 20 57 27 15 52 70 16 20 40 21 57 18 6 55 15 12 51 18",
        "7 18 7 13 6 27 13 34 6 16 17 17 10 17 8 10 10 13 16 9 19 9 14 13 22 7 3 2 9 4 9 12 11 8 "
        "6 23 6 5 3 5 8 6 6 10 2 6 29 37 22 12 15 11 16 16 8 10 7 14 33 8",
    ),
}


def measured(rank: int) -> list[tuple[float, float, float]]:
    wall, blocked, held = ([int(v) / 1000 for v in text.split()] for text in MEASURED[rank])
    return list(zip(wall, blocked, held, strict=True))


class _Held:
    """The run delays of one rank's steps, as `RunDelay.read` gives them: all of it on the
    collective threads (gloo's workers), the case the clock corrects in full."""

    def __init__(self):
        self.next = 0.0

    def read(self) -> tuple[float, float]:
        return 0.0, self.next


def clocked(rank: int, monkeypatch) -> list[tuple[float, float]]:
    """(own seconds, waited seconds) of every step as the rank's BusyClock computes them."""
    now = [100.0]
    monkeypatch.setattr(busy_module.time, "perf_counter", lambda: now[0])
    held = _Held()
    clock = BusyClock(held)
    clock.start()
    out = []
    for wall, blocked, stalled in measured(rank):
        now[0] += wall
        clock.on_done("all_reduce", 4, 4, blocked, blocked, 3)
        held.next = stalled
        own = clock.lap()
        assert own is not None
        out.append((own, clock.waited))
    return out


def test_the_throttled_host_is_named_exactly_from_its_measured_steps(monkeypatch):
    samples = {rank: clocked(rank, monkeypatch) for rank in HOSTS}
    watch = StragglerWatch(HOSTS)
    said = []
    for step in range(60):
        for rank in HOSTS:
            own, waited = samples[rank][step]
            said += watch.add(rank, step, own, waited)
    assert [(f.host, f.rank, f.slow) for f in said] == [("node2", None, True)]
    assert said[0].ranks == (1,) and 1.25 <= said[0].factor < 2.5
    assert said[0].text.startswith("slow: node2 at ")
    # its peers were seen waiting for it: its waits are the fleet's least by far
    scores = watch.scores
    assert scores is not None and scores.uncorroborated == ()
    assert scores.waited[1] < 0.5 * min(scores.waited[0], scores.waited[2])


def test_wall_less_blocked_did_not_name_it():
    """The old own time: the stall inside collectives counted as waiting for peers."""
    watch = StragglerWatch(HOSTS)
    said = []
    for step in range(60):
        for rank in HOSTS:
            wall, blocked, _ = measured(rank)[step]
            said += watch.add(rank, step, max(wall - blocked, 1e-6))
    assert [f for f in said if f.host == "node2"] == []


def test_a_median_misses_a_stall_in_four_steps_of_ten_and_the_window_figure_does_not():
    steps = [0.060 if s in (1, 4, 6, 9) else 0.010 for s in range(10)]
    assert window_figure(steps) == pytest.approx((2 * 0.060 + 6 * 0.010) / 8)
    assert window_figure(steps) / 0.010 > 2.0
    one_blip = [0.010] * 9 + [1.0]  # a checkpoint in one step moves nothing
    assert window_figure(one_blip) == pytest.approx(0.010)


def test_a_long_own_time_its_peers_did_not_wait_for_names_nobody():
    """node2's own time reads 1.6x the median, but every rank waited as long as the others:
    the two sides disagree (its step boundaries drifted), so nothing is said, and so
    --slow-node exclude has nothing to act on."""
    watch = StragglerWatch(HOSTS)
    said = []
    for step in range(100):
        for rank in HOSTS:
            said += watch.add(rank, step, 0.016 if rank == 1 else 0.010, 0.010)
    assert said == [] and watch.slow == ()
    assert watch.scores is not None and watch.scores.uncorroborated == ("node2",)
    assert watch.scores.hosts[0].host == "node2" and watch.scores.hosts[0].relative > 1.5


def test_a_slow_host_its_peers_waited_for_is_named_and_an_even_fleet_is_not():
    slow, even = StragglerWatch(HOSTS), StragglerWatch(HOSTS)
    named, quiet = [], []
    for step in range(50):
        for rank in HOSTS:
            named += slow.add(
                rank, step, 0.016 if rank == 1 else 0.010, 0.0 if rank == 1 else 0.006
            )
            quiet += even.add(rank, step, 0.010 + 0.0003 * rank, 0.006)
    assert [(f.host, f.step) for f in named] == [("node2", 29)]
    assert quiet == [] and even.scores is not None and even.scores.uncorroborated == ()
