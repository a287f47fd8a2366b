"""`initialize`: a model, a config and the launcher's environment in, an `Engine` out."""

from __future__ import annotations

import logging
import os
from typing import Any

from zlaunch.wire import CONFIG_ENV

__all__ = ["initialize", "add_config_arguments"]


def _config_source(args: Any, config: Any) -> Any:
    """The one config the caller named: ``config=``, ``args.deepspeed_config`` (or DeepSpeed's
    deprecated ``deepscale_config``), else zlaunch's ``ZLAUNCH_CONFIG``."""
    from runtime.config import ConfigError

    args_config = getattr(args, "deepspeed_config", None) if args is not None else None
    old_config = getattr(args, "deepscale_config", None) if args is not None else None
    if old_config is not None:  # DeepSpeed's deprecated spelling
        if args_config is not None:
            raise ConfigError(
                f"args.deepscale_config ({old_config}) and args.deepspeed_config ({args_config}) "
                "are both set; pass only --deepspeed_config"
            )
        args_config = old_config
    if config is not None and args_config is not None:
        raise ConfigError(
            f"a config was given twice: config= and args.deepspeed_config ({args_config}); "
            "pass only one of them"
        )
    source = config if config is not None else args_config
    if source is None:
        source = os.environ.get(CONFIG_ENV) or None
    if source is None:
        raise ConfigError(
            "no config: pass config= (a dict or a path), set args.deepspeed_config, or start "
            "the script with zlaunch --config FILE (which sets ZLAUNCH_CONFIG)"
        )
    return source


def _load_config(source: Any) -> tuple[Any, list]:
    """The loaded config and the notes (warnings) loading it gave, shown later from rank 0."""
    import warnings

    from runtime.config import ConfigWarning, load_config

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", ConfigWarning)
        loaded = source if hasattr(source, "resolve") else load_config(source)
    return loaded, notes


def initialize(
    args: Any = None,
    model: Any = None,
    optimizer: Any = None,
    model_parameters: Any = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    collate_fn: Any = None,
    config: Any = None,
    dist_init_required: bool | None = None,
    mpu: Any = None,
    *,
    engine_class: Any = None,
):
    """Wrap ``model`` for distributed training: ``(engine, optimizer, dataloader, lr_scheduler)``.

    The config comes from ``config`` (a dict or a JSON/YAML path), else ``args.deepspeed_config``,
    else the ``ZLAUNCH_CONFIG`` environment variable (set by zlaunch --config). Giving both
    ``config`` and ``args.deepspeed_config`` is an error. ``optimizer`` / ``lr_scheduler`` given
    by the script (an object, or a callable building one) replace the config's. The process
    group is initialised from the environment when it is not already.

    ``mpu``: Megatron's model-parallel interface (``get_model_parallel_group/rank/world_size``,
    ``get_data_parallel_group/rank/world_size``; runtime.parallel_groups has one). ZeRO stages
    0-2 then partition and reduce over the data-parallel group, batch sizes count data-parallel
    ranks, and each model-parallel rank checkpoints its own part (runtime.engine.model_parallel).
    ``engine_class``: a subclass of `Engine` to build instead (the DeepSpeed API's
    ``DeepSpeedEngine``, which adds DeepSpeed's names for the Hugging Face integration).
    The config's ``activation_checkpointing`` block configures runtime.activation_checkpointing, with the
    mpu's group for ``partition_activations``.
    """
    from runtime.distributed import init_distributed
    from runtime.errors import InvalidValueError
    from runtime.observe import stacks

    from .engine import Engine

    stacks.install()  # `zlaunch stacks` can see this rank from now on, rendezvous included

    if model is None:
        raise InvalidValueError("initialize() needs model=")
    source = _config_source(args, config)
    loaded, notes = _load_config(source)
    env = init_distributed(dist_init_required)
    loaded = _keep_global_batch(loaded, env.rank)
    _show_config_notes(notes, source, env.rank)
    resolved = loaded.resolve(_data_parallel_size(mpu, env), _hidden_size(model))
    _configure_activation_checkpointing(loaded, resolved, mpu)
    engine = (engine_class or Engine)(
        module=model,
        config=resolved,
        env=env,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        training_data=training_data,
        collate_fn=collate_fn,
        mpu=mpu,
    )
    _apply_launch_options(engine)
    _announce_ready()
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _data_parallel_size(mpu: Any, env: Any) -> int:
    """The ranks batch sizes count: the mpu's data-parallel group (checked first), or all."""
    if mpu is None:
        return env.world_size
    from runtime.distributed import check_mpu

    check_mpu(mpu, env.world_size)
    return mpu.get_data_parallel_world_size()


