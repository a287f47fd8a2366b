"""fp16 loss scaling with DeepSpeed's semantics (docs/deepspeed-compat.md, "Dynamic loss scaling").

Pure Python: the engine decides overflow (one collective that also carries the gradient norm)
and tells the scaler with `update(overflow)`. On overflow the engine skips the optimizer step
and the scheduler step.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidValueError, UsageError

__all__ = [
    "DynamicLossScaler",
    "LossScaleAtMinimum",
    "StaticLossScaler",
    "build_loss_scaler",
]


class LossScaleAtMinimum(UsageError):
    """Gradients overflowed although the loss scale is already at its minimum.

    Training cannot make progress in fp16 this way: the model has diverged, or min_loss_scale
    is too high. DeepSpeed raises a bare Exception here; this names the numbers and the fixes.
    """


class StaticLossScaler:
    """A constant loss scale (`fp16.loss_scale` > 0, or 1.0 when not training in fp16)."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        if not scale > 0:
            raise InvalidValueError(f"loss scale must be > 0, got {scale}")
        self.scale = float(scale)
        self.last_message: str | None = None

    def update(self, overflow: bool) -> None:
        """A static scale never changes; an overflowed step is still skipped by the engine."""
        self.last_message = (
            f"gradient overflow: skipping step, static loss scale {self.scale:g}"
            if overflow
            else None
        )

    def state_dict(self) -> dict[str, Any]:
        return {"dynamic": False, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self.scale:g})"


class DynamicLossScaler:
    """DeepSpeed's dynamic loss scaler.

    On overflow: if the hysteresis counter is down to 1 (or hysteresis is 1), halve the scale
    (not below `min_scale`), otherwise decrement the counter. After `scale_window` overflow-free
    updates, double the scale and (unless `consecutive_hysteresis`) refill the counter. With
    `consecutive_hysteresis` the counter is refilled on every overflow-free update.

    An overflow at `min_scale` raises LossScaleAtMinimum, unless `raise_at_minimum` is false:
    then the scale stays at the minimum and the step is skipped like any overflowed step.
    """

    dynamic = True

    def __init__(
        self,
        init_scale: float = 2.0**16,
        scale_window: int = 1000,
        hysteresis: int = 2,
        consecutive_hysteresis: bool = False,
        min_scale: float = 1.0,
        *,
        raise_at_minimum: bool = True,
    ):
        if not init_scale > 0 or not min_scale > 0:
            raise InvalidValueError(f"scales must be > 0, got init {init_scale}, min {min_scale}")
        if scale_window < 1 or hysteresis < 1:
            raise InvalidValueError(
                f"scale_window and hysteresis must be >= 1, got {scale_window}, {hysteresis}"
            )
        self.scale = float(init_scale)
        self.scale_window = int(scale_window)
        self.hysteresis = int(hysteresis)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.min_scale = float(min_scale)
        self.raise_at_minimum = raise_at_minimum
        self.hysteresis_left = self.hysteresis
        self.iteration = 0
        self.last_overflow_iteration = -1
        self.last_message: str | None = None
        """One line describing the last overflow (for the engine's rank-0 log), else None."""

    def update(self, overflow: bool) -> None:
        """Record one optimizer step's outcome and adapt the scale."""
        self.last_message = None
        if overflow:
            if self.hysteresis == 1 or self.hysteresis_left == 1:
                if self.scale == self.min_scale:
                    if self.raise_at_minimum:
                        raise LossScaleAtMinimum(
                            f"gradients overflowed at the minimum loss scale {self.scale:g} "
                            f"(iteration {self.iteration}); the run cannot make progress in fp16. "
                            "Lower the learning rate, check the data for inf/nan, lower "
                            "fp16.min_loss_scale, or train in bf16"
                        )
                    self.last_message = (
                        f"gradient overflow: skipping step, loss scale stays at its minimum "
                        f"{self.scale:g}"
                    )
                else:
                    new_scale = max(self.scale / 2.0, self.min_scale)
                    self.last_message = (
                        f"gradient overflow: skipping step, loss scale {self.scale:g} -> "
                        f"{new_scale:g}"
                    )
                    self.scale = new_scale
            else:
                self.last_message = (
                    f"gradient overflow: skipping step, loss scale stays {self.scale:g} "
                    f"(hysteresis {self.hysteresis_left} -> {self.hysteresis_left - 1})"
                )
                self.hysteresis_left -= 1
            self.last_overflow_iteration = self.iteration
        else:
            if self.consecutive_hysteresis:
                self.hysteresis_left = self.hysteresis
            stable = self.iteration - self.last_overflow_iteration - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.hysteresis_left = self.hysteresis
                self.scale *= 2.0
        self.iteration += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "dynamic": True,
            "scale": self.scale,
            "iteration": self.iteration,
            "last_overflow_iteration": self.last_overflow_iteration,
            "hysteresis_left": self.hysteresis_left,
            "scale_window": self.scale_window,
            "hysteresis": self.hysteresis,
            "consecutive_hysteresis": self.consecutive_hysteresis,
            "min_scale": self.min_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the live state. The settings (window, hysteresis, minimum) stay those of
        the current config, so a resumed run can change them."""
        self.scale = float(state["scale"])
        self.iteration = int(state["iteration"])
        self.last_overflow_iteration = int(state["last_overflow_iteration"])
        self.hysteresis_left = min(int(state["hysteresis_left"]), self.hysteresis)

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self.scale:g}, window={self.scale_window}, "
            f"hysteresis={self.hysteresis_left}/{self.hysteresis}, min={self.min_scale:g})"
        )


def build_loss_scaler(fp16: Any) -> StaticLossScaler | DynamicLossScaler:
    """The scaler an `FP16Config` asks for; a static scale of 1 when fp16 is off."""
    if not fp16.enabled:
        return StaticLossScaler(1.0)
    if fp16.loss_scale > 0:
        return StaticLossScaler(fp16.loss_scale)
    return DynamicLossScaler(
        init_scale=2.0**fp16.initial_scale_power,
        scale_window=fp16.loss_scale_window,
        hysteresis=fp16.hysteresis,
        consecutive_hysteresis=fp16.consecutive_hysteresis,
        min_scale=fp16.min_loss_scale,
    )
