"""The optimizer's state in a checkpoint: hyperparameters and scalar state as JSON, per group.

Element-wise state (Adam's moments) travels as pieces (`pieces`); what is left per param group
is the hyperparameters (lr, betas, ...) and the scalar state of its masters (Adam's ``step``),
which every master of a group shares. Read through the engine optimizer's torch-like
accessors (``param_groups``, ``state``, ``kind``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .pieces import PARAM, StagedRange, is_element_state

__all__ = ["saved_optimizer", "check_saved_optimizer", "load_optimizer_state"]

# Param-group keys that say how this process computes, not what it trains: kept as they are.
IMPLEMENTATION_KEYS = frozenset({"fused", "foreach", "capturable", "differentiable"})


def _scalar_state(optimizer) -> list[dict[str, Any]]:
    """Per param group: the non-element state of its masters (e.g. Adam's step)."""
    out = []
    for group in optimizer.param_groups:
        scalars: dict[str, Any] = {}
        on_device: list[str] = []
        for master in group["params"]:
            for k, v in optimizer.state.get(master, {}).items():
                if is_element_state(v, master) or k in scalars:
                    continue
                scalars[k] = v.detach().cpu().clone() if torch.is_tensor(v) else v
                if torch.is_tensor(v) and v.device.type != "cpu":
                    on_device.append(k)
        out.append({"values": jsonable.encode(scalars, "optimizer state"), "on_device": on_device})
    return out


def saved_optimizer(optimizer) -> dict[str, Any]:
    """The manifest's ``optimizer`` entry."""
    return {
        "class": optimizer.kind,
        "param_groups": [
            jsonable.encode(
                {k: v for k, v in g.items() if k != "params"}, f"optimizer param group {i}"
            )
            for i, g in enumerate(optimizer.param_groups)
        ],
        "scalar_state": _scalar_state(optimizer),
    }


def check_saved_optimizer(saved: dict, optimizer, manifest_path: str):
    """The saved ``(param groups, scalar state)``, after checking they fit ``optimizer``."""
    saved_class = saved.get("class")
    if saved_class and saved_class != optimizer.kind:
        raise CheckpointError(
            f"{manifest_path}: the optimizer state is {saved_class}'s, this engine runs "
            f"{optimizer.kind}; pass load_optimizer_states=False to load only the weights"
        )
    groups = saved.get("param_groups") or []
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"{manifest_path}: {len(groups)} optimizer param groups saved, the optimizer has "
            f"{len(optimizer.param_groups)}"
        )
    return groups, saved.get("scalar_state") or []


def _master_state(master, values, on_device, per_kind) -> dict[str, Any]:
    state = {}
    for k, v in values.items():
        if torch.is_tensor(v):
            v = v.clone().to(master.device if k in on_device else "cpu")
        state[k] = v
    for kind, parts in per_kind.items():
        if kind == PARAM:
            continue
        buf = torch.zeros_like(master, dtype=torch.float32)
        for at, t in parts:
            buf.narrow(0, at, t.numel()).copy_(t)
        state[kind] = buf.to(master.dtype) if master.dtype != buf.dtype else buf
    return state


@torch.no_grad()
def load_optimizer_state(optimizer, staged: list[StagedRange], scalars) -> None:
    """Replace the hyperparameters and state of every master with the staged ones."""
    groups, scalar_state = scalars
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        for k, v in saved.items():
            if k not in IMPLEMENTATION_KEYS:
                group[k] = v
    for pg, group in enumerate(optimizer.param_groups):
        saved = scalar_state[pg] if pg < len(scalar_state) else {"values": {}, "on_device": []}
        values = jsonable.decode(saved.get("values", {}))
        on_device = set(saved.get("on_device", []))
        masters = {id(m) for m in group["params"]}
        for master, per_kind in staged:
            if id(master) not in masters:
                continue
            state = _master_state(master, values, on_device, per_kind)
            if state:
                optimizer.state[master] = state
            else:
                optimizer.state.pop(master, None)
