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
from ..storage import LATEST, Piece, read_latest, write_checkpoint
from .target import check_output

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


def save_folder_policy(dst: str, tag: str, force: bool) -> tuple[bool, list[str]]:
    """(whether ``latest`` moves to ``tag``, notes) for writing checkpoint ``tag`` into the
    save folder ``dst``. A folder that holds anything needs ``force``; there, ``latest`` moves
    only when it names nothing or ``tag`` already: a converted checkpoint never silently takes
    the place of a newer one a resume would load."""
    forced = f"add the checkpoint {tag} beside what is there (one of that name is replaced)"
    held = check_output(dst, force, forced, follow=True)
    if not held:
        return True, []
    latest = read_latest(dst)
    notes = []
    if tag in held:
        notes.append(f"replaced the checkpoint {tag} that {dst} held")
    if latest is None or latest == tag:
        return True, notes
    notes.append(
        f"{os.path.join(dst, LATEST)} still names {latest}, not the converted {tag}; load it "
        f"by its tag (load_checkpoint({dst!r}, tag={tag!r}), or --tag {tag})"
    )
    return False, notes


def write_native(
    reader,
    dst: str,
    tag: str,
    progress: Callable[[int], None] = lambda n: None,
    force: bool = False,
) -> tuple[str, list[str]]:
    """Write the checkpoint as ``dst/<tag>``; returns its path and the notes for the user."""
    save_latest, notes = save_folder_policy(dst, tag, force)
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

    path = write_checkpoint(
        os.path.abspath(dst),
        tag,
        rank=0,
        world_size=1,
        agree=lambda ok: ok,
        pieces=pieces,
        extra=extra,
        rank_state={},
        manifest_fields=fields,
        save_latest=save_latest,
    )
    return path, notes


def reader_group(reader, name: str) -> int:
    """The param group of ``name`` in the source (0 where the format does not say)."""
    group = getattr(reader, "param_group", None)
    if group is not None:
        return int(group(name))
    return int(
        (getattr(reader, "manifest", {}).get("params", {}).get(name) or {}).get("param_group", 0)
    )
