"""The training config: DeepSpeed's JSON/YAML schema as frozen dataclasses.

Users bring DeepSpeed configs, so the keys, defaults and the batch-size rules are DeepSpeed's
(docs/deepspeed-compat.md). Where DeepSpeed is lax we are strict and say how to fix it: unknown keys
anywhere (top level included) are errors that suggest the nearest valid key, duplicate keys
are errors, and both fp16 and bf16 enabled is an error. DeepSpeed blocks for features this
runtime does not implement are accepted while disabled and refused when enabled.

This package's face is this file; each concept lives in its own module, and the imports run
one way, from reading down to the values:

    load        load_config: mapping or file -> Config, warnings
      files       JSON/YAML/HJSON parsing, duplicate keys, plain data
      keys        the one check of which keys a mapping may hold
      features    DeepSpeed keys not modelled here: accepted while off, refused when on
    schema      Config: the top level, the blocks, the batch rules, `resolve`
      blocks      fp16, bf16, optimizer, zero_optimization and offload, activation
                  checkpointing, compile (torch.compile)
      scheduler   scheduler: DeepSpeed's schedules and their parameters
      monitors    tensorboard, comms_logger, flops_profiler, csv_monitor, wandb
    values      ConfigError, ConfigWarning, the checks of one value

All of it must stay importable without torch: the launcher validates a config before it
contacts any host, and `zlaunch estimate` runs on machines without torch.
"""

from __future__ import annotations

from runtime.config.blocks import check_compile_kwargs
from runtime.config.files import read_file
from runtime.config.schema import BATCH_KEYS

# Each part lists its public names in __all__; these are the names users import from here.
from . import blocks, monitors, scheduler
from .auto_values import auto_keys, filled_by_integrations, load_leaving_autos
from .blocks import *  # noqa: F403
from .features import UNMODELLED_KEYS
from .load import KEY_ALIASES, LEGACY_OFFLOAD_KEYS, load_config
from .monitors import *  # noqa: F403
from .scheduler import *  # noqa: F403
from .schema import Config
from .values import AUTO, ConfigError, ConfigWarning

__all__ = [
    "auto_keys",
    "filled_by_integrations",
    "load_leaving_autos",
    "BATCH_KEYS",
    "blocks",
    "check_compile_kwargs",
    "monitors",
    "read_file",
    "scheduler",
    "AUTO",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "KEY_ALIASES",
    "LEGACY_OFFLOAD_KEYS",
    "UNMODELLED_KEYS",
    "load_config",
    *blocks.__all__,
    *monitors.__all__,
    *scheduler.__all__,
]