def _configure_activation_checkpointing(loaded: Any, resolved: Any, mpu: Any) -> None:
    from runtime import activation_checkpointing as checkpointing

    if "activation_checkpointing" in loaded.raw:
        checkpointing.configure(mpu, deepspeed_config=resolved)
    elif mpu is not None and not checkpointing.is_configured():
        checkpointing.configure(mpu)  # the group partition_activations would split over


def _apply_launch_options(engine: Any) -> None:
    """zlaunch --resume / --save-on (ZLAUNCH_RESUME, ZLAUNCH_SAVE_ON): load the latest
    checkpoint, and save at the step boundary after the signal."""
    from runtime.checkpoint import resume_from_env, save_on_signal_from_env

    engine.resumed_from, engine.resumed_client_state = resume_from_env(engine)
    hook = save_on_signal_from_env(engine.device)
    if hook is not None:
        engine.add_step_hook(hook)


def _announce_ready() -> None:
    """Tell zlaunch this rank finished setting up: its hang watch counts from here."""
    from runtime.observe import EventSink
    from zlaunch.wire import events

    sink = EventSink(os.environ)
    if sink.fd is not None:
        sink.emit(events.RuntimeReady())


def _keep_global_batch(config, rank: int):
    """After zlaunch restarted the job on another world size (a host was lost), its batch
    triple (ZLAUNCH_BATCH) replaces the config's: the global batch stays what it was."""
    from runtime.config import ConfigError
    from zlaunch.wire import BatchError, override_from_env

    try:
        override = override_from_env(os.environ)
    except BatchError as err:
        raise ConfigError(str(err)) from None
    if override is None:
        return config
    if rank == 0:
        logging.getLogger("runtime").warning(
            "zlaunch restarted this job on another world size: train_batch_size %d kept, "
            "gradient_accumulation_steps now %d (micro batch %d)",
            override.train_batch_size,
            override.gradient_accumulation_steps,
            override.micro_batch,
        )
    return override.apply(config)


def _show_config_notes(notes: list, source: Any, rank: int) -> None:
    """Config notes ("auto" with nothing to resolve it, ...) once, from rank 0, and not at all
    when zlaunch validated this very file before launch and showed them already."""
    import logging
    import warnings

    from runtime.config import ConfigWarning

    for note in notes:
        if not issubclass(note.category, ConfigWarning):
            warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    launched = os.environ.get(CONFIG_ENV)
    shown = (
        launched is not None
        and isinstance(source, (str, os.PathLike))
        and os.path.realpath(source) == os.path.realpath(launched)
    )
    if rank != 0 or shown:
        return
    for note in notes:
        if issubclass(note.category, ConfigWarning):
            logging.getLogger("runtime.config").warning("%s", note.message)


def add_config_arguments(parser: Any) -> Any:
    """Add DeepSpeed's command-line arguments to an argparse parser and return it:
    ``--deepspeed`` (a flag for the script), ``--deepspeed_config FILE`` (read by
    `initialize` from ``args``), and the deprecated ``--deepscale`` / ``--deepscale_config``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (a flag for the script; no effect on the runtime)",
    )
    group.add_argument(
        "--deepspeed_config", default=None, type=str, help="DeepSpeed JSON/YAML config file."
    )
    group.add_argument(
        "--deepscale", default=False, action="store_true", help="Deprecated: use --deepspeed"
    )
    group.add_argument(
        "--deepscale_config", default=None, type=str, help="Deprecated: use --deepspeed_config"
    )
    return parser


def _hidden_size(model: Any) -> int | None:
    """The model's hidden size, for "auto" bucket sizes (Hugging Face-style attributes)."""
    for holder in (getattr(model, "config", None), model):
        for name in ("hidden_size", "n_embd", "d_model", "dim"):
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    # No such attribute: the most common last dimension of the 2-D weights (their full shape
    # when zero.Init has partitioned them).
    from collections import Counter

    dims = Counter(
        tuple(getattr(p, "ds_shape", None) or p.shape)[-1]
        for p in getattr(model, "parameters", lambda: [])()
        if len(getattr(p, "ds_shape", None) or p.shape) == 2
    )
    return dims.most_common(1)[0][0] if dims else None
