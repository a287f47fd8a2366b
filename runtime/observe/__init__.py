"""Seeing a run: the step metrics a rank sends to zlaunch (`metrics`), the stacks signal
(`stacks`), inside a step (`profiling`: flops, comms, timers, peak memory) and DeepSpeed's
monitors (`monitors`: csv, wandb)."""

from __future__ import annotations

from runtime.observe import stacks
from runtime.observe.metrics import EventSink, StepMetrics

__all__ = [
    "EventSink",
    "StepMetrics",
    "stacks",
]
