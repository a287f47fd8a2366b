"""DeepSpeed config keys this runtime reads but does not model: accepted, or refused.

A DeepSpeed config may carry blocks for features this runtime does not implement (profilers,
monitors, pipeline parallelism, ZeRO++, ...). Left at their disabled defaults they change
nothing, so they are accepted and ignored, as DeepSpeed accepts them. Turned on, the user
expects the feature: running without it would be a silent lie, so the config is refused before
launch, saying that the feature is not supported and what to do instead.

Each key maps to a `Rule`: called with the key's value it returns None (accepted) or the
refusal, the text that follows the key path in the error ("is enabled but not supported by this
runtime; ..."); its `says` is the same rule in words, for the config reference (docs/config.md).
No torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from .values import describe

__all__ = [
    "BF16_KEYS",
    "CHECKPOINT_KEYS",
    "COMPILE_KEYS",
    "FP16_KEYS",
    "OFFLOAD_OPTIMIZER_KEYS",
    "OPTIMIZER_KEYS",
    "TOP_LEVEL_KEYS",
    "UNMODELLED_KEYS",
    "ZERO_KEYS",
    "Check",
    "Rule",
]

Check = Callable[[Any], Union[str, None]]

_UNSUPPORTED = "not supported by this runtime"


@dataclass(frozen=True)
class Rule:
    """How one DeepSpeed key this runtime does not model is treated."""

    says: str
    """The rule in words: when the key is accepted, when refused, and what to do instead."""
    check: Check
    """The value's check: None when accepted, else the refusal that follows the key path."""

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def _literal(value: Any) -> str:
    """A value as the config would spell it (JSON)."""
    return json.dumps(value)


accepted = Rule(
    "accepted: a performance or bookkeeping knob that changes no result here", lambda _v: None
)


def _enabled(value: Any, depth: int = 0) -> bool:
    """`"enabled": true` in the block or any block nested in it (compression_training and
    data_efficiency enable features in sub-blocks)."""
    if not isinstance(value, Mapping) or depth > 8:
        return False
    if value.get("enabled") is True:
        return True
    return any(_enabled(v, depth + 1) for v in value.values())


def when_enabled(instead: str) -> Rule:
    """Refused when the block (or a sub-block) says `"enabled": true`."""

    def check(value: Any) -> str | None:
        if _enabled(value):
            return (
                f'is enabled but {_UNSUPPORTED}; {instead}, or set "enabled": false '
                "(or remove the block)"
            )
        return None

    return Rule(f"accepted while disabled; enabled, refused: {instead}", check)


def unless(*inactive: Any, instead: str = "remove it") -> Rule:
    """Refused when the value is not one of the `inactive` (DeepSpeed default) values."""

    def check(value: Any) -> str | None:
        # true is not 1 and false is not 0 here: a flag given where a number belongs is wrong.
        if any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in inactive):
            return None
        return f"= {describe(value)} is {_UNSUPPORTED}; {instead}"

    allowed = " or ".join(_literal(v) for v in inactive)
    return Rule(f"accepted as {allowed}; anything else refused: {instead}", check)


def when_present(instead: str) -> Rule:
    """Refused whenever the key is there (the block has no off switch)."""

    def check(_value: Any) -> str:
        return f"is {_UNSUPPORTED}; {instead}"

    return Rule(f"refused: {instead}", check)


def when_differs(defaults: Mapping[str, Any], instead: str) -> Rule:
    """Refused when a key of the block is set to something other than DeepSpeed's default."""

    def check(value: Any) -> str | None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key not in defaults or item != defaults[key]:
                    return f"{key} = {describe(item)} is {_UNSUPPORTED}; {instead}"
        return None

    shown = ", ".join(f"{key} {_literal(item)}" for key, item in defaults.items())
    return Rule(
        f"accepted at DeepSpeed's defaults ({shown}); anything else refused: {instead}", check
    )


def _tensor_parallel_check(value: Any) -> str | None:
    """DeepSpeed's AutoTP training block: off while autotp_size (and tp.tp_size) is 0 or 1."""
    if not isinstance(value, Mapping):
        return None
    inner = value.get("tp", value.get("tensor_parallel"))
    sizes = [value.get("autotp_size", 0)]
    if isinstance(inner, Mapping):
        sizes.append(inner.get("tp_size", 1))
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size > 1:
            return (
                f"sets a tensor-parallel size of {describe(size)}, which is {_UNSUPPORTED} "
                "(data parallelism only); remove the block"
            )
    return None


