"""Reading a config: JSON/YAML files, and DeepSpeed's keys mapped onto runtime.config's schema.

`runtime.config.load_config` is the entry point. Here live the parts that only matter while
reading: the DeepSpeed keys this runtime accepts without modelling them (silent when harmless,
a warning when they would change training and are not implemented), DeepSpeed's other
spellings of ZeRO keys, "auto" handling inside blocks, and file parsing that rejects duplicate
keys in JSON and YAML. No torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Union

from .config import (
    _BATCH_KEYS,
    AUTO,
    BF16Config,
    Config,
    ConfigError,
    FP16Config,
    OffloadConfig,
    OptimizerConfig,
    SchedulerConfig,
    TensorboardConfig,
    ZeroConfig,
    _bool,
    _describe,
    _suggest,
)

__all__ = ["read_config"]


# ---------------------------------------------------------------------------------------------
# Mapping -> Config.

# Known DeepSpeed keys this runtime does not model. A checker returns a warning text when the
# value turns on something that would change training and is not implemented; None = harmless.
Checker = Callable[[Any], Union[str, None]]


def _silent(_value: Any) -> None:
    return None


def _when_enabled(_what: str = "") -> Checker:
    def check(value: Any) -> str | None:
        if isinstance(value, Mapping) and value.get("enabled") is True:
            return "is enabled but not implemented by this runtime; it is ignored"
        return None

    return check


def _unless(*inactive: Any) -> Checker:
    def check(value: Any) -> str | None:
        if value in inactive:
            return None
        return f"= {_describe(value)} is not implemented by this runtime; it is ignored"

    return check


def _when_present(value: Any) -> str | None:
    return "is not implemented by this runtime; it is ignored"


def _grad_accum_dtype(value: Any) -> str | None:
    if isinstance(value, Mapping) and value.get("grad_accum_dtype") not in (None, "fp32"):
        return "grad_accum_dtype is not implemented by this runtime; it is ignored"
    return None


_TOP_LEVEL_ACCEPTED: dict[str, Checker] = {
    "wall_clock_breakdown": _silent,
    "memory_breakdown": _silent,
    "dump_state": _silent,
    "zero_allow_untested_optimizer": _silent,
    "zero_force_ds_cpu_optimizer": _silent,
    "zero_allow_comm_data_type_fp32": _silent,
    "flops_profiler": _silent,
    "checkpoint": _silent,
    "activation_checkpointing": _silent,
    "comms_logger": _silent,
    "csv_monitor": _silent,
    "wandb": _silent,
    "comet": _silent,
    "aio": _silent,
    "timers": _silent,
    "disable_allgather": _silent,
    "compile": _silent,
    "autotuning": _silent,
    "pipeline": _silent,
    "nebula": _silent,
    "graph_harvesting": _silent,
    "use_data_before_expert_parallelism": _silent,
    "weight_quantization": _silent,
    "data_types": _grad_accum_dtype,
    "prescale_gradients": _unless(False),
    "gradient_predivide_factor": _unless(1, 1.0),
    "communication_data_type": _unless(None),
    "seq_parallel_size": _unless(1),
    "sparse_gradients": _unless(False),
    "amp": _when_enabled(),
    "torch_autocast": _when_enabled(),
    "elasticity": _when_enabled(),
    "curriculum_learning": _when_enabled(),
    "data_efficiency": _when_enabled(),
    "progressive_layer_drop": _when_enabled(),
    "eigenvalue": _when_enabled(),
    "quantize_training": _when_enabled(),
    "hybrid_engine": _when_enabled(),
    "compression_training": _when_present,
    "sparse_attention": _when_present,
}

_FP16_ACCEPTED: dict[str, Checker] = {
    "auto_cast": _unless(False),
    "fp16_master_weights_and_grads": _unless(False),
}
_BF16_ACCEPTED: dict[str, Checker] = {
    "immediate_grad_update": _silent,
    "check_grad_overflow": _silent,
    "bf16_master_weights_and_grads": _unless(False),
    "bf16_optimizer_states": _unless(False),
}
_OPTIMIZER_ACCEPTED: dict[str, Checker] = {"legacy_fusion": _silent}
_OFFLOAD_OPTIMIZER_ACCEPTED: dict[str, Checker] = {
    "pipeline_read": _silent,
    "pipeline_write": _silent,
    "pipeline": _silent,
    "fast_init": _silent,
    "convert_grad_on_cpu": _silent,
    "cpuadam_cores_perc": _silent,
    "ratio": _unless(1, 1.0),
    "super_offload": _unless(False),
}
_ZERO_ACCEPTED: dict[str, Checker] = {
    "load_from_fp32_weights": _silent,
    "elastic_checkpoint": _silent,
    "ignore_unused_parameters": _silent,
    "legacy_stage1": _silent,
    "use_multi_rank_bucket_allreduce": _silent,
    "memory_efficient_linear": _silent,
    "pipeline_loading_checkpoint": _silent,
    "override_module_apply": _silent,
    "log_trace_cache_warnings": _silent,
    "enable_sanity_checks": _silent,
    "save_muon_momentum_buffer_in_memory": _silent,
    "leaf_module": _silent,
    "cpu_offload_use_pin_memory": _silent,
    "stage3_model_persistence_threshold": _silent,
    "stage3_module_granularity_threshold": _silent,
    "stage3_use_all_reduce_for_fetch_params": _silent,
    "stage3_allgather_sequential": _silent,
    "stage3_partition_stream_chunk_size": _silent,
    "mics_hierarchical_params_gather": _silent,
    "zero_hpz_partition_size": _unless(1),
    "zero_quantized_weights": _unless(False),
    "zero_quantized_nontrainable_weights": _unless(False),
    "zero_quantized_gradients": _unless(False),
    "zeropp_loco_param": _unless(None),
    "mics_shard_size": _unless(-1, 0),
    "zenflow": _unless(None),
}
# DeepSpeed's other spellings of ZeRO keys -> ours.
_ZERO_ALIASES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
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
        accepted: Mapping[str, Checker] = {},  # noqa: B006 - read only
        aliases: Mapping[str, str] = {},  # noqa: B006 - read only
        defaults: Mapping[str, Any] = {},  # noqa: B006 - read only
    ) -> Any:
        """Build dataclass `cls` from the mapping `value` found at key path `name`."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"must be a mapping of keys to values, got {_describe(value)}", name)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = dict(defaults)
        for key, item in value.items():
            path = f"{name}.{key}"
            target = aliases.get(key, key)
            if target in names:
                if target != key and target in value:
                    raise ConfigError(
                        f"and {name}.{target} both set the same option; keep one", path
                    )
                if item == AUTO and target not in _KEEP_AUTO:
                    self.dropped_autos.append(path)
                    continue  # DeepSpeed drops "auto" in sub-blocks: the default applies
                kwargs[target] = item
            elif key in accepted:
                message = accepted[key](item)
                if message:
                    self.note(f"{path} {message}")
            else:
                hint = _suggest(str(key), names | set(accepted) | set(aliases))
                valid = ", ".join(sorted(names))
                raise ConfigError(
                    "is not a valid key; " + (hint if hint else f"valid keys: {valid}"), path
                )
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

    def typed_block(self, name: str, value: Any, cls: type, accepted: Mapping[str, Checker]) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"must be a mapping with type and params, got {_describe(value)}", name
            )
        if "type" not in value:
            raise ConfigError('needs a "type" key', name)
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
            raise ConfigError(f"must be a mapping of keys to values, got {_describe(value)}", name)
        value = dict(value)
        stage = value.get("stage", 0)
        offloads: dict[str, OffloadConfig] = {}
        for key, legacy, accepted, buffer_count in (
            ("offload_optimizer", "cpu_offload", _OFFLOAD_OPTIMIZER_ACCEPTED, 4),
            ("offload_param", "cpu_offload_param", {}, 5),
        ):
            if legacy in value:  # deprecated boolean form
                flag = _bool(f"{name}.{legacy}", value.pop(legacy))
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
        zero = self.block(name, value, ZeroConfig, _ZERO_ACCEPTED, _ZERO_ALIASES)
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
        top = {f.name for f in dataclasses.fields(Config)} - {"raw", "source"}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("fp16", "bf16", "bfloat16", "optimizer", "scheduler"):
                continue
            if key in ("zero_optimization", "tensorboard"):
                continue
            if key in top:
                if value == AUTO and key not in _BATCH_KEYS:
                    self.dropped_autos.append(key)
                    continue  # no trainer to fill it: the default applies
                kwargs[key] = value
            elif key in _TOP_LEVEL_ACCEPTED:
                message = _TOP_LEVEL_ACCEPTED[key](value)
                if message:
                    self.note(f"{key} {message}")
            else:
                hint = _suggest(str(key), top | {"bfloat16"} | set(_TOP_LEVEL_ACCEPTED))
                self.note(
                    f"unknown top-level key '{key}' is ignored" + (f"; {hint}" if hint else "")
                )
        kwargs["fp16"] = self.block("fp16", data.get("fp16"), FP16Config, _FP16_ACCEPTED)
        bf16_name = "bfloat16" if "bfloat16" in data else "bf16"
        kwargs["bf16"] = self.block(bf16_name, data.get(bf16_name), BF16Config, _BF16_ACCEPTED)
        kwargs["optimizer"] = self.typed_block(
            "optimizer", data.get("optimizer"), OptimizerConfig, _OPTIMIZER_ACCEPTED
        )
        kwargs["scheduler"] = self.typed_block(
            "scheduler", data.get("scheduler"), SchedulerConfig, {}
        )
        kwargs["zero_optimization"] = self.zero(data.get("zero_optimization"))
        kwargs["tensorboard"] = self.block(
            "tensorboard", data.get("tensorboard"), TensorboardConfig
        )
        if self.dropped_autos:
            self.note(
                f'"auto" for {", ".join(self.dropped_autos)} has nothing to resolve it here '
                "(no trainer fills it in); the defaults apply"
            )
        return Config(**kwargs, raw=data, source=source)


