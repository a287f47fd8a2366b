"""The straggler scores as a table: who is named, when, once, and never on an even fleet."""

from __future__ import annotations

import math
import random

import pytest

from zlaunch.launcher.stragglers import MAX_CHARS, Finding, StragglerWatch, slow_text
from zlaunch.wire import checked_metrics, format_line

BASE = 0.100  # seconds of a rank's own work per step


def fleet(hosts: int, per_host: int = 8) -> dict[int, str]:
    return {r: f"node{r // per_host:03d}" for r in range(hosts * per_host)}


def feed(watch: StragglerWatch, steps: range, seconds, seed: int = 0) -> list[tuple[int, Finding]]:
    """Every rank's sample of every step, in step order; ``seconds(rank, step)`` gives the
    time before noise (±3%: even hardware). Returns (step fed, finding) pairs."""
    rng = random.Random(seed)
    out = []
    for step in steps:
        for rank in watch.hosts:
            value = seconds(rank, step) * rng.uniform(0.97, 1.03)
            out += [(step, f) for f in watch.add(rank, step, value)]
    return out


def test_an_even_fleet_of_1024_ranks_is_never_named():
    watch = StragglerWatch(fleet(128))
    assert feed(watch, range(200), lambda r, s: BASE) == []
    assert watch.slow == ()
    assert watch.scores is not None and watch.scores.spread < 1.1
    assert (watch.scores.first, watch.scores.last) == (180, 189)
    assert math.isclose(watch.scores.median, BASE, rel_tol=0.02)


def test_one_slow_host_of_1024_ranks_is_named_once_with_its_ranks_after_the_sustain_window():
    watch = StragglerWatch(fleet(128))  # window 10 steps, sustain 3 windows, threshold 1.25
    said = feed(watch, range(100), lambda r, s: BASE * (1.38 if 56 <= r <= 63 else 1.0))
    assert len(said) == 1
    step, finding = said[0]
    # the third window (steps 20-29) is scored once every rank has reported step 30
    assert (step, finding.step, finding.slow) == (30, 29, True)
    assert (finding.host, finding.ranks, finding.rank) == ("node007", tuple(range(56, 64)), None)
    assert abs(finding.factor - 1.38) < 0.03
    assert finding.text.startswith("slow: node007 at 1.3")
    assert finding.text.endswith("x the median step, ranks 56-63")
    assert watch.slow[0].host == "node007" and len(watch.slow) == 1
    score = watch.scores.hosts[0]
    assert score.host == "node007" and watch.scores.hosts[1].relative < 1.1
    # its own best window is no better than now: a relative, not an individual, slowness
    assert score.individual < 1.1 and watch.scores.relative[60] > 1.3


@pytest.mark.parametrize(
    "slow_step",
    [
        pytest.param(lambda s: 10 <= s < 30, id="two slow windows, below the sustain of three"),
        pytest.param(lambda s: s % 10 in (3, 7), id="two slow steps in every window"),
        pytest.param(lambda s: 7 <= s < 25, id="twenty slow steps across three windows"),
    ],
)
def test_blips_are_not_named(slow_step):
    watch = StragglerWatch(fleet(16))
    said = feed(watch, range(120), lambda r, s: BASE * (2.0 if r < 8 and slow_step(s) else 1.0))
    assert said == []


