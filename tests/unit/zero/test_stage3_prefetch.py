"""Stage 3's fetch planner on plain integers: reuse distances, prefetch, keeping, divergence."""

from __future__ import annotations

import math

from runtime.zero.stage3.prefetch import FetchPlanner, reuse_distances


def test_reuse_distance_counts_elements_fetched_in_between():
    # units 0,1,2 in forward, 2,1,0 in backward; sizes 10, 20, 30: unit 0 waits for
    # 1, 2, 2, 1 (100 elements), unit 1 for 2, 2 (60), unit 2 for nothing
    events, numels = [0, 1, 2, 2, 1, 0], [10, 20, 30]
    assert reuse_distances(events, numels) == [100, 60, 0, math.inf, math.inf, math.inf]


def _planner(prefetch=1000, reuse=0):
    p = FetchPlanner([10, 20, 30, 40], prefetch_numel=prefetch, max_reuse=reuse)
    p.begin_pass()
    for u in [0, 1, 2, 3, 3, 2, 1, 0]:
        p.record(u)
    p.end_pass()
    return p


def test_first_pass_becomes_the_trace_and_nothing_is_planned_before():
    p = FetchPlanner([10, 20], prefetch_numel=100, max_reuse=100)
    p.begin_pass()
    assert p.record(0) is True
    assert list(p.prefetch(fits=lambda u: True, released=lambda u: True)) == []
    assert p.keep_after_use(0) is False
    p.record(1)
    p.end_pass()
    assert p.trace == [0, 1]


def test_prefetch_follows_the_trace_within_the_budget_and_the_live_bound():
    p = _planner(prefetch=60)
    p.begin_pass()
    p.record(0)
    # next on the trace: 1 (20), 2 (30) -> 50 <= 60; 3 (40) would exceed the budget
    assert list(p.prefetch(fits=lambda u: True, released=lambda u: True)) == [1, 2]
    # already gathered units cost budget but are not gathered again
    assert list(p.prefetch(fits=lambda u: True, released=lambda u: u != 1)) == [2]
    # the live bound stops the walk at the first unit that does not fit
    assert list(p.prefetch(fits=lambda u: u != 1, released=lambda u: True)) == []


def test_keep_only_units_used_again_within_the_reuse_distance():
    p = _planner(reuse=0)
    p.begin_pass()
    for u in [0, 1, 2, 3]:
        p.record(u)
    assert p.keep_after_use(3) is True  # fetched again right away in backward
    assert p.keep_after_use(2) is False  # unit 3 (40 elements) twice in between
    p.max_reuse = 80
    assert p.keep_after_use(2) is True


def test_leaving_the_trace_stops_planning_and_the_pass_becomes_the_trace():
    p = _planner()
    p.begin_pass()
    p.record(0)
    assert p.record(2) is False  # the trace says 1
    assert list(p.prefetch(fits=lambda u: True, released=lambda u: True)) == []
    assert p.keep_after_use(0) is False
    for u in [2, 0]:
        p.record(u)
    p.end_pass()
    assert p.trace == [0, 2, 2, 0]
    p.begin_pass()
    assert p.on_trace is True