# ---------------------------------------------------------------------------------------------
# Files.


class _DupDict(dict):
    """A parsed mapping that remembers keys given more than once (and where, for YAML)."""

    duplicates: list[tuple[str, str]]


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    result = _DupDict()
    result.duplicates = []
    for key, value in pairs:
        if key in result:
            result.duplicates.append((key, ""))
        result[key] = value
    return result


def _find_duplicate(data: Any, path: str = "") -> tuple[str, str] | None:
    if isinstance(data, _DupDict) and data.duplicates:
        key, where = data.duplicates[0]
        return (f"{path}.{key}" if path else key), where
    if isinstance(data, dict):
        for key, value in data.items():
            found = _find_duplicate(value, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found = _find_duplicate(value, f"{path}[{i}]")
            if found:
                return found
    return None


def _plain(data: Any) -> Any:
    """Strip the duplicate-tracking type so `Config.raw` is plain dicts and lists."""
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return data


def _parse_json(text: str, origin: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_json_pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}", origin=origin
        ) from None


def _yaml_loader() -> type:
    import yaml  # only needed for YAML files

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that records duplicate keys and reads 5e8 / 1e-3 as numbers.

        PyYAML (YAML 1.1) reads `lr: 1e-3` as the string "1e-3"; YAML 1.2 and every JSON user
        expect a float.
        """

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict:
        seen: set[Any] = set()
        duplicates = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                duplicates.append((key, f"line {key_node.start_mark.line + 1}"))
            seen.add(key)
        loader.flatten_mapping(node)
        result = _DupDict(loader.construct_pairs(node, deep=deep))
        result.duplicates = duplicates
        return result

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return StrictLoader


def _parse_yaml(text: str, origin: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"invalid YAML{where}: {problem}", origin=origin) from None


def _read(path: str | os.PathLike, origin: str) -> Any:
    try:
        with open(path, encoding="utf-8-sig") as handle:  # a BOM is not an error
            text = handle.read()
    except FileNotFoundError:
        raise ConfigError("no such file; check the path", origin=origin) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", origin=origin) from None
    except OSError as err:
        raise ConfigError(f"cannot be read: {err.strerror}", origin=origin) from None
    except UnicodeDecodeError:
        raise ConfigError("is not UTF-8 text; is it a JSON or YAML file?", origin=origin) from None
    if str(path).lower().endswith((".yaml", ".yml")):
        data = _parse_yaml(text, origin)
    else:
        data = _parse_json(text, origin)
    found = _find_duplicate(data)
    if found:
        key, where = found
        at = f" ({where})" if where else ""
        raise ConfigError(
            f"is given more than once{at}; a later value would silently replace an earlier one, "
            "so keep exactly one",
            key,
            origin,
        )
    return _plain(data)


def read_config(
    source: Mapping[str, Any] | str | os.PathLike, origin: str | None
) -> tuple[Config, list[str]]:
    """The validated Config of `source`, and the warning lines (each naming the origin)."""
    if isinstance(source, Mapping):
        data: Any = _plain(dict(source))
        file = None
    elif isinstance(source, (str, os.PathLike)):
        file = os.fspath(source)
        origin = origin or file
        data = _read(source, origin)
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
