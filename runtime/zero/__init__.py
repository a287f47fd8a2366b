"""ZeRO partitioning: flat layouts, gradient buckets, the partitioned optimizer, stage 3.

``runtime.zero.Init`` and ``runtime.zero.GatheredParameters`` are DeepSpeed's
``deepspeed.zero.Init`` / ``deepspeed.zero.GatheredParameters``. They load on first use, so
importing the pure-Python parts (``runtime.zero.partition``) stays free of torch.
"""

from __future__ import annotations

__all__ = [
    "Init",
    "GatheredParameters",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "get_z3_leaf_modules",
    "z3_leaf_module",
]
_LEAF = {"set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module"}


def __getattr__(name: str):
    if name in _LEAF:
        from . import leaf_modules

        return getattr(leaf_modules, name)
    if name in __all__:
        from . import init_context as init

        return getattr(init, name)
    raise AttributeError(f"module 'runtime.zero' has no attribute {name!r}")
