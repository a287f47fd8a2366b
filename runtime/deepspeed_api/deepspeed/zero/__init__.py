"""``deepspeed.zero``: `Init`, `GatheredParameters` and the ZeRO-3 leaf-module calls."""

from __future__ import annotations

from runtime.zero import (
    GatheredParameters,
    Init,
    get_z3_leaf_modules,
    set_z3_leaf_modules,
    unset_z3_leaf_modules,
    z3_leaf_module,
)

from .._missing import module_getattr

__all__ = [
    "GatheredParameters",
    "Init",
    "get_z3_leaf_modules",
    "register_external_parameter",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "z3_leaf_module",
]


def register_external_parameter(module, parameter) -> None:  # noqa: ARG001
    """DeepSpeed's hook for a parameter used outside the module that owns it. The runtime's
    stage 3 fetches a parameter whenever it is read (`runtime.zero.stage3.access`), so there is
    nothing to register; a parameter that is not partitioned needs nothing either."""


__getattr__ = module_getattr(__name__)
