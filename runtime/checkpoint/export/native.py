"""Any readable checkpoint (a DeepSpeed one) as this runtime's own format, one shard.

Everything a load needs comes along: fp32 masters and every optimizer element state as
pieces, optimizer hyperparameters and scalar state, LR scheduler, loss scaler, counters and
client state in the manifest, committed atomically (`storage.write_checkpoint`). The result
loads at any world size and stage like any native checkpoint. The shard is built in memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .. import jsonable
from ..storage import Piece, write_checkpoint

__all__ = ["write_native"]


def _optimizer_entry(saved: dict | None) -> dict | None:
    if not saved:
        return None
    scalars = [
        {
            "values": jsonable.encode(jsonable.decode(s.get("values", {})), "optimizer state"),
            "on_device": [],
        }
        for s in saved.get("scalar_state") or []
    ]
    groups = [
        jsonable.encode(g, f"optimizer param group {i}")
        for i, g in enumerate(saved.get("param_groups") or [])
    ]
    return {"class": saved.get("class"), "param_groups": groups, "scalar_state": scalars}


def write_native(
    reader, dst: str, tag: str, progress: Callable[[int], None] = lambda n: None
) -> str:
    pieces = []
    kinds = sorted(reader.kinds)
    params = {}
    for name, shape in reader.shapes.items():
        per_kind = {kind: reader.read(name, kind) for kind in kinds}
        pieces.append((Piece(name, 0, per_kind["param"].numel()), per_kind))
        params[name] = {"shape": list(shape), "param_group": reader_group(reader, name)}
        progress(sum(t.numel() * t.element_size() for t in per_kind.values()))
    extra = {n: reader.read_extra(n) for n in reader.extra}

    def fields() -> dict:
        return {
            "zero_stage": reader.state("zero_stage"),
            "precision": "fp32",
            "dtypes": {"master": "float32", "model": "float32"},
            "params": params,
            "aliases": reader.state("aliases") or {},
            "excluded_frozen": [],
            "optimizer": _optimizer_entry(reader.state("optimizer")),
            "lr_scheduler": jsonable.encode(reader.state("lr_scheduler"), "lr_scheduler state"),
            "loss_scaler": jsonable.encode(reader.state("loss_scaler"), "loss scaler state"),
            "counters": reader.state("counters") or {},
            "client_state": jsonable.encode(reader.state("client_state") or {}, "client_state"),
            "hf_config": reader.state("hf_config"),
            "hf_generation_config": reader.state("hf_generation_config"),
        }

    return write_checkpoint(
        os.path.abspath(dst),
        tag,
        rank=0,
        world_size=1,
        agree=lambda ok: ok,
        pieces=pieces,
        extra=extra,
        rank_state={},
        manifest_fields=fields,
    )


def reader_group(reader, name: str) -> int:
    """The param group of ``name`` in the source (0 where the format does not say)."""
    group = getattr(reader, "param_group", None)
    if group is not None:
        return int(group(name))
    return int(
        (getattr(reader, "manifest", {}).get("params", {}).get(name) or {}).get("param_group", 0)
    )
