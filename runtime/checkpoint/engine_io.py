"""Engine state <-> checkpoint files: what each rank saves, and loads that fail atomically.

The engine's parts hand over their state through accessors: the sharding strategy its trained
parameters and owned master ranges (`pieces`), the optimizer its groups and state
(`optimizer_state`), the precision its loss scaler, the module its untrained tensors
(`module_state`). Scalar optimizer state, hyperparameters, scheduler, loss scaler, counters,
RNG (`rng`) and client state go to the manifest as JSON.

A load reads everything into new tensors first, checks that every rank succeeded (one
all-reduce), and only then copies into the engine: a failed load changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from . import jsonable
from .async_save import snapshot
from .errors import CheckpointError
from .formats import open_checkpoint, resolve
from .hf_config import hf_configs
from .load_checks import check_like, check_optimizer_values, check_rng_state
from .module_state import gather_extra, is_frozen_parameter, load_extra, module_tensors
from .optimizer_state import check_saved_optimizer, load_optimizer_state, saved_optimizer
from .pieces import PARAM, StagedRange, rank_pieces, stage_pieces
from .reader import CheckpointReader
from .rng import rng_state, set_rng_state
from .storage import write_checkpoint

__all__ = [
    "save_engine",
    "load_engine",
    "save_16bit_model",
    "SaveRequest",
    "LoadRequest",
    "CHECKPOINT_DIR_ENV",
]

log = logging.getLogger("runtime.checkpoint")

from zlaunch.wire import CHECKPOINT_DIR_ENV  # noqa: E402 - the shared name


@dataclass(frozen=True)
class SaveRequest:
    client_state: Any = field(default_factory=dict)
    """JSON-serialisable; nothing is pickled."""
    save_latest: bool = True
    exclude_frozen: bool = False
    """Leave out parameters with ``requires_grad`` false (loading keeps the model's)."""
    async_save: bool = False
    """Return once the state is snapshotted; write in a background thread (`async_save`)."""


@dataclass(frozen=True)
class LoadRequest:
    """`Engine.load_checkpoint`'s options, as DeepSpeed names them."""

    module_strict: bool = True
    optimizer_states: bool = True
    lr_scheduler_states: bool = True
    module_only: bool = False

    @property
    def with_optimizer(self) -> bool:
        return self.optimizer_states and not self.module_only

    @property
    def with_scheduler(self) -> bool:
        return self.lr_scheduler_states and not self.module_only


# ---------------------------------------------------------------------------- collectives
def _agree_fn(engine, comm=None):
    """An all-ranks AND of ``ok``; on ``comm`` (the async saver's gloo group: host tensors)."""
    device = engine.device if comm is None else "cpu"
    comm = comm or engine.comm

    def agree(ok: bool) -> bool:
        flag = torch.tensor([0.0 if ok else 1.0], device=device)
        comm.all_reduce(flag)
        return float(flag.item()) == 0.0

    return agree


def _share_fn(engine, comm=None):
    """rank 0's integer on every rank (names a save's partial directory uniquely)."""
    device = engine.device if comm is None else "cpu"
    comm = comm or engine.comm

    def share(value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=device)
        comm.broadcast(t, src=0)
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


def _encoded_state(value: Any, what: str) -> Any:
    return None if value is None else jsonable.encode(value, what)


# ---------------------------------------------------------------------------- save
def _manifest_fields(engine, aliases: dict, excluded: list, client: Any) -> dict:
    """The manifest's JSON state (rank 0 only)."""
    trained = engine.sharding.trained_params()
    sched = engine.lr_scheduler
    return {
        "zero_stage": engine.zero_stage,
        "precision": engine.precision.mode.value,
        "dtypes": {
            "master": str(engine.sharding.master_dtype).removeprefix("torch."),
            "model": str(engine.precision.param_dtype).removeprefix("torch."),
        },
        "params": {
            n: {"shape": list(p.shape), "param_group": p.param_group} for n, p in trained.items()
        },
        "aliases": aliases,
        "excluded_frozen": excluded,
        "optimizer": saved_optimizer(engine.optimizer),
        "lr_scheduler": _encoded_state(
            sched.state_dict() if hasattr(sched, "state_dict") else None, "lr_scheduler state"
        ),
        "loss_scaler": _encoded_state(engine.precision.state_dict(), "loss scaler state"),
        "counters": engine.counters.state_dict(),
        "client_state": client,
        **hf_configs(engine.module),
    }


def save_engine(engine, save_dir=None, tag=None, request: SaveRequest = SaveRequest()) -> str:
    """Write a checkpoint of ``engine`` (every rank calls this); returns its directory."""
    save_dir = _default_dir(save_dir, "save_checkpoint")
    tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
    client = jsonable.encode(request.client_state, "client_state")
    aliases, extra = module_tensors(engine.module, set(engine.sharding.trained_params()))
    excluded = []
    if request.exclude_frozen:
        excluded = sorted(k for k, v in extra.items() if is_frozen_parameter(v))
        extra = {k: v for k, v in extra.items() if k not in excluded}
    rank = engine.comm.rank
    extra = gather_extra(extra, rank)
    engine.checkpoint_saver.wait()  # one save at a time, in order
    with _resident(engine):  # NVMe offload: the state in memory while it is written/copied
        return _save_pieces(engine, save_dir, tag, request, rank, extra, aliases, excluded, client)


def _resident(engine):
    resident = getattr(engine.optimizer, "resident", None)
    return resident() if resident is not None else contextlib.nullcontext()


def _save_pieces(engine, save_dir, tag, request, rank, extra, aliases, excluded, client) -> str:
    pieces = rank_pieces(engine.sharding, engine.optimizer.state, rank, engine.comm.world_size)
    write = dict(
        rank=rank,
        world_size=engine.comm.world_size,
        agree=_agree_fn(engine),
        share=_share_fn(engine),
        pieces=pieces,
        extra=extra if rank == 0 else None,
        rank_state=rng_state(),
        manifest_fields=lambda: _manifest_fields(engine, aliases, excluded, client),
        save_latest=request.save_latest,
    )
    if request.async_save:
        return _save_in_background(engine, save_dir, tag, write)
    path = write_checkpoint(save_dir, tag, **write)
    if rank == 0:
        log.info("saved checkpoint %s", path)
    return path


def _save_in_background(engine, save_dir: str, tag: str, write: dict) -> str:
    """Snapshot what ``write`` would write, then write it in the engine's saver thread."""
    saver = engine.checkpoint_saver
    comm = saver.communicator(engine)
    fields = write["manifest_fields"]() if write["rank"] == 0 else None
    write.update(
        pieces=[(piece, snapshot(kinds)) for piece, kinds in write["pieces"]],
        extra=None if write["extra"] is None else snapshot(write["extra"]),
        manifest_fields=lambda: fields,
        agree=_agree_fn(engine, comm),
        share=_share_fn(engine, comm),
    )
    path = os.path.join(os.path.abspath(save_dir), tag)
    saver.start(lambda: write_checkpoint(save_dir, tag, **write), path)
    if write["rank"] == 0:
        log.info("saving checkpoint %s in the background", path)
    return path


# ---------------------------------------------------------------------------- load
@dataclass
class _Staged:
    """Everything one rank read for a load, before anything in the engine changed."""

    reader: CheckpointReader
    masters: list[StagedRange]
    optimizer: tuple[list, list] | None
    extra: dict[str, torch.Tensor]


def _check_names(reader: CheckpointReader, model: dict[str, tuple], strict: bool) -> set[str]:
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


def _check_extra(reader: CheckpointReader, extra: dict, wanted: dict) -> None:
    # Frozen parameters saved with exclude_frozen_parameters keep the model's values.
    excluded = set(reader.state("excluded_frozen") or ())
    absent = sorted(set(wanted) - set(extra) - excluded)
    if absent:
        raise CheckpointError(
            f"{reader.manifest_path} lacks {', '.join(absent[:8])} (buffers or untrained "
            "parameters); pass load_module_strict=False to keep the model's"
        )


def _stage(engine, reader: CheckpointReader, request: LoadRequest) -> _Staged:
    trained = {n: p.shape for n, p in engine.sharding.trained_params().items()}
    names = _check_names(reader, trained, request.module_strict)
    check_engine = getattr(reader, "check_engine", None)  # what a foreign format must add
    if check_engine is not None:
        check_engine(engine)
    kinds = [PARAM]
    if request.with_optimizer:
        kinds += sorted(set(reader.kinds) - {PARAM})
    masters = stage_pieces(reader, engine.sharding.owned_ranges(), names, kinds)
    optimizer = None
    if request.with_optimizer:
        optimizer = check_saved_optimizer(
            reader.state("optimizer") or {}, engine.optimizer, reader.manifest_path
        )
    _, wanted = module_tensors(engine.module, set(trained))
    extra = {n: reader.read_extra(n) for n in wanted if n in reader.extra}
    # Decoded and checked now, before the agreement: a malformed entry must fail every rank
    # together, before anything in the engine changed (load_checks.py).
    _check_json_state(engine, reader, request, optimizer)
    if request.module_strict:
        _check_extra(reader, extra, wanted)
    return _Staged(reader, masters, optimizer, extra)


def _check_json_state(engine, reader: CheckpointReader, request: LoadRequest, optimizer) -> None:
    where = reader.manifest_path
    for key in ("client_state", "lr_scheduler", "loss_scaler"):
        reader.state(key)  # decodes, or CheckpointError
    try:  # the counters are checked on a scratch copy: nothing of the engine changes yet
        # (a fresh one of the engine's own kind: checkpoint/ sits below engine/)
        type(engine.counters)().load_state_dict(reader.state("counters") or {})
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    check_rng_state(reader.rank_state(engine.comm.rank % reader.world_size), f"{where}: rank_state")
    if request.module_only:
        return
    sched, saved = engine.lr_scheduler, reader.state("lr_scheduler")
    if request.with_scheduler and saved is not None and hasattr(sched, "state_dict"):
        check_like(saved, sched.state_dict(), f"{where}: lr_scheduler")
    scaler = engine.precision.state_dict()
    if scaler is not None and reader.state("loss_scaler") is not None:
        check_like(reader.state("loss_scaler"), scaler, f"{where}: loss_scaler", required=True)
    if optimizer is not None:
        check_optimizer_values(*optimizer, engine.optimizer, where)


def _try_stage(engine, load_dir: str, tag, request: LoadRequest):
    """``(path, staged, error)``: every rank gets here, whatever failed, to agree."""
    path = None
    try:
        path = resolve(load_dir, tag)
        staged = None if path is None else _stage(engine, open_checkpoint(path), request)
        return path, staged, None
    except CheckpointError as err:
        return path, None, err
    except Exception as err:  # noqa: BLE001 - every rank must reach agree(), whatever failed
        malformed = f"{type(err).__name__}: {err}; the checkpoint is malformed"
        return path, None, CheckpointError(f"cannot load {path or load_dir}: {malformed}")


def load_engine(engine, load_dir=None, tag=None, request: LoadRequest = LoadRequest()):
    """Load a checkpoint into ``engine`` on every rank; ``(path, client_state)``.

    No ``latest`` (and no tag): a warning and ``(None, None)``, as DeepSpeed does.
    """
    load_dir = _default_dir(load_dir, "load_checkpoint")
    engine.checkpoint_saver.wait()  # a save in flight may be the checkpoint asked for
    path, staged, error = _try_stage(engine, load_dir, tag, request)
    if not _agree_fn(engine)(error is None):
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
    with staged.reader as reader:
        _commit(engine, staged, request)
        client = reader.state("client_state") or {}
    if engine.comm.rank == 0:
        log.info("loaded checkpoint %s", path)
    return path, client


@torch.no_grad()
def _commit(engine, staged: _Staged, request: LoadRequest) -> None:
    """Copy what every rank read into the engine (nothing here may fail on good input)."""
    with _resident(engine):
        for master, per_kind in staged.masters:
            for at, t in per_kind.get(PARAM, []):
                master.narrow(0, at, t.numel()).copy_(t)
        engine.sharding.refresh_params_from_master()
        if staged.optimizer is not None:
            load_optimizer_state(engine.optimizer, staged.masters, staged.optimizer)
    load_extra(engine.module, staged.extra, engine.comm.rank)
    if request.module_only:
        return
    reader = staged.reader
    sched, saved_sched = engine.lr_scheduler, reader.state("lr_scheduler")
    if request.with_scheduler and sched is not None and saved_sched is not None:
        sched.load_state_dict(saved_sched)
    engine.precision.load_state_dict(reader.state("loss_scaler"))
    engine.counters.load_state_dict(reader.state("counters") or {})
    # A resume starts a fresh accumulation: a checkpoint holds no half-accumulated gradients,
    # and the run may resume with another accumulation count (zlaunch keeps the global batch
    # on another world size). The counter moves up to this run's next boundary; kept as saved,
    # the first step after the resume would step the optimizer after a fraction of its
    # micro-batches (8 micro-steps saved at 2 a step, resumed at 3: after one).
    gas = engine.gradient_accumulation_steps()
    engine.counters.micro_steps = -(-engine.counters.micro_steps // gas) * gas
    set_rng_state(reader.rank_state(engine.comm.rank % reader.world_size))


def save_16bit_model(
    engine, save_dir, save_filename: str = "model.safetensors", exclude_frozen: bool = False
) -> bool:
    """Write the consolidated weights to ``save_dir/save_filename`` from rank 0 (collective):
    the module's weights gathered unit by unit (runtime/zero/stage3/save.py), in the format the
    file name says: safetensors for ``*.safetensors``, else ``torch.save`` of the state dict
    (DeepSpeed's format for every name, what ``torch.load`` and a ``pytorch_model.bin`` reader
    expect)."""
    zero = engine.config.zero_optimization
    rank = engine.global_rank
    if zero.stage == 3 and not zero.stage3_gather_16bit_weights_on_model_save:
        if rank == 0:
            log.warning(
                "save_16bit_model: nothing written; the weights are partitioned (stage 3) and "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save is false - set it "
                "to true to gather and save them"
            )
        return False
    from runtime.zero.stage3 import consolidated_state_dict

    state = consolidated_state_dict(engine.module, rank, exclude_frozen)
    if rank == 0:
        from .consolidate import write_state_dict, write_torch_state_dict

        os.makedirs(save_dir, exist_ok=True)
        output = os.path.join(os.fspath(save_dir), save_filename)
        # A random temporary name, never through a link, renamed once complete.
        if str(save_filename).endswith(".safetensors"):
            write_state_dict(state, output, {"format": "pt"})
        else:
            write_torch_state_dict(state, output)
    engine.comm.barrier()
    return True
