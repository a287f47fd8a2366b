"""Engine state <-> checkpoint files: what each rank saves and which slices it reads back.

Every rank describes what it owns as pieces of flattened parameters (`storage.Piece`): for
stages 1-2 its shard of every flat group (`FlatGroup.shard_slices`), for stage 0 (where every
rank holds everything) an even 1/N of every group, so all ranks share the writing. A load at
any world size and stage asks the reader for the ranges the *new* layout gives this rank; the
reader takes them from whichever old shards hold them.

Per piece the kinds are ``param`` (fp32 master weights) and every optimizer state tensor the
size of the master (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ...). Scalar optimizer
state (Adam's ``step``), hyperparameters, scheduler, loss scaler, counters, RNG and client
state go to the manifest as JSON.

A load reads everything into new tensors first, checks that every rank succeeded (one
all-reduce), and only then copies into the engine: a failed load changes nothing.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .reader import CheckpointReader
from .storage import Piece, resolve_checkpoint, write_checkpoint

__all__ = ["save_engine", "load_engine", "CHECKPOINT_DIR_ENV", "engine_pieces"]

log = logging.getLogger("runtime.checkpoint")

from zlaunch.protocol import CHECKPOINT_DIR_ENV  # noqa: E402 - the shared name

PARAM = "param"
# Param-group keys that say how this process computes, not what it trains: kept as they are.
_IMPLEMENTATION_KEYS = frozenset({"fused", "foreach", "capturable", "differentiable"})


# ---------------------------------------------------------------------------- helpers
def _agree_fn(engine):
    def agree(ok: bool) -> bool:
        flag = torch.tensor([0.0 if ok else 1.0], device=engine.device)
        engine.comm.all_reduce(flag)
        return float(flag.item()) == 0.0

    return agree


def _share_fn(engine):
    """rank 0's integer on every rank (names a save's partial directory uniquely)."""

    def share(value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=engine.device)
        engine.comm.broadcast(t, src=0)
        return int(t.item())

    return share


def _default_dir(given: str | None, what: str) -> str:
    if given:
        return str(given)
    env = os.environ.get(CHECKPOINT_DIR_ENV)
    if env:
        return env
    raise CheckpointError(
        f"{what}: no directory given and {CHECKPOINT_DIR_ENV} is not set; pass a directory or "
        "start the job with zlaunch --checkpoint-dir DIR"
    )


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np

            np.random.set_state(state["numpy"])
        except ImportError:
            pass
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _owned_ranges(engine) -> list[tuple[Any, int, int, torch.Tensor]]:
    """(group, lo, hi, master) for every master tensor: the group range it covers."""
    opt = engine.optimizer
    out = []
    for g, master in zip(engine.layout.groups, opt.master, strict=True):
        if opt.partitioned:
            lo, hi = g.shard_range(engine.comm.rank)
        else:
            lo, hi = 0, g.padded_numel
        out.append((g, lo, hi, master))
    return out


def _pieces_in(group, lo: int, hi: int) -> list[tuple[Piece, int]]:
    """Pieces of parameters inside group range [lo, hi), with their position in that range."""
    out = []
    for slot in group.slots:
        a, b = max(lo, slot.offset), min(hi, slot.end)
        if a < b:
            out.append((Piece(slot.name, a - slot.offset, b - a), a - lo))
    return out


def _element_kinds(opt, master: torch.Tensor) -> dict[str, torch.Tensor]:
    state = opt.state.get(master, {})
    return {
        k: v
        for k, v in state.items()
        if torch.is_tensor(v) and v.numel() == master.numel() and v.numel() > 1
    }


def engine_pieces(engine) -> list[tuple[Piece, dict[str, torch.Tensor]]]:
    """What this rank writes: its pieces with a view per kind."""
    inner = engine.optimizer.optimizer
    rank, world = engine.comm.rank, engine.comm.world_size
    out = []
    for g, lo, hi, master in _owned_ranges(engine):
        if not engine.optimizer.partitioned:
            # Every rank holds the whole group: write only an even 1/N of it.
            chunk = -(-g.numel // world)
            lo, hi = min(g.numel, rank * chunk), min(g.numel, (rank + 1) * chunk)
            base = 0
        else:
            base = lo
        kinds = {PARAM: master, **_element_kinds(inner, master)}
        for piece, at in _pieces_in(g, lo, hi):
            start = at + (lo - base)
            out.append((piece, {k: t.narrow(0, start, piece.numel) for k, t in kinds.items()}))
    return out


def _scalar_state(engine) -> list[dict[str, Any]]:
    """Per optimizer param group: the non-element state of its masters (e.g. Adam's step)."""
    inner = engine.optimizer.optimizer
    out = []
    for group in inner.param_groups:
        scalars: dict[str, Any] = {}
        on_device: list[str] = []
        for master in group["params"]:
            for k, v in inner.state.get(master, {}).items():
                if torch.is_tensor(v) and v.numel() == master.numel() and v.numel() > 1:
                    continue
                if k not in scalars:
                    scalars[k] = v.detach().cpu().clone() if torch.is_tensor(v) else v
                    if torch.is_tensor(v) and v.device.type != "cpu":
                        on_device.append(k)
        out.append({"values": jsonable.encode(scalars, "optimizer state"), "on_device": on_device})
    return out


def _hyper(engine) -> list[dict[str, Any]]:
    return [
        jsonable.encode({k: v for k, v in g.items() if k != "params"}, f"optimizer param group {i}")
        for i, g in enumerate(engine.optimizer.optimizer.param_groups)
    ]


def _module_tensors(engine) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(aliases: tied name -> trained name, extra: state_dict entries that are not trained)."""
    module = engine.module
    trained = {s.name for g in engine.layout.groups for s in g.slots}
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


def _is_frozen_parameter(t: torch.Tensor) -> bool:
    return isinstance(t, torch.nn.Parameter) and not t.requires_grad


def _frozen_unit(t: torch.Tensor):
    """The stage-3 unit holding ``t`` partitioned (a frozen parameter), or None."""
    from ..zero.stage3_units import Unit

    owner = getattr(t, "_zero_owner", None)
    return owner if isinstance(owner, Unit) else None


def _gather_frozen(engine, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``extra``'s values to write: detached, partitioned frozen parameters' full values as CPU
    copies on rank 0 (every rank takes part in each unit's all-gather, in state-dict order)."""
    rank = engine.comm.rank
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


# ---------------------------------------------------------------------------- save
def save_engine(
    engine,
    save_dir=None,
    tag=None,
    client_state=None,
    save_latest=True,
    exclude_frozen_parameters=False,
) -> str:
    """Write a checkpoint of ``engine`` (every rank calls this); returns its directory."""
    save_dir = _default_dir(save_dir, "save_checkpoint")
    tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
    client = jsonable.encode(client_state or {}, "client_state")
    aliases, extra = _module_tensors(engine)
    excluded = []
    if exclude_frozen_parameters:
        excluded = sorted(k for k, v in extra.items() if _is_frozen_parameter(v))
        extra = {k: v for k, v in extra.items() if k not in excluded}
    extra = _gather_frozen(engine, extra)

    def manifest_fields() -> dict:
        params = {}
        for g in engine.layout.groups:
            for s in g.slots:
                params[s.name] = {"shape": list(s.shape), "param_group": g.param_group}
        scaler = engine.precision.scaler
        sched = engine.lr_scheduler
        return {
            "zero_stage": engine.zero_stage,
            "precision": engine.precision.mode.value,
            "dtypes": {
                "master": "float32"
                if engine.precision.mixed
                else str(engine.flat_params.data.dtype).removeprefix("torch."),
                "model": str(engine.precision.param_dtype).removeprefix("torch."),
            },
            "params": params,
            "aliases": aliases,
            "excluded_frozen": excluded,
            "optimizer": {
                "class": type(engine.optimizer.optimizer).__name__,
                "param_groups": _hyper(engine),
                "scalar_state": _scalar_state(engine),
            },
            "lr_scheduler": None
            if sched is None or not hasattr(sched, "state_dict")
            else jsonable.encode(sched.state_dict(), "lr_scheduler state"),
            "loss_scaler": None
            if scaler is None
            else jsonable.encode(scaler.state_dict(), "loss scaler state"),
            "counters": {
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "micro_steps": engine.micro_steps,
                "skipped_steps": engine.skipped_steps,
            },
            "client_state": client,
        }

    rank = engine.comm.rank
    path = write_checkpoint(
        save_dir,
        tag,
        rank=rank,
        world_size=engine.comm.world_size,
        agree=_agree_fn(engine),
        share=_share_fn(engine),
        pieces=engine_pieces(engine),
        extra=extra if rank == 0 else None,
        rank_state=_rng_state(),
        manifest_fields=manifest_fields,
        save_latest=save_latest,
    )
    if rank == 0:
        log.info("saved checkpoint %s", path)
    return path


# ---------------------------------------------------------------------------- load
def _check_names(reader: CheckpointReader, engine, strict: bool) -> set[str]:
    model = {}
    for g in engine.layout.groups:
        for s in g.slots:
            model[s.name] = tuple(s.shape)
    saved = reader.shapes
    missing = sorted(set(model) - set(saved))
    unexpected = sorted(set(saved) - set(model))
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing in the checkpoint: {', '.join(missing[:8])}")
        if unexpected:
            parts.append(f"not in the model: {', '.join(unexpected[:8])}")
        raise CheckpointError(
            f"{reader.manifest_path} does not match the model ({'; '.join(parts)}); pass "
            "load_module_strict=False to load the parameters both have"
        )
    for name in set(model) & set(saved):
        if model[name] != saved[name]:
            raise CheckpointError(
                f"{reader.manifest_path}: parameter {name} has shape {list(saved[name])} but "
                f"the model's is {list(model[name])}"
            )
    return set(model) & set(saved)


def _read_all(engine, reader: CheckpointReader, names: set[str], with_optimizer: bool):
    """Everything this rank needs, as new tensors: {(group index): {kind: [(at, tensor)]}}."""
    inner = engine.optimizer.optimizer
    kinds = [PARAM]
    if with_optimizer:
        saved = set(reader.kinds) - {PARAM}
        kinds += sorted(saved)
    staged = []
    for g, lo, hi, master in _owned_ranges(engine):
        per_kind: dict[str, list[tuple[int, torch.Tensor]]] = {k: [] for k in kinds}
        for piece, at in _pieces_in(g, lo, hi):
            if piece.name not in names:
                continue
            for kind in kinds:
                t = reader.read(piece.name, kind, piece.offset, piece.end)
                per_kind[kind].append((at, t.to(master.dtype if kind == PARAM else torch.float32)))
        staged.append((master, per_kind))
    scalars = None
    if with_optimizer:
        opt = reader.state("optimizer") or {}
        saved_class = opt.get("class")
        if saved_class and saved_class != type(inner).__name__:
            raise CheckpointError(
                f"{reader.manifest_path}: the optimizer state is {saved_class}'s, this engine "
                f"runs {type(inner).__name__}; pass load_optimizer_states=False to load only "
                "the weights"
            )
        groups = opt.get("param_groups") or []
        if len(groups) != len(inner.param_groups):
            raise CheckpointError(
                f"{reader.manifest_path}: {len(groups)} optimizer param groups saved, the "
                f"optimizer has {len(inner.param_groups)}"
            )
        scalars = (groups, opt.get("scalar_state") or [])
    return staged, scalars


def load_engine(
    engine,
    load_dir=None,
    tag=None,
    load_module_strict=True,
    load_optimizer_states=True,
    load_lr_scheduler_states=True,
    load_module_only=False,
):
    """Load a checkpoint into ``engine`` on every rank; ``(path, client_state)``.

    No ``latest`` (and no tag): a warning and ``(None, None)``, as DeepSpeed does.
    """
    load_dir = _default_dir(load_dir, "load_checkpoint")
    agree = _agree_fn(engine)
    error: BaseException | None = None
    reader = staged = scalars = extra = None
    path = None
    try:
        path = resolve_checkpoint(load_dir, tag)
        if path is not None:
            reader = CheckpointReader(path)
            names = _check_names(reader, engine, load_module_strict)
            with_opt = load_optimizer_states and not load_module_only
            staged, scalars = _read_all(engine, reader, names, with_opt)
            _, extra_names = _module_tensors(engine)
            extra = {n: reader.read_extra(n) for n in extra_names if n in reader.extra}
            # Decoded now, before the agreement: a malformed entry must fail every rank
            # together, not one rank after the others moved on.
            for key in ("client_state", "lr_scheduler", "loss_scaler", "counters"):
                reader.state(key)
            reader.rank_state(engine.comm.rank % reader.world_size)
            if load_module_strict:
                # Frozen parameters saved with exclude_frozen_parameters keep the model's values.
                excluded = set(reader.state("excluded_frozen") or ())
                absent = sorted(set(extra_names) - set(extra) - excluded)
                if absent:
                    raise CheckpointError(
                        f"{reader.manifest_path} lacks {', '.join(absent[:8])} (buffers or "
                        "untrained parameters); pass load_module_strict=False to keep the "
                        "model's"
                    )
    except CheckpointError as err:
        error = err
    except Exception as err:  # noqa: BLE001 - every rank must reach agree(), whatever failed
        error = CheckpointError(
            f"cannot load {path or load_dir}: {type(err).__name__}: {err}; the checkpoint is "
            "malformed"
        )
    if not agree(error is None):
        if error is not None:
            raise error
        raise CheckpointError(f"another rank could not load {path or load_dir}; nothing loaded")
    if path is None:
        warnings.warn(
            f"no 'latest' file in {os.path.abspath(load_dir)}: nothing to resume from (to load "
            "a particular checkpoint, pass its tag: load_checkpoint(dir, tag=...))",
            stacklevel=3,
        )
        return None, None

    with reader:
        _commit(
            engine,
            reader,
            staged,
            scalars,
            extra,
            load_lr_scheduler_states=load_lr_scheduler_states and not load_module_only,
            full=not load_module_only,
        )
        client = reader.state("client_state") or {}
    if engine.comm.rank == 0:
        log.info("loaded checkpoint %s", path)
    return path, client


@torch.no_grad()
def _commit(engine, reader, staged, scalars, extra, *, load_lr_scheduler_states, full) -> None:
    opt = engine.optimizer
    inner = opt.optimizer
    for master, per_kind in staged:
        for at, t in per_kind.get(PARAM, []):
            master.narrow(0, at, t.numel()).copy_(t)
    opt.refresh_params_from_master()
    module_state = engine.module.state_dict(keep_vars=True)
    for name, t in (extra or {}).items():
        target = module_state[name]
        unit = _frozen_unit(target)
        if unit is not None:  # a partitioned frozen parameter: each rank keeps its part
            unit.load_values(target, t, engine.comm.rank)
        else:
            target.data.copy_(t)
    if scalars is not None:
        groups, scalar_state = scalars
        for group, saved in zip(inner.param_groups, groups, strict=True):
            for k, v in saved.items():
                if k not in _IMPLEMENTATION_KEYS:
                    group[k] = v
        for pg, group in enumerate(inner.param_groups):
            saved = scalar_state[pg] if pg < len(scalar_state) else {"values": {}, "on_device": []}
            values = jsonable.decode(saved.get("values", {}))
            on_device = set(saved.get("on_device", []))
            masters = {id(m) for m in group["params"]}
            for master, per_kind in staged:
                if id(master) not in masters:
                    continue
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
                if state:
                    inner.state[master] = state
                else:
                    inner.state.pop(master, None)
    if not full:
        return
    sched = engine.lr_scheduler
    saved_sched = reader.state("lr_scheduler")
    if load_lr_scheduler_states and sched is not None and saved_sched is not None:
        sched.load_state_dict(saved_sched)
    scaler = engine.precision.scaler
    saved_scaler = reader.state("loss_scaler")
    if scaler is not None and saved_scaler is not None:
        scaler.load_state_dict(saved_scaler)
    counters = reader.state("counters") or {}
    for key in ("global_steps", "global_samples", "micro_steps", "skipped_steps"):
        if key in counters:
            setattr(engine, key, int(counters[key]))
    old_world = reader.world_size
    _set_rng_state(reader.rank_state(engine.comm.rank % old_world))
