"""The global batch kept constant when a job restarts on fewer (or more) ranks.

When zlaunch drops a lost host and restarts on the rest (``--min-nodes``), the ranks' config
still describes the old world. ``train_batch_size`` is what the optimizer's arithmetic (and the
learning-rate schedule tuned for it) depends on, so it stays; the micro batch stays (it is
what fits in memory); the gradient accumulation steps take up the difference. The controller
works the numbers out before the restart (`kept_batch`) and passes them to the ranks in
``ZLAUNCH_BATCH``, which `runtime.initialize` applies over whatever config the script loads
(`override_from_env`, `BatchOverride.apply`). Standard library only: both sides import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from zlaunch.wire.protocol import BATCH_ENV

__all__ = ["BatchError", "BatchOverride", "kept_batch", "override_from_env"]

C = TypeVar("C")


class BatchError(ValueError):
    """A global batch that cannot be kept at the new world size, or a malformed
    ``ZLAUNCH_BATCH``; each side says it as its own error (a config error, a launch error)."""


@dataclasses.dataclass(frozen=True)
class BatchOverride:
    train_batch_size: int
    micro_batch: int
    gradient_accumulation_steps: int

    def encode(self) -> str:
        return f"{self.train_batch_size},{self.micro_batch},{self.gradient_accumulation_steps}"

    def apply(self, config: C) -> C:
        """``config`` (a dataclass with DeepSpeed's three batch fields) with this batch."""
        return dataclasses.replace(
            config,
            train_batch_size=self.train_batch_size,
            train_micro_batch_size_per_gpu=self.micro_batch,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
        )


def kept_batch(train_batch_size: int, micro_batch: int, new_world: int) -> BatchOverride:
    """The batch triple at ``new_world`` ranks with ``train_batch_size`` samples per step."""
    if train_batch_size % (micro_batch * new_world):
        raise BatchError(
            f"train_batch_size {train_batch_size} cannot be kept on {new_world} ranks: it is "
            f"not a multiple of train_micro_batch_size_per_gpu {micro_batch} x {new_world} "
            "ranks; choose a global batch divisible by the micro batch at every world size "
            "--min-nodes allows"
        )
    return BatchOverride(
        train_batch_size, micro_batch, train_batch_size // (micro_batch * new_world)
    )


def override_from_env(env: Mapping[str, str]) -> BatchOverride | None:
    raw = env.get(BATCH_ENV)
    if not raw:
        return None
    try:
        tb, mb, gas = (int(v) for v in raw.split(","))
    except ValueError:
        raise BatchError(f"{BATCH_ENV}={raw[:40]!r}: expected TRAIN_BATCH,MICRO,GAS") from None
    if min(tb, mb, gas) < 1:
        raise BatchError(f"{BATCH_ENV}={raw!r}: every number must be at least 1")
    return BatchOverride(tb, mb, gas)
