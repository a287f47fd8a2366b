"""How a stage-3 unit's full values are gathered: plainly, quantized (ZeRO++ qwZ), or from the
secondary shards inside a small group of ranks (ZeRO++ hpZ).

* Plain: every rank loads its shard of the unit into its place in ``Unit.full`` and the unit is
  all-gathered over the data-parallel group.
* qwZ (``zero_quantized_weights``; ``zero_quantized_nontrainable_weights`` for frozen units
  only): every rank packs its shard as int8 blocks with fp32 scales (`zero.quantize`,
  `WEIGHT_QUANTIZER`), the packed bytes are all-gathered, and every rank dequantizes all N
  shards, its own included, so every rank computes with the same weights. The shards in the
  store (and the fp32 master weights) are never touched: only the gathered copy is
  approximate. A gather that must be exact (`GatheredParameters`, saving, a write-back) is
  never quantized, and a quantized gathered copy is gathered again exactly for it.
* hpZ (``zero_hpz_partition_size: k``): the ranks form groups of k consecutive ranks. The
  first gather of a unit in a training pass (forward + backward) goes over the whole group,
  and each rank keeps a *secondary shard*: its 1/k of the unit's gathered values, within its
  group. Every later gather of that unit in the pass (backward's, and a prefetch for backward
  issued while forward still runs) all-gathers those secondary shards inside the group only
  (k ranks, usually one node) instead of the whole world. The secondary shard is a copy of
  exactly the values forward computed with, so backward uses the same weights as plain stage
  3 would (bit for bit; with qwZ, the same dequantized values forward used). It serves only
  the pass that filled it and never past an optimizer step. Cost: 1/k of the unit per rank,
  kept between passes.

Persistent units (gathered once, refreshed after each step) are always gathered plainly, as
DeepSpeed gathers its persistent parameters: qwZ leaves them exact. When that makes qwZ quantize
less than the user may think (a small model whose parameters are all below
``stage3_param_persistence_threshold`` quantizes nothing), `exact_gathers_note` says so once,
with the share that stays exact and the key that changes it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.distributed import Communicator, Handle

from ...errors import InvalidValueError
from ..quantize import BlockQuantizer
from .units import Unit, param_numel

__all__ = [
    "GRAD_QUANTIZER",
    "WEIGHT_QUANTIZER",
    "GatherNote",
    "SecondaryShards",
    "UnitFetch",
    "build_fetch",
    "exact_gathers_note",
    "hpz_size",
]

WEIGHT_QUANTIZER = BlockQuantizer(bits=8, block=2048)
"""qwZ: int8, one fp32 scale per 2048 elements (about 25% of fp32's bytes, 50% of bf16's)."""
GRAD_QUANTIZER = BlockQuantizer(bits=8, block=512)
"""qgZ: int8, one fp32 scale per 512 elements (smaller blocks: gradients have outliers)."""


def hpz_size(zero, comm: Communicator, local_world_size: str | None) -> int:
    """The checked ``zero_hpz_partition_size``: 1 (off) or a size dividing the world size and
    the ranks per node (``local_world_size``, LOCAL_WORLD_SIZE, when the launcher set it)."""
    k = int(zero.zero_hpz_partition_size)
    key = "zero_optimization.zero_hpz_partition_size"
    if k <= 1 or comm.world_size == 1:
        return 1
    if comm.world_size % k:
        raise InvalidValueError(
            f"{key} = {k} does not divide the {comm.world_size} data-parallel ranks; use a "
            f"divisor of {comm.world_size} (usually the GPUs per node), or 1 to turn hpZ off"
        )
    if local_world_size and local_world_size.isdigit() and int(local_world_size) % k:
        raise InvalidValueError(
            f"{key} = {k} does not divide the {local_world_size} ranks per node: a group "
            "would span nodes, and hpZ keeps backward's gathers inside a node; use a divisor "
            f"of {local_world_size}, or 1 to turn hpZ off"
        )
    if not comm.is_world:
        raise InvalidValueError(
            f"{key} = {k} is not supported with model parallelism (an mpu): the hpZ groups "
            "are made from the whole world; set it to 1"
        )
    return k


class SecondaryShards:
    """hpZ: this rank's secondary shard of each unit, and the group that gathers them."""

    def __init__(self, comm: Communicator, size: int):
        self.size = size
        self.comm = comm.split(size, "hpz")
        self._shards: dict[int, torch.Tensor] = {}
        self._stamps: dict[int, tuple[int, int, bool]] = {}
        """Unit index -> (pass, optimizer step, exact) of the values the shard holds."""

    def _range(self, u: Unit) -> tuple[int, int]:
        n = u.numel // self.size
        i = self.comm.rank
        return i * n, (i + 1) * n

    def keep(self, u: Unit, pass_id: int, version: int) -> None:
        """Copy this rank's secondary part of ``u``'s freshly gathered values."""
        lo, hi = self._range(u)
        shard = self._shards.get(u.index)
        if shard is None:
            shard = torch.empty(hi - lo, dtype=u.full.dtype, device=u.full.device)
            self._shards[u.index] = shard
        shard.copy_(u.full[lo:hi])
        self._stamps[u.index] = (pass_id, version, u.exact)

    def holds(self, u: Unit, pass_id: int, version: int, exact: bool) -> bool:
        stamp = self._stamps.get(u.index)
        return stamp is not None and stamp[:2] == (pass_id, version) and (stamp[2] or not exact)

    def gather(self, u: Unit) -> Handle:
        lo, hi = self._range(u)
        own = u.full[lo:hi]
        own.copy_(self._shards[u.index])
        u.exact = self._stamps[u.index][2]
        return self.comm.all_gather(u.full, own, async_op=True)

    def forget(self, u: Unit) -> None:
        self._stamps.pop(u.index, None)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._shards.values())


