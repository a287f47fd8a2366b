"""``deepspeed.runtime.engine.DeepSpeedEngine``: the runtime's `Engine` under DeepSpeed's name,
plus the engine methods scripts call that only DeepSpeed spells (its precision, ZeRO and
batch queries, read from the engine's config with DeepSpeed's meaning).

Any other attribute DeepSpeed's engine has (`DEEPSPEED_ENGINE_NAMES`) raises
`NotInBundledRuntime` naming it; a name DeepSpeed's engine does not have either stays a plain
AttributeError, so ``hasattr`` probes for other wrappers (``_orig_mod``, ...) answer False.
"""

from __future__ import annotations

import torch

from runtime.engine.engine import Engine

from .._missing import missing, module_getattr
from .engine_names import DEEPSPEED_ENGINE_NAMES

__all__ = ["DeepSpeedEngine"]

# DeepSpeed's optimizer names it lower-cases when the config names one of them.
_DEEPSPEED_OPTIMIZERS = {
    "adagrad", "adam", "adamw", "lamb", "onebitadam", "zerooneadam", "onebitlamb", "lion",
    "muadam", "muadamw", "musgd", "muon",
}  # fmt: skip

# engine method -> the zero_optimization field it returns (DeepSpeed's getters of the same name)
_ZERO_GETTERS = {
    "zero_allgather_partitions": "allgather_partitions",
    "zero_allgather_bucket_size": "allgather_bucket_size",
    "zero_reduce_scatter": "reduce_scatter",
    "zero_reduce_bucket_size": "reduce_bucket_size",
    "zero_contiguous_gradients": "contiguous_gradients",
    "zero_round_robin_gradients": "round_robin_gradients",
    "zero_sub_group_size": "sub_group_size",
    "zero_prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "zero_param_persistence_threshold": "stage3_param_persistence_threshold",
    "zero_max_live_parameters": "stage3_max_live_parameters",
    "zero_max_reuse_distance": "stage3_max_reuse_distance",
    "zero_hpz_partition_size": "zero_hpz_partition_size",
    "zero_quantized_weights": "zero_quantized_weights",
    "zero_quantized_nontrainable_weights": "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients": "zero_quantized_gradients",
}


def _zero_getter(name: str, field: str):
    def getter(self):
        return getattr(self.config.zero_optimization, field)

    getter.__name__ = name
    getter.__doc__ = f"``zero_optimization.{field}`` as configured."
    return getter


class DeepSpeedEngine(Engine):
    """What ``deepspeed.initialize`` returns here. Training, checkpoints and the getters are the
    runtime's `Engine`; this class adds DeepSpeed's names for what scripts, Lightning,
    accelerate and the Trainer ask of it."""

    # ---- precision
    def bfloat16_enabled(self) -> bool:
        return bool(self.config.bf16.enabled)

    def fp16_enabled(self) -> bool:
        return bool(self.config.fp16.enabled)

    def dynamic_loss_scale(self) -> bool:
        """DeepSpeed's meaning: fp16's ``loss_scale`` is 0 (dynamic scaling)."""
        return self.config.fp16.loss_scale == 0

    def initial_dynamic_scale(self) -> float:
        return float(2**self.config.fp16.initial_scale_power)

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def gradient_predivide_factor(self) -> float:
        return self.config.gradient_predivide_factor

    def postscale_gradients(self) -> bool:
        return not self.config.prescale_gradients

    # ---- ZeRO
    def zero_optimization(self) -> bool:
        """Whether ZeRO is on (stage 1 or more)."""
        return self.zero_stage > 0

    def zero_optimization_partition_gradients(self) -> bool:
        return self.zero_stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.zero_stage >= 3

    def zero_offload_optimizer(self):
        """The ``offload_optimizer`` block when it offloads (its ``.device``), else None."""
        block = self.config.zero_optimization.offload_optimizer
        return None if block.device == "none" else block

    def zero_offload_param(self):
        """The ``offload_param`` block when it offloads (its ``.device``), else None."""
        block = self.config.zero_optimization.offload_param
        return None if block.device == "none" else block

    def zero_cpu_offload(self) -> bool:
        return self.config.zero_optimization.offload_optimizer.device == "cpu"

    zero_use_cpu_optimizer = zero_cpu_offload  # CPU is the only offload device here

    # ---- batch, ranks, printing
    def get_batch_info(self) -> tuple[int, int, int]:
        """``(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)``."""
        return (
            self.train_batch_size(),
            self.train_micro_batch_size_per_gpu(),
            self.gradient_accumulation_steps(),
        )

    def dataloader_drop_last(self) -> bool:
        return self.config.dataloader_drop_last

    def steps_per_print(self):
        return self.config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return self.config.wall_clock_breakdown

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def optimizer_name(self) -> str | None:
        """The config's optimizer type (lower-cased when it is one of DeepSpeed's), or the
        client optimizer's class name."""
        if self.config.optimizer is None:
            inner = getattr(self.optimizer, "optimizer", self.optimizer)
            return type(inner).__name__
        name = self.config.optimizer.type
        return name.lower() if name.lower() in _DEEPSPEED_OPTIMIZERS else name

    def optimizer_params(self) -> dict | None:
        block = self.config.optimizer
        return None if block is None else dict(block.params)

    def scheduler_name(self) -> str | None:
        return None if self.config.scheduler is None else self.config.scheduler.type

    def scheduler_params(self) -> dict | None:
        block = self.config.scheduler
        return None if block is None else dict(block.params)

    # ---- saving
    def save_16bit_model(
        self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters=False
    ) -> bool:
        """DeepSpeed's default file name (``pytorch_model.bin``, a ``torch.save`` state dict);
        a ``*.safetensors`` name is written as safetensors (`Engine.save_16bit_model`)."""
        return super().save_16bit_model(save_dir, save_filename, exclude_frozen_parameters)

    def save_fp16_model(self, save_dir, save_filename: str = "pytorch_model.bin") -> bool:
        """DeepSpeed's older name for `save_16bit_model`."""
        return self.save_16bit_model(save_dir, save_filename)

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Whether ZeRO-3 weights may be gathered to save a full model
        (``stage3_gather_16bit_weights_on_model_save``)."""
        return bool(self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def _zero3_consolidated_16bit_state_dict(
        self, exclude_frozen_parameters: bool = False
    ) -> dict[str, torch.Tensor]:
        """The full weights (the module's dtype, CPU) on rank 0, ``{}`` on the others; a
        collective. accelerate's ``get_state_dict`` and ``Trainer.save_model`` call it at
        ZeRO-3; at other stages the parameters are whole and it returns them the same way."""
        from runtime.zero.stage3.save import consolidated_state_dict

        return consolidated_state_dict(self.module, self.global_rank, exclude_frozen_parameters)

    def destroy(self) -> None:
        """``accelerator.free_memory()`` calls this; the engine holds no process-wide state to
        release (the process group belongs to the script)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # torch.nn.Module's: parameters, buffers, children
        except AttributeError:
            # A property of ours that failed inside keeps its own error; only a name this
            # engine lacks and DeepSpeed's has is "not in the bundled runtime".
            if name in DEEPSPEED_ENGINE_NAMES and not any(
                name in vars(k) for k in type(self).__mro__
            ):
                raise missing(f"DeepSpeedEngine.{name}") from None
            raise


for _name, _field in _ZERO_GETTERS.items():
    setattr(DeepSpeedEngine, _name, _zero_getter(_name, _field))

__getattr__ = module_getattr(__name__)
