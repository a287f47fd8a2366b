"""``import deepspeed`` served by the zlaunch runtime (the bundled runtime).

zlaunch puts this package on the workers' path when the job's Python has no real DeepSpeed, or
with ``--runtime bundled``. Every module here is a thin face over the runtime's own: the engine
(`runtime.Engine`), ZeRO (`runtime.zero`), collectives (`runtime.dist`), activation
checkpointing (`runtime.activation_checkpointing`), learning-rate schedules (`runtime.optim.lr_schedules`). What
transformers, accelerate and TRL reach for that the runtime does not implement raises
`NotInBundledRuntime`, naming it.
"""

from __future__ import annotations

from typing import Any

import runtime as _runtime
from runtime import add_config_arguments, init_distributed
from runtime.errors import InvalidValueError

from . import accelerator, checkpointing, comm, moe, ops, utils, zero
from . import runtime as runtime  # deepspeed.runtime.*, as accelerate reads it after import
from ._missing import install_submodule_finder, module_getattr
from .accelerator import get_accelerator
from .runtime.engine import DeepSpeedEngine
from .utils import logger

__version__ = "0.19.8"
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8
__git_hash__ = None
__git_branch__ = None

__all__ = [
    "DeepSpeedEngine",
    "accelerator",
    "add_config_arguments",
    "checkpointing",
    "comm",
    "get_accelerator",
    "init_distributed",
    "initialize",
    "logger",
    "moe",
    "ops",
    "runtime",
    "utils",
    "zero",
]


def initialize(
    args: Any = None,
    model: Any = None,
    optimizer: Any = None,
    model_parameters: Any = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    distributed_port: int | None = None,  # noqa: ARG001 - MASTER_PORT comes from the launcher
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Any = None,
    config: Any = None,
    mesh_param: Any = None,
    config_params: Any = None,
):
    """``deepspeed.initialize``: ``(engine, optimizer, dataloader, lr_scheduler)``.

    ``config_params`` is DeepSpeed's older name for ``config`` (accelerate passes it);
    giving both is an error, as in DeepSpeed. The engine is a `DeepSpeedEngine` (the runtime's
    `Engine` with the attributes the Hugging Face integration reads).
    """
    if config_params is not None:
        if config is not None:
            raise InvalidValueError(
                "deepspeed.initialize got both config= and config_params=; pass only config="
            )
        config = config_params
    if mesh_param is not None:
        from ._missing import missing

        raise missing("deepspeed.initialize(mesh_param=...)", "no sequence/tensor parallel mesh")
    return _runtime.initialize(
        args=args,
        model=model,
        optimizer=optimizer,
        model_parameters=model_parameters,
        training_data=training_data,
        lr_scheduler=lr_scheduler,
        collate_fn=collate_fn,
        config=config,
        dist_init_required=dist_init_required,
        mpu=mpu,
        engine_class=DeepSpeedEngine,
    )


__getattr__ = module_getattr(__name__)
# A submodule DeepSpeed has and this package lacks: NotInBundledRuntimeModule, not
# ModuleNotFoundError.
install_submodule_finder(__name__)
