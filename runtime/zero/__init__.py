"""ZeRO partitioning: flat layouts, gradient buckets, the partitioned optimizer, stage 3.

``runtime.zero.Init`` and ``runtime.zero.GatheredParameters`` are DeepSpeed's
``deepspeed.zero.Init`` / ``deepspeed.zero.GatheredParameters``. They load on first use, so
importing the pure-Python parts (``runtime.zero.partition``) stays free of torch.
"""

from __future__ import annotations

__all__ = [
    "BufferSizes",
    "FlatLayout",
    "GatheredParameters",
    "GradReduction",
    "Init",
    "NormScope",
    "ShardingStrategy",
    "StepOutcome",
    "StrategyInputs",
    "build_strategy",
    "count_safetensors_parameters",
    "estimate_all",
    "get_z3_leaf_modules",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "z3_leaf_module",
]


def __getattr__(name: str):
    # Each name loads with its module on first use: importing this folder (and
    # `import runtime`, which the controller does to check a config) stays light.
    if name in ("build_strategy",):
        from runtime.zero import builder

        return getattr(builder, name)
    if name in ("BufferSizes", "count_safetensors_parameters", "estimate_all"):
        from runtime.zero import estimator

        return getattr(estimator, name)
    if name in ("GatheredParameters", "Init"):
        from runtime.zero import init_context

        return getattr(init_context, name)
    if name in (
        "get_z3_leaf_modules",
        "set_z3_leaf_modules",
        "unset_z3_leaf_modules",
        "z3_leaf_module",
    ):
        from runtime.zero import leaf_modules

        return getattr(leaf_modules, name)
    if name in ("NormScope", "StepOutcome"):
        from runtime.zero import optimizer

        return getattr(optimizer, name)
    if name in ("FlatLayout",):
        from runtime.zero import partition

        return getattr(partition, name)
    if name in ("GradReduction",):
        from runtime.zero import reduction

        return getattr(reduction, name)
    if name in ("ShardingStrategy", "StrategyInputs"):
        from runtime.zero import strategy

        return getattr(strategy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
