"""What the script hands `initialize` for its optimizer: param groups, optimizer, scheduler.

A script may pass an optimizer object, a callable building one, ``model_parameters`` (tensors
or param-group dicts), and an LR scheduler object or factory; anything it leaves out comes from
the config's ``optimizer`` / ``scheduler`` blocks. The engine's optimizer steps this rank's
master weights, so the torch optimizer is (re)built over those, never over the model's
parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from runtime.errors import InvalidValueError

__all__ = ["param_groups_of", "optimizer_factory", "build_lr_scheduler"]

ParamGroups = list[tuple[dict, list[torch.nn.Parameter]]]


def _split(groups) -> ParamGroups:
    return [({k: v for k, v in g.items() if k != "params"}, list(g["params"])) for g in groups]


def param_groups_of(module: torch.nn.Module, optimizer: Any, model_parameters: Any) -> ParamGroups:
    """(options, params) per optimizer param group, trainable parameters only, each once."""
    if isinstance(optimizer, torch.optim.Optimizer):
        raw = _split(optimizer.param_groups)
    elif model_parameters is not None:
        items = list(model_parameters)
        raw = _split(items) if items and isinstance(items[0], dict) else [({}, items)]
    else:
        raw = [({}, list(module.parameters()))]
    seen, groups = set(), []
    for opts, params in raw:
        keep = []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                keep.append(p)
        groups.append((opts, keep))
    if not any(params for _, params in groups):
        raise InvalidValueError("the model has no trainable parameters (none requires grad)")
    return groups


def optimizer_factory(
    client: Any, optimizer_config: Any
) -> Callable[[list[dict]], torch.optim.Optimizer]:
    """Builds the torch optimizer over the given param groups (the master weights)."""

    def make(param_groups: list[dict]) -> torch.optim.Optimizer:
        if isinstance(client, torch.optim.Optimizer):
            # Keep the client's object (a client scheduler may already hold it) but point
            # it at this rank's master weights.
            for target, new in zip(client.param_groups, param_groups, strict=True):
                target["params"] = new["params"]
            client.state.clear()
            return client
        if callable(client):
            return client(param_groups)
        if optimizer_config is None:
            raise InvalidValueError(
                'no optimizer: add an "optimizer" block to the config, or pass optimizer= '
                "to runtime.initialize"
            )
        from .optimizers import build_optimizer

        return build_optimizer(optimizer_config, param_groups)

    return make


def build_lr_scheduler(client: Any, scheduler_config: Any, optimizer: torch.optim.Optimizer):
    """The script's scheduler (an object that steps, or a factory called with the torch
    optimizer), else the config's, else None."""
    if client is not None:
        return client if hasattr(client, "step") else client(optimizer)
    if scheduler_config is None:
        return None
    from .lr_schedules import build_scheduler

    return build_scheduler(scheduler_config, optimizer)
