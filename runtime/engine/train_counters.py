"""The engine's step counters, one piece that owns its checkpoint state.

DeepSpeed scripts read (and some set) ``engine.global_steps``, ``global_samples``,
``micro_steps`` and ``skipped_steps``; the engine keeps them here and exposes them under those
names. Checkpoints take `state_dict` and give back `load_state_dict`, which refuses a value that
is not a non-negative integer before it changes anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from runtime.errors import InvalidValueError

__all__ = ["TrainCounters"]


@dataclass
class TrainCounters:
    global_steps: int = 0
    """Optimizer steps taken (skipped fp16 overflow steps included, as DeepSpeed counts)."""
    global_samples: int = 0
    """Samples consumed: train_batch_size per optimizer step."""
    micro_steps: int = 0
    """`engine.step()` calls: one per micro-batch."""
    skipped_steps: int = 0
    """Optimizer steps skipped for a gradient overflow."""

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: Any) -> None:
        """Take the counters a checkpoint holds; a counter it lacks keeps its value.

        Raises ValueError naming the counter when one is not a non-negative integer; nothing
        is changed then."""
        if not isinstance(state, dict):
            raise InvalidValueError(f"counters must be a mapping, got {type(state).__name__}")
        known = {f.name for f in dataclasses.fields(self)}
        values = {}
        for name, value in state.items():
            if name not in known:
                raise InvalidValueError(
                    f"unknown counter {name!r} (expected one of {sorted(known)})"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidValueError(
                    f"counter {name!r} must be a non-negative integer, got {value!r}"
                )
            values[name] = value
        for name, value in values.items():
            setattr(self, name, value)
