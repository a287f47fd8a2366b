"""A rank's metrics event checked field by field where the controller accepts it
(`zlaunch/wire/metrics_check.py`): a bad field is dropped and named, a bad step drops the
event, and what is kept renders in every view."""

from __future__ import annotations

import math

import pytest

from zlaunch.console.job_view import JobView
from zlaunch.wire.metrics_check import checked_metrics
from zlaunch.wire.metrics_format import format_line

BAD_FIELDS = [
    ("memory_bytes", math.nan),
    ("memory_bytes", math.inf),
    ("comm_bytes", -math.inf),
    ("samples", 10**400),
    ("total_steps", "abc"),
    ("step_time", "[red]"),
    ("samples_per_s", {"a": 1}),
    ("memory_kind", ["x"]),
    ("report", "yes"),
]


@pytest.mark.parametrize(("key", "value"), BAD_FIELDS)
def test_a_bad_metrics_field_is_dropped_and_named(key, value):
    verdict = checked_metrics({"kind": "metrics", "step": 1, "loss": 2.5, key: value})
    assert verdict.row == {"kind": "metrics", "step": 1, "loss": 2.5}
    (problem,) = verdict.problems
    assert problem.startswith(f"{key} ")
    format_line(verdict.row, "  ")  # the line every view prints does not crash


@pytest.mark.parametrize("step", [[1], "1", -1, 1.5, None, True, 2**80])
def test_a_metrics_event_with_a_bad_step_is_dropped_whole(step):
    verdict = checked_metrics({"kind": "metrics", "step": step, "loss": 1.0})
    assert verdict.row is None and "step" in verdict.problems[0]


def test_a_diverged_loss_is_kept_it_is_news_not_garbage():
    event = {"kind": "metrics", "step": 3, "loss": math.nan, "grad_norm": math.inf}
    assert checked_metrics(event).row == event
    assert "loss nan" in format_line(event)


def test_checked_rows_survive_the_views_derived_numbers():
    event = {"kind": "metrics", "step": 2, "total_steps": "abc", "step_time": math.nan}
    view = JobView.__new__(JobView)  # only the fields eta() reads
    view.latest, view.latest_at = checked_metrics(event).row, None
    assert view.eta() is None
