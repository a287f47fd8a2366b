"""Busy is not gone: the silence clock counts only the judge's own running time, and the
allowances grow with the job (zlaunch/wire/liveness.py)."""

from __future__ import annotations

import pytest

from zlaunch.wire.liveness import (
    AGENT_SILENCE_MARGIN,
    BASE_HEARTBEAT_TIMEOUT,
    MAX_HEARTBEAT_TIMEOUT,
    SilenceClock,
    agent_silence_timeout,
    heartbeat_timeout,
)


@pytest.mark.parametrize(
    ("ranks", "seconds"),
    [(1, 5.0), (6, 5.0), (64, 5.0), (128, 7.0), (256, 11.0), (800, 28.0), (1024, 30.0)],
)
def test_the_heartbeat_allowance_grows_with_the_job_and_is_capped(ranks, seconds):
    assert heartbeat_timeout(ranks) == pytest.approx(seconds)
    assert agent_silence_timeout(ranks) == pytest.approx(seconds + AGENT_SILENCE_MARGIN)


def test_a_small_job_keeps_the_five_second_heartbeat_the_fault_tests_expect():
    # The controller's route cut for 10 s must still stop a 3-host job's node.
    assert heartbeat_timeout(3) == BASE_HEARTBEAT_TIMEOUT < 10.0
    assert heartbeat_timeout(10**6) == MAX_HEARTBEAT_TIMEOUT


def test_silence_grows_while_the_judge_runs_on_time():
    clock = SilenceClock(2, now=100.0, turn=1.0)
    for t in (100.5, 101.0, 101.5, 102.0, 102.5, 103.0):  # turns every half second
        assert clock.awake(t) == 0.0
    clock.heard(1, 101.0)
    assert clock.silent_for(0, 103.0) == pytest.approx(3.0)
    assert clock.silent_for(1, 103.0) == pytest.approx(2.0)


def test_a_judge_that_did_not_run_does_not_count_that_time_as_silence():
    clock = SilenceClock(1, now=100.0, turn=1.0)
    clock.awake(100.5)
    # Not scheduled for 8 s (a machine starting a thousand workers): 7 s beyond the turn.
    assert clock.awake(108.5) == pytest.approx(7.0)
    assert clock.silent_for(0, 108.5) == pytest.approx(1.5)
    # A peer that is really gone is still found: silence grows again while the judge runs.
    for t in (109.0, 109.5, 110.0, 110.5, 111.0):
        clock.awake(t)
    assert clock.silent_for(0, 111.0) == pytest.approx(4.0)


def test_a_peer_heard_during_the_judges_absence_is_not_silent():
    clock = SilenceClock(1, now=0.0, turn=1.0)
    clock.heard(0, 4.0)  # a reader thread noted bytes while the loop was away
    clock.awake(6.0)  # the loop comes back 6 s later: 5 s forgiven
    assert clock.silent_for(0, 6.0) == 0.0  # never negative
    assert clock.silent_for(0, 8.0) == pytest.approx(2.0)


def test_a_clock_going_backwards_forgives_nothing():
    clock = SilenceClock(1, now=10.0, turn=1.0)
    assert clock.awake(9.0) == 0.0
    assert clock.awake(10.5) == 0.0
    assert clock.silent_for(0, 10.5) == pytest.approx(0.5)
