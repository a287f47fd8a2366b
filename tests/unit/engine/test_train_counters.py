"""The engine's counters as one piece with its own checkpoint state."""

from __future__ import annotations

import pytest

from runtime.engine.train_counters import TrainCounters


def test_round_trip():
    counters = TrainCounters(global_steps=7, global_samples=56, micro_steps=14, skipped_steps=1)
    fresh = TrainCounters()
    fresh.load_state_dict(counters.state_dict())
    assert fresh == counters


def test_a_counter_the_checkpoint_lacks_keeps_its_value():
    counters = TrainCounters(micro_steps=5)
    counters.load_state_dict({"global_steps": 3})
    assert counters == TrainCounters(global_steps=3, micro_steps=5)


@pytest.mark.parametrize(
    "state,named",
    [
        ({"global_steps": "abc"}, "global_steps"),
        ({"global_steps": 3, "micro_steps": -1}, "micro_steps"),
        ({"skipped_steps": 1.5}, "skipped_steps"),
        ({"global_samples": True}, "global_samples"),
        ({"steps": 1}, "unknown counter 'steps'"),
        ([1, 2], "mapping"),
    ],
)
def test_a_bad_value_changes_nothing(state, named):
    counters = TrainCounters(global_steps=2, micro_steps=4)
    with pytest.raises(ValueError, match=named):
        counters.load_state_dict(state)
    assert counters == TrainCounters(global_steps=2, micro_steps=4)
