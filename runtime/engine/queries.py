"""What scripts ask the engine (DeepSpeed's getters), answered from its config, optimizer and
precision: batch sizes and accumulation steps, learning rates and momenta, the last gradient
norm, the live loss scale, the ZeRO stage; and the one setter of the batch size.
"""

from __future__ import annotations

import dataclasses

from runtime.errors import InvalidValueError

__all__ = ["EngineQueries", "LiveLossScale"]


class LiveLossScale(float):
    """The current loss scale. Works as a value (``engine.loss_scale``) and, for scripts written
    for DeepSpeed, as a call (``engine.loss_scale()``). Unlike DeepSpeed, whose
    ``loss_scale()`` returns the *configured* static scale (0 under dynamic scaling), this is
    always the scale the last backward actually used (1.0 without fp16)."""

    def __call__(self) -> float:
        return float(self)


class EngineQueries:
    """Mixed into `Engine`, which provides ``config``, ``optimizer``, ``precision`` and
    ``dp_world_size``."""

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_mom(self) -> list:
        """Per group, the momentum as DeepSpeed reports it: ``betas`` for Adam-like
        optimizers, ``momentum`` for SGD/RMSprop, 0.0 where the group has neither."""
        key = "betas" if "betas" in self.optimizer.param_groups[0] else "momentum"
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """Norm of the last step's gradients over all ranks, before clipping."""
        return self.optimizer.last_grad_norm

    @property
    def loss_scale(self) -> LiveLossScale:
        return LiveLossScale(self.precision.loss_scale)

    @property
    def zero_stage(self) -> int:
        return self.config.zero_optimization.stage

    def zero_optimization_stage(self) -> int:
        return self.zero_stage

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """Change the global batch size by changing gradient_accumulation_steps (the micro
        batch stays); it must be a multiple of micro batch * world size."""
        per_step = self.train_micro_batch_size_per_gpu() * self.dp_world_size
        if (
            isinstance(train_batch_size, bool)
            or not isinstance(train_batch_size, int)
            or train_batch_size < 1
            or train_batch_size % per_step
        ):
            raise InvalidValueError(
                f"train_batch_size {train_batch_size!r} must be a positive multiple of "
                f"train_micro_batch_size_per_gpu * world size = {per_step}"
            )
        self.config = dataclasses.replace(
            self.config,
            train_batch_size=train_batch_size,
            gradient_accumulation_steps=train_batch_size // per_step,
        )
