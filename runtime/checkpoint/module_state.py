"""The module's tensors that are not trained: buffers, frozen parameters, tied names.

Trained parameters travel as pieces of the master weights. Everything else in the module's
state dict is stored whole from rank 0 ("extra" tensors): buffers, and frozen parameters
(LoRA's base model). A frozen parameter that stage 3 partitioned is known by its unit: saving
gathers it (every rank takes part, in state-dict order), loading writes each rank's part.
A name tied to a trained parameter is recorded as an alias, not stored twice.
"""

from __future__ import annotations

import torch

__all__ = ["module_tensors", "is_frozen_parameter", "gather_extra", "load_extra"]


def module_tensors(
    module: torch.nn.Module, trained: set[str]
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(aliases: tied name -> trained name, extra: state_dict entries that are not trained)."""
    canonical = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), name)
    aliases = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        first = canonical[id(p)]
        if name != first and first in trained:
            aliases[name] = first
    # The tensors themselves (keep_vars): a partitioned frozen parameter is known by its unit.
    extra = {
        k: v
        for k, v in module.state_dict(keep_vars=True).items()
        if k not in trained and k not in aliases
    }
    return aliases, extra


def is_frozen_parameter(t: torch.Tensor) -> bool:
    return isinstance(t, torch.nn.Parameter) and not t.requires_grad


def _frozen_unit(t: torch.Tensor):
    """The stage-3 unit holding ``t`` partitioned (a frozen parameter), or None."""
    from runtime.zero.stage3 import Unit

    owner = getattr(t, "_zero_owner", None)
    return owner if isinstance(owner, Unit) else None


def gather_extra(extra: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """``extra``'s values to write: detached, partitioned frozen parameters' full values as CPU
    copies on rank 0 (every rank takes part in each unit's all-gather, in state-dict order)."""
    out = {}
    for name, t in extra.items():
        unit = _frozen_unit(t)
        if unit is None:
            out[name] = t.detach()
            continue
        unit.gather_for_user()
        try:
            if rank == 0:
                out[name] = t.detach().to("cpu", copy=True)
        finally:
            unit.release_for_user(None)
    return out


@torch.no_grad()
def load_extra(module: torch.nn.Module, extra: dict[str, torch.Tensor], rank: int) -> None:
    """Copy loaded extra tensors into the module (a partitioned one: this rank's part)."""
    module_state = module.state_dict(keep_vars=True)
    for name, t in extra.items():
        target = module_state[name]
        unit = _frozen_unit(target)
        if unit is not None:
            unit.load_values(target, t, rank)
        else:
            target.data.copy_(t)