_tensor_parallel = Rule(
    "accepted while autotp_size (and tp.tp_size) is 0 or 1; a tensor-parallel size above 1 is "
    "refused (data parallelism only)",
    _tensor_parallel_check,
)


TOP_LEVEL_KEYS: dict[str, Rule] = {
    # Harmless: performance knobs and bookkeeping that change no result here.
    "zero_allow_untested_optimizer": accepted,
    "zero_force_ds_cpu_optimizer": accepted,
    "zero_allow_comm_data_type_fp32": accepted,
    "timers": accepted,
    "disable_allgather": accepted,
    "disable_python_gc": accepted,
    "log_level": accepted,
    "vocabulary_size": accepted,
    "graph_harvesting": accepted,
    "use_data_before_expert_parallelism": accepted,
    "seq_parallel_communication_data_type": accepted,
    # Read with offload_optimizer.device "nvme" (block_size, queue_depth, thread_count; the
    # rest have no meaning for a thread pool): docs/nvme-offload.md.
    "aio": accepted,
    "weight_quantization": accepted,
    "data_types": Rule(
        "accepted; grad_accum_dtype other than the training dtype is refused (gradients "
        "accumulate in the training dtype)",
        lambda _v: None,  # runtime.config.load checks grad_accum_dtype against the precision
    ),
    # Features that are refused when turned on.
    "memory_breakdown": unless(
        False, instead="memory is in the step metrics (zlaunch's live view, metrics.jsonl)"
    ),
    "dump_state": unless(False, instead="remove it"),
    "comet": when_enabled(
        "use the csv_monitor, wandb or tensorboard block, or log from the script "
        "(engine.log_metrics)"
    ),
    "autotuning": when_enabled("set batch and bucket sizes yourself (zlaunch estimate helps)"),
    "nebula": when_enabled("checkpoints are written by engine.save_checkpoint"),
    "elasticity": when_enabled("set the batch sizes for the world size you launch"),
    "data_efficiency": when_enabled("sample and order the data in the script's data loader"),
    "curriculum_learning": when_enabled("order the data in the script's data loader"),
    "compression_training": when_enabled("compress the model outside the training runtime"),
    "progressive_layer_drop": when_enabled("remove the block"),
    "eigenvalue": when_enabled("remove the block"),
    "quantize_training": when_enabled("remove the block"),
    "hybrid_engine": when_enabled("remove the block"),
    "expert_parallel": when_enabled("remove the block"),
    "amp": when_enabled('use "bf16": {"enabled": true} or "fp16": {"enabled": true}'),
    "torch_autocast": when_enabled(
        'use "bf16": {"enabled": true} or "fp16": {"enabled": true}, or torch.autocast in '
        "the script"
    ),
    "sparse_attention": when_present("remove the block"),
    "pipeline": when_differs(
        {
            "stages": "auto",
            "partition": "best",
            "seed_layers": False,
            "activation_checkpoint_interval": 0,
            "pipe_partitioned": True,
            "grad_partitioned": True,
            "use_reentrant": True,
        },
        "pipeline parallelism is not implemented; remove the block",
    ),
    "tensor_parallel": _tensor_parallel,
    "gradient_allreduce_op": unless("mean", instead="gradients are averaged; remove it"),
    "managed_gradient_accumulation": unless(
        True,
        instead="call engine.step() after every backward, or use "
        "engine.set_gradient_accumulation_boundary()",
    ),
    "seq_parallel_size": unless(1),
    "sequence_parallel_size": unless(1),
    "sparse_gradients": unless(False),
}

