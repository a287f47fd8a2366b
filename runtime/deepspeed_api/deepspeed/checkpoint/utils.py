"""``deepspeed.checkpoint.utils.clone_tensors_for_torch_save``."""

from __future__ import annotations

import torch

from .._missing import module_getattr

__all__ = ["clone_tensors_for_torch_save"]


def clone_tensors_for_torch_save(item, device: torch.device = torch.device("cpu")):  # noqa: B008
    """A copy of ``item`` (tensors, and lists, tuples and dicts of them) whose tensors own
    their storage on ``device``: saving a view would otherwise write its whole base tensor."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item


__getattr__ = module_getattr(__name__)
