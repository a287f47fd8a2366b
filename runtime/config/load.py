"""Reading a config: a mapping or a JSON/YAML file, DeepSpeed's keys mapped onto the schema.

`load_config` is the entry point (users reach it as `runtime.config.load_config`). The schema
(runtime.config.schema and its blocks) knows nothing of reading; here live the parts that
only matter while reading: DeepSpeed's keys this runtime does not model (runtime.config.features: accepted while
disabled, refused when turned on), DeepSpeed's other spellings of ZeRO keys, "auto" handling
inside blocks, and file parsing (runtime.config.files). No torch.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

from .blocks import (
    ActivationCheckpointingConfig,
    BF16Config,
    CheckpointConfig,
    CompileConfig,
    FP16Config,
    OffloadConfig,
    OptimizerConfig,
    ZeroConfig,
)
from .features import (
    BF16_KEYS,
    CHECKPOINT_KEYS,
    COMPILE_KEYS,
    FP16_KEYS,
    OFFLOAD_OPTIMIZER_KEYS,
    OPTIMIZER_KEYS,
    TOP_LEVEL_KEYS,
    ZERO_KEYS,
    Check,
)
from .files import plain, read_file
from .keys import check_keys
from .monitors import (
    CommsLoggerConfig,
    CsvMonitorConfig,
    FlopsProfilerConfig,
    TensorboardConfig,
    WandbConfig,
)
from .scheduler import SchedulerConfig
from .schema import BATCH_KEYS, Config
from .values import AUTO, ConfigError, ConfigWarning, as_bool, describe

__all__ = ["KEY_ALIASES", "LEGACY_OFFLOAD_KEYS", "load_config", "read_config"]


# DeepSpeed's other spellings of ZeRO keys -> ours.
_ZERO_ALIASES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}
KEY_ALIASES: dict[str, Mapping[str, str]] = {
    "": {"bfloat16": "bf16"},
    "zero_optimization": _ZERO_ALIASES,
}
"""DeepSpeed's other spellings of a key, by block path ("" is the top level): spelling -> the
key it sets. Giving both spellings is an error."""
LEGACY_OFFLOAD_KEYS: dict[str, str] = {
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
}
"""DeepSpeed's deprecated boolean forms in zero_optimization: `true` means the block named here
with "device": "cpu"; giving both is an error."""
# Blocks read into dataclasses by `_Parser.block` (no accepted extras, no aliases).
_PLAIN_BLOCKS = {
    "tensorboard": TensorboardConfig,
    "activation_checkpointing": ActivationCheckpointingConfig,
    "comms_logger": CommsLoggerConfig,
    "flops_profiler": FlopsProfilerConfig,
    "csv_monitor": CsvMonitorConfig,
    "wandb": WandbConfig,
}
# The blocks of the top level, each read into its dataclass by `_Parser`.
_BLOCKS = {
    "fp16",
    "bf16",
    "optimizer",
    "scheduler",
    "zero_optimization",
    "compile",
    "checkpoint",
    *_PLAIN_BLOCKS,
}
# Fields whose "auto" is resolved later (by Config.resolve); any other "auto" inside a block is
# dropped so the default applies, as DeepSpeed does.
_KEEP_AUTO = {
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
}


class _Parser:
    """Turns a mapping into a Config, collecting warnings to emit with the file name."""

    def __init__(self, origin: str | None):
        self.origin = origin
        self.notes: list[str] = []
        self.dropped_autos: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def block(
        self,
        name: str,
        value: Any,
        cls: type,
        accepted: Mapping[str, Check] = {},  # noqa: B006 - read only
        aliases: Mapping[str, str] = {},  # noqa: B006 - read only
        defaults: Mapping[str, Any] = {},  # noqa: B006 - read only
    ) -> Any:
        """Build dataclass `cls` from the mapping `value` found at key path `name`."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"must be a mapping of keys to values, got {describe(value)}", name)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = dict(defaults)
        for key, target, item in check_keys(name, value, names, accepted, aliases):
            if item == AUTO and target not in _KEEP_AUTO:
                self.dropped_autos.append(f"{name}.{key}")
                continue  # DeepSpeed drops "auto" in sub-blocks: the default applies
            kwargs[target] = item
        try:
            return cls(**kwargs)
        except ConfigError as err:
            raise err.within(name) from None

    def params(self, name: str, value: Any) -> Any:
        """A free-form params mapping; "auto" entries are dropped (no trainer fills them)."""
        if not isinstance(value, Mapping):
            return value  # the dataclass reports the type error
        autos = [k for k, v in value.items() if v == AUTO]
        if autos:
            self.note(
                f'{name}: "auto" for {", ".join(autos)} is dropped (no trainer fills it in); '
                "the defaults apply"
            )
        return {k: v for k, v in value.items() if v != AUTO}

    def typed_block(self, name: str, value: Any, cls: type, accepted: Mapping[str, Check]) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"must be a mapping with type and params, got {describe(value)}", name
            )
        if "type" not in value:
            raise ConfigError('needs a "type" key', name)
        if value["type"] == AUTO:
            raise ConfigError(
                'is "auto", which nothing resolves here (DeepSpeed refuses it too); name the '
                'type, such as "AdamW" or "WarmupLR"',
                f"{name}.type",
            )
        value = dict(value)
        if "params" in value:
            value["params"] = self.params(f"{name}.params", value["params"])
        return self.block(name, value, cls, accepted)

    def zero(self, value: Any) -> ZeroConfig:
        name = "zero_optimization"
        if isinstance(value, bool):  # DeepSpeed's oldest form: true = stage 1
            value = {"stage": 1 if value else 0}
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"must be a mapping of keys to values, got {describe(value)}", name)
        value = dict(value)
        stage = value.get("stage", 0)
        offloads: dict[str, OffloadConfig] = {}
        legacy_of = {block: legacy for legacy, block in LEGACY_OFFLOAD_KEYS.items()}
        for key, accepted, buffer_count in (
            ("offload_optimizer", OFFLOAD_OPTIMIZER_KEYS, 4),
            ("offload_param", {}, 5),
        ):
            legacy = legacy_of[key]
            if legacy in value and value[legacy] is None:  # DeepSpeed's default: not given
                del value[legacy]
            if legacy in value:  # deprecated boolean form
                flag = as_bool(f"{name}.{legacy}", value.pop(legacy))
                if key in value:
                    raise ConfigError(
                        f"and {name}.{key} are both set; keep {key}", f"{name}.{legacy}"
                    )
                if flag:
                    value[key] = {"device": "cpu"}
            block = self.block(
                f"{name}.{key}",
                value.pop(key, None),
                OffloadConfig,
                accepted,
                defaults={"buffer_count": buffer_count},
            )
            offloads[key] = block
        # Normalise offload the stage cannot use, so the engine can trust the config.
        if offloads["offload_optimizer"].enabled and stage == 0:
            self.note(
                f"{name}.offload_optimizer needs stage 1, 2 or 3; ignored at stage 0 "
                "(set stage to use it)"
            )
            offloads["offload_optimizer"] = OffloadConfig()
        if offloads["offload_param"].enabled and stage in (0, 1, 2):
            self.note(f"{name}.offload_param only applies to stage 3; ignored at stage {stage}")
            offloads["offload_param"] = OffloadConfig(buffer_count=5)
        zero = self.block(name, value, ZeroConfig, ZERO_KEYS, KEY_ALIASES[name])
        if zero.stage == 3:
            for key, collective in (
                ("reduce_scatter", "reduce-scatters gradients"),
                ("allgather_partitions", "all-gathers parameters"),
            ):
                if getattr(zero, key) is False:
                    self.note(
                        f"{name}.{key}=false applies to stages 1-2; stage 3 always {collective}"
                    )
        return dataclasses.replace(zero, **offloads)

    def config(self, data: Any, source: str | None) -> Config:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"the config must be a mapping of keys to values, got {type(data).__name__}"
            )
        if "bf16" in data and "bfloat16" in data:
            raise ConfigError('and "bfloat16" are the same block; keep only "bf16"', "bf16")
        top = {f.name for f in dataclasses.fields(Config) if f.metadata.get("config_key", True)}
        kwargs: dict[str, Any] = {}
        # DeepSpeed ignores unknown top-level keys; a misspelt "gradient_clipping" would then
        # train without clipping, so here it is an error.
        for key, target, value in check_keys(
            None,
            data,
            top,
            TOP_LEVEL_KEYS,
            KEY_ALIASES[""],
            unknown="is not a DeepSpeed config key",
            otherwise="remove it",
        ):
            if target in _BLOCKS:
                continue  # read below, each into its dataclass
            if value == AUTO and key not in BATCH_KEYS:
                self.dropped_autos.append(key)
                continue  # no trainer to fill it: the default applies
            kwargs[key] = value
        kwargs["fp16"] = self.block("fp16", data.get("fp16"), FP16Config, FP16_KEYS)
        bf16_name = "bfloat16" if "bfloat16" in data else "bf16"
        kwargs["bf16"] = self.block(bf16_name, data.get(bf16_name), BF16Config, BF16_KEYS)
        kwargs["optimizer"] = self.typed_block(
            "optimizer", data.get("optimizer"), OptimizerConfig, OPTIMIZER_KEYS
        )
        kwargs["scheduler"] = self.typed_block(
            "scheduler", data.get("scheduler"), SchedulerConfig, {}
        )
        kwargs["zero_optimization"] = self.zero(data.get("zero_optimization"))
        kwargs["compile"] = self.block("compile", data.get("compile"), CompileConfig, COMPILE_KEYS)
        kwargs["checkpoint"] = self.block(
            "checkpoint", data.get("checkpoint"), CheckpointConfig, CHECKPOINT_KEYS
        )
        for key, cls in _PLAIN_BLOCKS.items():
            kwargs[key] = self.block(key, data.get(key), cls)
        if self.dropped_autos:
            self.note(
                f'"auto" for {", ".join(self.dropped_autos)} has nothing to resolve it here '
                "(no trainer fills it in); the defaults apply"
            )
        config = Config(**kwargs, raw=data, source=source)
        _check_data_types(data.get("data_types"), config.precision)
        self.gradient_scaling(config)
        return config

    def gradient_scaling(self, config: Config) -> None:
        """`prescale_gradients` / `gradient_predivide_factor` where DeepSpeed 0.19.8 reads them
        (stage 0, and stages 1-2 with reduce_scatter false), refused where it refuses them
        (stage 2 with reduce_scatter, stage 3) and noted where it ignores them (stage 1 with
        reduce_scatter: gradients are divided by the world size before the reduce-scatter)."""
        factor, prescale = config.gradient_predivide_factor, config.prescale_gradients
        zero = config.zero_optimization
        if factor == 1.0 and not prescale:
            return
        key = "prescale_gradients" if prescale else "gradient_predivide_factor"
        shown = "true" if prescale else f"{factor:g}"
        if zero.stage == 3 or (zero.stage == 2 and zero.reduce_scatter):
            fix = (
                "remove it (stage 3 always reduce-scatters)"
                if zero.stage == 3
                else 'remove it, or set "zero_optimization": {"reduce_scatter": false}'
            )
            raise ConfigError(
                f"= {shown} is not supported at ZeRO stage {zero.stage} with reduce-scatter "
                "(DeepSpeed asserts the same: gradients are divided by the world size before "
                f"the reduce-scatter); {fix}",
                key,
            )
        if zero.stage == 1 and zero.reduce_scatter:
            self.note(
                f"{key} = {shown} has no effect at ZeRO stage 1 with reduce_scatter (as in "
                "DeepSpeed, gradients are divided by the world size before the reduce-scatter)"
            )
        elif prescale and factor != 1.0:
            self.note(
                f"gradient_predivide_factor = {factor:g} has no effect with prescale_gradients "
                "(as in DeepSpeed, gradients are divided by the world size before the reduction)"
            )