class UnitFetch:
    """Gathers units for `stage3.live.LiveUnits`: plain, qwZ or hpZ (see the module)."""

    def __init__(
        self,
        comm: Communicator,
        *,
        quantize_trained: bool = False,
        quantize_frozen: bool = False,
        secondary: SecondaryShards | None = None,
    ):
        self.comm = comm
        self.quantize_trained = quantize_trained
        self.quantize_frozen = quantize_frozen
        self.secondary = secondary

    def _quantized(self, u: Unit) -> bool:
        return self.quantize_frozen if u.frozen else self.quantize_trained

    def gather(self, u: Unit, *, exact: bool, pass_id: int, version: int) -> Handle:
        """Start gathering ``u.full`` (its storage allocated); the caller waits on the handle.
        ``exact``: the values must be the shards' own (no quantization)."""
        sec = self.secondary
        if sec is not None and sec.holds(u, pass_id, version, exact):
            return sec.gather(u)
        quantize = not exact and self._quantized(u) and self.comm.world_size > 1
        handle = self._quantized_gather(u) if quantize else self._plain_gather(u)
        u.exact = not quantize
        if sec is not None:
            handle = handle.followed_by(lambda: sec.keep(u, pass_id, version))
        return handle

    def forget(self, u: Unit) -> None:
        """``u``'s shards were rewritten outside a step: its secondary copy is out of date."""
        if self.secondary is not None:
            self.secondary.forget(u)

    def _own_shard(self, u: Unit) -> torch.Tensor:
        lo, hi = u.group.shard_range(self.comm.rank)
        own = u.full[lo:hi]
        u.store.load_into(u.group, own)
        return own

    def _plain_gather(self, u: Unit) -> Handle:
        own = self._own_shard(u)
        return self.comm.all_gather(u.full, own, async_op=True)

    def _quantized_gather(self, u: Unit) -> Handle:
        q, n = WEIGHT_QUANTIZER, self.comm.world_size
        own = self._own_shard(u)
        shard_numel = own.numel()
        packed = q.packed_nbytes(shard_numel)
        received = torch.empty(n * packed, dtype=torch.uint8, device=u.full.device)
        mine = received[self.comm.rank * packed : (self.comm.rank + 1) * packed]
        q.quantize(own, out=mine)
        handle = self.comm.all_gather(received, mine, async_op=True)
        full = u.full

        def dequantize() -> None:
            full.view(n, shard_numel).copy_(q.dequantize(received, shard_numel))

        return handle.followed_by(dequantize)


def build_fetch(zero, comm: Communicator) -> UnitFetch:
    """The fetch the config asks for (collective when hpZ is on: it creates the groups)."""
    k = hpz_size(zero, comm, os.environ.get("LOCAL_WORLD_SIZE"))
    return UnitFetch(
        comm,
        quantize_trained=bool(zero.zero_quantized_weights),
        quantize_frozen=bool(
            zero.zero_quantized_weights or zero.zero_quantized_nontrainable_weights
        ),
        secondary=SecondaryShards(comm, k) if k > 1 else None,
    )


@dataclass(frozen=True)
class GatherNote:
    """What the log says once about the quantized gathers: a `logging` level and a line."""

    level: int
    message: str


def _elements(u: Unit) -> int:
    return sum(s.numel for s in u.group.slots)


def exact_gathers_note(
    units: Sequence[Unit], fetch: UnitFetch, threshold: int
) -> GatherNote | None:
    """Which units qwZ leaves exact and why, or None when it quantizes every unit it covers
    (or is off). A warning when it quantizes less than half of the elements it was asked to
    (nothing at all, typically: every parameter at or below ``threshold``, the persistence
    threshold); a plain note otherwise."""
    if not (fetch.quantize_trained or fetch.quantize_frozen):
        return None
    key = "zero_quantized_weights"
    if not fetch.quantize_trained:
        key = "zero_quantized_nontrainable_weights"
    covered = [u for u in units if (fetch.quantize_frozen if u.frozen else fetch.quantize_trained)]
    total = sum(_elements(u) for u in covered)
    if not covered:
        return GatherNote(
            logging.WARNING,
            f"{key} quantizes nothing: no frozen parameter of more than "
            f"stage3_param_persistence_threshold = {threshold:,} elements is partitioned "
            "(frozen parameters at or below it stay whole on every rank and are never "
            "gathered)",
        )
    if fetch.comm.world_size == 1:
        return GatherNote(
            logging.WARNING,
            f"{key} quantizes nothing at 1 data-parallel rank: no gather leaves the rank, so "
            "every unit is used exactly",
        )
    exact = [u for u in covered if u.persistent]
    if not exact:
        return None
    kept = sum(_elements(u) for u in exact)
    why = (
        f"persistent parameters (each of at most stage3_param_persistence_threshold = "
        f"{threshold:,} elements) are gathered once after every optimizer step and never "
        "quantized, as DeepSpeed does"
    )
    if kept == total:
        largest = max(param_numel(p) for u in exact for p in u.params)
        return GatherNote(
            logging.WARNING,
            f"{key} quantizes nothing in this model: all {total:,} parameter elements are "
            f"persistent; {why}. To quantize their gathers set "
            f"stage3_param_persistence_threshold below {largest:,} (the largest parameter), "
            "or to 0",
        )
    share = kept / total
    quantized = len(covered) - len(exact)
    return GatherNote(
        logging.WARNING if share > 0.5 else logging.INFO,
        f"{key}: {quantized} unit(s) quantized; {kept:,} of {total:,} parameter elements "
        f"({share:.0%}) stay exact: {why}. A lower stage3_param_persistence_threshold "
        "(0 partitions every parameter) quantizes them too",
    )