FP16_KEYS: dict[str, Rule] = {
    "auto_cast": unless(False),
    "fp16_master_weights_and_grads": unless(False, instead="master weights are fp32"),
}
BF16_KEYS: dict[str, Rule] = {
    "immediate_grad_update": accepted,
    "bf16_master_weights_and_grads": unless(False, instead="master weights are fp32"),
    "bf16_optimizer_states": unless(False, instead="optimizer states are fp32"),
}
OPTIMIZER_KEYS: dict[str, Rule] = {"legacy_fusion": accepted}
_ANY_WORLD = "checkpoints here load at any world size and stage without conversion; remove it"
CHECKPOINT_KEYS: dict[str, Rule] = {
    "tag_validation": accepted,
    "parallel_write": accepted,  # pipeline-stage writes: pipelines are refused
    "load_universal": unless(False, instead=_ANY_WORLD),
    "use_node_local_storage": unless(False, instead=_ANY_WORLD),
}
# DeepSpeed 0.19.8's `compile` block holds DeepCompile's settings (its own compiler passes);
# torch.compile itself is `compile.enabled` / engine.compile() (runtime.config.blocks).
_DEEPCOMPILE = (
    "DeepCompile (DeepSpeed's own compiler passes) is not implemented; remove it: "
    'engine.compile() or "compile": {"enabled": true} compile the model with torch.compile'
)
COMPILE_KEYS: dict[str, Rule] = {
    "deepcompile": unless(False, instead=_DEEPCOMPILE),
    "autoep_non_moe": unless(False, instead="expert parallelism (AutoEP) is not implemented"),
    "passes": unless(None, instead=_DEEPCOMPILE),
    # DeepCompile's settings: read by DeepSpeed only with deepcompile on (refused above).
    **{
        key: accepted
        for key in (
            "free_activation",
            "free_activation_threshold",
            "offload_activation",
            "offload_activation_pin_memory",
            "offload_opt_states",
            "double_buffer",
            "symmetric_memory",
            "debug_log",
            "offload_parameters",
            "sync_before_reduce",
            "sync_after_reduce",
            "sync_before_allgather",
            "sync_after_allgather",
            "keep_int_input_tensors",
            "keep_all_input_tensors",
        )
    },
}
OFFLOAD_OPTIMIZER_KEYS: dict[str, Rule] = {
    "pipeline_read": accepted,
    "pipeline_write": accepted,
    "pipeline": accepted,
    "fast_init": accepted,
    "convert_grad_on_cpu": accepted,
    "cpuadam_cores_perc": accepted,
    "ratio": unless(1, 1.0, instead="the whole optimizer state is offloaded; remove it"),
    "super_offload": unless(False),
}
_LOCO = "ZeRO++'s LoCo error feedback is not implemented; remove it (qgZ runs without it)"
ZERO_KEYS: dict[str, Rule] = {
    "load_from_fp32_weights": accepted,
    "elastic_checkpoint": accepted,
    "ignore_unused_parameters": accepted,
    "legacy_stage1": accepted,
    "use_multi_rank_bucket_allreduce": accepted,
    "memory_efficient_linear": accepted,
    "pipeline_loading_checkpoint": accepted,
    "override_module_apply": accepted,
    "log_trace_cache_warnings": accepted,
    "enable_sanity_checks": accepted,
    "save_muon_momentum_buffer_in_memory": accepted,
    "leaf_module": accepted,
    "cpu_offload_use_pin_memory": accepted,
    "stage3_model_persistence_threshold": accepted,
    "stage3_module_granularity_threshold": accepted,
    "stage3_use_all_reduce_for_fetch_params": accepted,
    "stage3_allgather_sequential": accepted,
    # DeepSpeed's field names of the four above (it accepts either spelling)
    "model_persistence_threshold": accepted,
    "module_granularity_threshold": accepted,
    "use_all_reduce_for_fetch_params": accepted,
    "allgather_sequential": accepted,
    "parameter_alignment": accepted,  # padding between parameters; results are the same
    "stage3_partition_stream_chunk_size": accepted,
    "mics_hierarchical_params_gather": accepted,
    "compute_grad_norm": unless(True, instead="the gradient norm is always computed"),
    "zeropp_loco_param": unless(None, instead=_LOCO),
    "mics_shard_size": unless(-1, 0, instead="MiCS is not implemented; remove it"),
    "zenflow": unless(None, instead="ZenFlow is not implemented; remove it"),
}

UNMODELLED_KEYS: dict[str, Mapping[str, Rule]] = {
    "": TOP_LEVEL_KEYS,
    "fp16": FP16_KEYS,
    "bf16": BF16_KEYS,
    "optimizer": OPTIMIZER_KEYS,
    "compile": COMPILE_KEYS,
    "checkpoint": CHECKPOINT_KEYS,
    "zero_optimization": ZERO_KEYS,
    "zero_optimization.offload_optimizer": OFFLOAD_OPTIMIZER_KEYS,
}
"""Each block's DeepSpeed keys that are read but not modelled, by block path ("" is the top
level): what the config reference lists beside each block's own keys."""