def test_a_host_that_recovers_is_said_once_slow_and_once_recovered():
    watch = StragglerWatch(fleet(4))
    said = feed(watch, range(150), lambda r, s: BASE * (1.6 if r // 8 == 2 and s < 60 else 1.0))
    assert [(step, f.host, f.slow) for step, f in said] == [
        (30, "node002", True),
        (90, "node002", False),
    ]
    assert said[1][1].text.startswith("node002 no longer slow: 1.0")
    assert watch.slow == ()


def test_a_lone_slow_rank_on_an_even_host_is_named_as_the_rank():
    watch = StragglerWatch(fleet(128))
    said = feed(watch, range(60), lambda r, s: BASE * (1.5 if r == 58 else 1.0))
    assert [(f.host, f.rank) for _, f in said] == [("node007", 58)]
    assert said[0][1].text.startswith("slow: rank 58 on node007 at 1.")


def test_a_fleet_that_slows_together_shows_in_the_individual_score_only():
    watch = StragglerWatch(fleet(8))
    said = feed(watch, range(80), lambda r, s: BASE * (1.5 if s >= 40 else 1.0))
    assert said == []
    assert watch.scores.spread < 1.1
    assert min(watch.scores.individual.values()) > 1.4


def test_a_rank_that_stops_reporting_does_not_hold_the_scores_back():
    watch = StragglerWatch(fleet(4))
    said = feed(watch, range(80), lambda r, s: BASE * (2.0 if 8 <= r < 16 else 1.0))
    assert [f.host for _, f in said] == ["node001"]
    for step in range(80, 120):  # rank 31 is gone; the others go on
        for rank in range(31):
            watch.add(rank, step, BASE)
    assert watch.scores.last >= 89  # windows closed without rank 31, after the lag
    assert 31 not in watch.scores.relative


def test_samples_that_cannot_be_scored_are_ignored():
    watch = StragglerWatch({0: "a", 1: "b"})
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        assert watch.add(0, 1, bad) == []
    assert watch.add(7, 1, BASE) == [] and watch.add(0, -3, BASE) == []
    assert watch._open == {}


def test_many_slow_hosts_are_one_bounded_line():
    watch = StragglerWatch(fleet(128))
    slow_hosts = set(range(0, 128, 3))  # 43 hosts, none adjacent
    said = feed(watch, range(40), lambda r, s: BASE * (1.4 if r // 8 in slow_hosts else 1.0))
    assert len(said) == len(slow_hosts)
    text = slow_text([f for _, f in said])
    assert text.startswith("slow: node[000,003,")
    assert "(43 hosts)" in text and "(344 ranks)" in text
    assert len(text) < 200


@pytest.mark.parametrize("kwargs", [{"threshold": 1.0}, {"window": 0}, {"sustain": 0}])
def test_settings_that_cannot_work_are_refused(kwargs):
    with pytest.raises(ValueError):
        StragglerWatch({0: "a"}, **kwargs)


def test_slow_hosts_and_lone_ranks_together_stay_within_a_metrics_text_field():
    hosts = [
        Finding(f"node{h:03d}", tuple(range(h * 8, h * 8 + 8)), 1.5, 29, True)
        for h in range(0, 128, 3)
    ]
    lone = [
        Finding(f"node{h:03d}", (h * 8 + 1,), 1.4, 29, True, h * 8 + 1) for h in range(1, 128, 3)
    ]
    text = slow_text(hosts + lone)
    assert len(text) <= MAX_CHARS
    assert text.startswith("slow: node[000,003,") and text.endswith("; and 43 ranks on other hosts")
    assert slow_text([]) == ""


def test_a_slow_field_on_the_metrics_row_is_kept_checked_and_printed():
    row = {
        "kind": "metrics",
        "source": "engine",
        "step": 31,
        "slow": "slow: node7 at 1.38x the median step, ranks 56-63",
    }
    assert checked_metrics(row).problems == ()
    assert format_line(row).endswith(" | slow: node7 at 1.38x the median step, ranks 56-63")
    assert "slow" not in format_line({**row, "slow": None})
    assert checked_metrics({**row, "slow": 3}).row == {k: v for k, v in row.items() if k != "slow"}


def test_a_rank_that_sends_a_far_step_moves_no_window_of_the_others():
    watch = StragglerWatch(fleet(4))
    said = []
    for step in range(60):
        for rank in watch.hosts:
            if rank == 5:  # a wrong step counter: far ahead, then back
                said += watch.add(rank, 10**9 + step, BASE)
            said += watch.add(rank, step, BASE * (1.6 if rank // 8 == 3 else 1.0))
    assert [f.host for f in said] == ["node003"]
    # one far window, opened before most ranks had reported: never more, never scored
    assert [i for i in watch._open if i > 10] == [10**8]
    assert watch.scores.last == 49