def _check_data_types(value: Any, precision: str) -> None:
    """`data_types.grad_accum_dtype`: gradients accumulate in the training dtype here, which is
    also DeepSpeed's default; another dtype is refused rather than silently not used."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"must be a mapping of keys to values, got {describe(value)}", "data_types"
        )
    for _key, _field, item in check_keys("data_types", value, ("grad_accum_dtype",)):
        if item is not None and item != precision:
            raise ConfigError(
                f"= {describe(item)} is not supported by this runtime: gradients accumulate in "
                f"the training dtype ({precision}); remove it or set it to {precision!r}",
                "data_types.grad_accum_dtype",
            )


def read_config(
    source: Mapping[str, Any] | str | os.PathLike, origin: str | None
) -> tuple[Config, list[str]]:
    """The validated Config of `source`, and the warning lines (each naming the origin)."""
    if isinstance(source, Mapping):
        data: Any = plain(dict(source), origin)
        file = None
    elif isinstance(source, (str, os.PathLike)):
        file = os.fspath(source)
        origin = origin or file
        data = read_file(source, origin)
    else:
        raise ConfigError(
            f"a config must be a mapping or a path to a JSON/YAML file, got {type(source).__name__}",
            origin=origin,
        )
    parser = _Parser(origin)
    try:
        config = parser.config(data, os.path.abspath(file) if file else None)
    except ConfigError as err:
        raise err.from_file(origin) from None
    return config, [f"{origin}: {note}" if origin else note for note in parser.notes]


def load_config(
    source: Mapping[str, Any] | str | os.PathLike, *, origin: str | None = None
) -> Config:
    """Read and validate a config from a mapping or a .json/.yaml/.yml file.

    `origin` names the config in messages (default: the path as given). Raises ConfigError
    (unknown keys, bad values, features turned on that this runtime does not implement); warns
    (ConfigWarning, one line each) about settings that have no effect here. "auto" values are
    kept; `Config.resolve` fills them.
    """
    config, notes = read_config(source, origin)
    for note in notes:
        warnings.warn(note, ConfigWarning, stacklevel=2)
    return config
