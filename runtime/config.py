"""The training config: DeepSpeed's JSON/YAML schema as frozen dataclasses.

Users bring DeepSpeed configs, so the keys, defaults and the batch-size rules are DeepSpeed's
(see REFERENCE.md). Where DeepSpeed is lax we are strict and say how to fix it: unknown keys
anywhere (top level included) are errors that suggest the nearest valid key, duplicate keys
are errors, and both fp16 and bf16 enabled is an error. DeepSpeed blocks for features this
runtime does not implement are accepted while disabled and refused when enabled.

This module is the public face; each concept lives in its own module, and the imports run one
way, from reading down to the values:

    config_load      load_config: mapping or file -> Config, warnings
      config_files     JSON/YAML/HJSON parsing, duplicate keys, plain data
      config_keys      the one check of which keys a mapping may hold
      config_features  DeepSpeed keys not modelled here: accepted while off, refused when on
    config_schema    Config: the top level, the blocks, the batch rules, `resolve`
      config_blocks    fp16, bf16, optimizer, zero_optimization and offload, activation
                       checkpointing
      config_scheduler scheduler: DeepSpeed's schedules and their parameters
      config_monitors  tensorboard, comms_logger, flops_profiler, csv_monitor, wandb
    config_values    ConfigError, ConfigWarning, the checks of one value

All of it must stay importable without torch: the launcher validates a config before it
contacts any host, and `zlaunch estimate` runs on machines without torch.
"""

from __future__ import annotations

# Each part lists its public names in __all__; these are the names users import from here.
from . import config_blocks, config_monitors, config_scheduler
from .config_blocks import *  # noqa: F403
from .config_load import load_config
from .config_monitors import *  # noqa: F403
from .config_scheduler import *  # noqa: F403
from .config_schema import Config
from .config_values import AUTO, ConfigError, ConfigWarning

__all__ = [
    "AUTO",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "load_config",
    *config_blocks.__all__,
    *config_monitors.__all__,
    *config_scheduler.__all__,
]
