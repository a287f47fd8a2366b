"""zlaunch runtime: a DeepSpeed-compatible training engine with ZeRO stages 0-3.

Workers import this package; it never imports `zlaunch`. ``import runtime`` stays light: the
engine (and torch) load on first use of `initialize` or `Engine`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["initialize", "Engine"]


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
):
    """Wrap ``model`` for distributed training: ``(engine, optimizer, dataloader, lr_scheduler)``.

    The config comes from ``config`` (a dict or a JSON/YAML path), else ``args.deepspeed_config``,
    else the ``ZLAUNCH_CONFIG`` environment variable (set by zlaunch --config). Giving both
    ``config`` and ``args.deepspeed_config`` is an error. ``optimizer`` / ``lr_scheduler`` given
    by the script (an object, or a callable building one) replace the config's. The process
    group is initialised from the environment when it is not already.
    """
    from . import stacks
    from .config import ConfigError, load_config
    from .dist_env import init_distributed
    from .engine import Engine

    stacks.install()  # `zlaunch stacks` can see this rank from now on, rendezvous included

    if model is None:
        raise ValueError("initialize() needs model=")
    args_config = getattr(args, "deepspeed_config", None) if args is not None else None
    if config is not None and args_config is not None:
        raise ConfigError(
            f"a config was given twice: config= and args.deepspeed_config ({args_config}); "
            "pass only one of them"
        )
    source = config if config is not None else args_config
    if source is None:
        source = os.environ.get("ZLAUNCH_CONFIG") or None
    if source is None:
        raise ConfigError(
            "no config: pass config= (a dict or a path), set args.deepspeed_config, or start "
            "the script with zlaunch --config FILE (which sets ZLAUNCH_CONFIG)"
        )
    loaded = source if hasattr(source, "resolve") else load_config(source)
    env = init_distributed(dist_init_required)
    resolved = loaded.resolve(env.world_size, _hidden_size(model))
    engine = Engine(
        module=model,
        config=resolved,
        env=env,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        training_data=training_data,
        collate_fn=collate_fn,
    )
    # zlaunch --resume / --save-on (ZLAUNCH_RESUME, ZLAUNCH_SAVE_ON): runtime/checkpoint/preempt.py
    from .checkpoint.preempt import attach

    attach(engine)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


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


def __getattr__(name: str):
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "zero":  # runtime.zero.Init / GatheredParameters, as deepspeed.zero
        import importlib

        return importlib.import_module(".zero", __name__)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
