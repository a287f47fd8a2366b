"""The metric names monitors write: DeepSpeed's where DeepSpeed has one."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["scalars", "ENGINE_NAMES"]

# event field -> (monitor name, scale). DeepSpeed writes the wall-clock breakdown in ms.
ENGINE_NAMES: dict[str, tuple[str, float]] = {
    "loss": ("Train/Samples/train_loss", 1.0),
    "lr": ("Train/Samples/lr", 1.0),
    "loss_scale": ("Train/Samples/loss_scale", 1.0),
    "grad_norm": ("Train/Samples/grad_norm", 1.0),
    "step_time": ("Train/Samples/step_time", 1.0),
    "samples_per_s": ("Train/Samples/samples_per_s", 1.0),
    "tokens_per_s": ("Train/Samples/tokens_per_s", 1.0),
    "memory_bytes": ("Train/Samples/memory_bytes", 1.0),
    "tflops": ("Train/Samples/tflops", 1.0),
    "mfu": ("Train/Samples/mfu", 1.0),
    "time_forward": ("Train/Samples/elapsed_time_ms_forward", 1e3),
    "time_backward": ("Train/Samples/elapsed_time_ms_backward", 1e3),
    "time_reduce_wait": ("Train/Samples/elapsed_time_ms_backward_allreduce", 1e3),
    "time_step": ("Train/Samples/elapsed_time_ms_step", 1e3),
    "time_allgather_wait": ("Train/Samples/elapsed_time_ms_allgather_wait", 1e3),
}
_META = ("kind", "source", "step")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def scalars(event: dict[str, Any]) -> list[tuple[str, float]]:
    """(name, value) of an event's numeric fields: engine events under DeepSpeed's names,
    a script's own (``"source": "user"``) under ``Train/Samples/<name>``."""
    if event.get("source") == "user":
        return [
            (f"Train/Samples/{k}", v) for k, v in event.items() if k not in _META and _number(v)
        ]
    out = []
    for key, (name, scale) in ENGINE_NAMES.items():
        value = event.get(key)
        if _number(value):
            out.append((name, value * scale))
    return out
