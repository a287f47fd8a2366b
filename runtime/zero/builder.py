"""The one place that picks a sharding strategy for the config's ZeRO stage.

Apart from `strategy` (the protocol both kinds implement), so the protocol does not import its
own implementations.
"""

from __future__ import annotations

from .strategy import ShardingStrategy, StrategyInputs

__all__ = ["build_strategy"]


def build_strategy(inputs: StrategyInputs) -> ShardingStrategy:
    if inputs.config.zero_optimization.stage == 3:
        from .stage3 import build_stage3

        return build_stage3(inputs)
    from .flat_strategy import build_flat_strategy

    return build_flat_strategy(inputs)
