"""The global batch kept constant when a job restarts on fewer (or more) ranks.

When zlaunch drops a lost host and restarts on the rest (``--min-nodes``), the ranks' config
still describes the old world. ``train_batch_size`` is what the optimizer's arithmetic (and the
learning-rate schedule tuned for it) depends on, so it stays; the micro batch stays (it is
what fits in memory); the gradient accumulation steps take up the difference. zlaunch works
the numbers out before the restart (`batch_for_world`) and passes them to the ranks in
``ZLAUNCH_BATCH``, which `runtime.initialize` applies over whatever config the script loads.
Torch-free: the controller uses it too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from runtime.config import Config, ConfigError
from zlaunch.wire.protocol import BATCH_ENV

__all__ = ["BatchOverride", "batch_for_world", "override_from_env"]


@dataclasses.dataclass(frozen=True)
class BatchOverride:
    train_batch_size: int
    micro_batch: int
    gradient_accumulation_steps: int

    def encode(self) -> str:
        return f"{self.train_batch_size},{self.micro_batch},{self.gradient_accumulation_steps}"

    def apply(self, config: Config) -> Config:
        return dataclasses.replace(
            config,
            train_batch_size=self.train_batch_size,
            train_micro_batch_size_per_gpu=self.micro_batch,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
        )


def batch_for_world(config: Config, world: int, new_world: int) -> BatchOverride:
    """The batch triple at ``new_world`` ranks with the ``world``-rank global batch kept."""
    resolved = config.resolve(world)
    tb, mb = resolved.train_batch_size, resolved.train_micro_batch_size_per_gpu
    if tb % (mb * new_world):
        raise ConfigError(
            f"train_batch_size {tb} cannot be kept on {new_world} ranks: it is not a multiple "
            f"of train_micro_batch_size_per_gpu {mb} x {new_world} ranks; choose a global "
            "batch divisible by the micro batch at every world size --min-nodes allows"
        )
    return BatchOverride(tb, mb, tb // (mb * new_world))


def override_from_env(env: Mapping[str, str]) -> BatchOverride | None:
    raw = env.get(BATCH_ENV)
    if not raw:
        return None
    try:
        tb, mb, gas = (int(v) for v in raw.split(","))
    except ValueError:
        raise ConfigError(f"{BATCH_ENV}={raw[:40]!r}: expected TRAIN_BATCH,MICRO,GAS") from None
    if min(tb, mb, gas) < 1:
        raise ConfigError(f"{BATCH_ENV}={raw!r}: every number must be at least 1")
    return BatchOverride(tb, mb, gas)
