"""Stages 0-2: a write under ``GatheredParameters(..., modifier_rank=r)`` reaches every rank and
the master weights.

At stages 0-2 every rank holds every parameter whole (a view of the flat buffer), so there is
nothing to gather; but the parameter is not where the optimizer step starts from. Under mixed
precision (or optimizer offload) the step updates an fp32 master copy and writes it back over
the parameters, and at stages 1-2 each rank's shard is all-gathered over the other ranks'
copies. A write to the parameter alone is therefore undone at the next step, and the other
ranks never see rank ``r``'s value (DeepSpeed drops such writes at stages 0-2). What a user
means by ``modifier_rank`` is "make this value everyone's": on a clean exit of the block the
parameter is broadcast from rank ``r`` and copied into the part of the master this rank owns,
as stage 3 does for its shards (`stage3.units.Unit.write_back`).

Each trained parameter carries one `FlatParamWriteBack` as ``param._zero_writeback`` (not
``_zero_owner``: that one says the parameter is partitioned, which these are not).
"""

from __future__ import annotations

import torch

from .flat import FlatBuffer
from .optimizer import ZeroOptimizer
from .partition import FlatGroup, ParamSlot

__all__ = ["FlatParamWriteBack", "attach_write_backs"]


def _dropped():
    """A pickled or deep-copied parameter loses its tie to the engine."""
    return None


class FlatParamWriteBack:
    """The way back from a user's write to one stage 0-2 parameter into the engine's state."""

    def __init__(
        self,
        param: torch.nn.Parameter,
        flat: FlatBuffer,
        optimizer: ZeroOptimizer,
        group_index: int,
        slot: ParamSlot,
    ):
        self._param = param
        self._flat = flat
        self._optimizer = optimizer
        self._group_index = group_index
        self._slot = slot

    def __reduce__(self):
        return (_dropped, ())

    @property
    def _group(self) -> FlatGroup:
        return self._flat.layout.groups[self._group_index]

    def full_fp32(self, param: torch.nn.Parameter) -> torch.Tensor:
        """``param``'s (this write-back's parameter's) fp32 master, whole; gathered at stages
        1-2, so a collective there. Called as a stage-3 unit's `full_fp32` is."""
        assert param is self._param
        full = self._optimizer.full_master(self._group_index)
        return full[self._slot.offset : self._slot.end].view(self._slot.shape).clone()

    def gather_for_user(self) -> None:
        """Nothing to gather: the parameter is whole on every rank."""

    @torch.no_grad()
    def release_for_user(self, modifier_rank: int | None) -> None:
        if modifier_rank is None:
            return
        view = self._flat.param_view(self._group, self._slot)
        p = self._param
        if p.data.data_ptr() != view.data_ptr() or p.data.shape != view.shape:
            # ``p.data = new_tensor`` inside the block: take its values and point the
            # parameter back into the flat buffer the engine reduces and steps.
            if p.data.numel() != view.numel():
                from ..errors import InvalidValueError

                raise InvalidValueError(
                    f"GatheredParameters: {self._slot.name} was given {p.data.numel()} values "
                    f"for its {view.numel()} elements; write into the parameter in place"
                )
            view.copy_(p.data.reshape(view.shape))
            p.data = view
        self._optimizer.comm.broadcast(view, src=modifier_rank)
        self._optimizer.reload_master_range(self._group_index, self._slot.offset, self._slot.end)


def attach_write_backs(
    flat: FlatBuffer, optimizer: ZeroOptimizer, params_by_group: list[list[torch.nn.Parameter]]
) -> None:
    """Give every trained parameter its `FlatParamWriteBack`."""
    for gi, (g, params) in enumerate(zip(flat.layout.groups, params_by_group, strict=True)):
        for slot, p in zip(g.slots, params, strict=True):
            p._zero_writeback = FlatParamWriteBack(p, flat, optimizer, gi, slot)
