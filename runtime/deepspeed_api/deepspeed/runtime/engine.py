"""``deepspeed.runtime.engine.DeepSpeedEngine``: the runtime's `Engine` under DeepSpeed's name,
plus the engine methods the Hugging Face integration calls that only DeepSpeed spells."""

from __future__ import annotations

import torch

from runtime.engine.engine import Engine

from .._missing import module_getattr

__all__ = ["DeepSpeedEngine"]


class DeepSpeedEngine(Engine):
    """What ``deepspeed.initialize`` returns here. Training, checkpoints and the getters are the
    runtime's `Engine`; this class adds DeepSpeed's names for what accelerate and the Trainer
    ask of it when saving a model."""

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


__getattr__ = module_getattr("deepspeed.runtime.engine")
