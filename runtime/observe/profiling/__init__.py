"""Seeing inside a step: wall-clock breakdown, comms logger, FLOPs/MFU, per-module profile.

The engine owns one `StepInsight` (insight.py), built from the config's
``wall_clock_breakdown``, ``comms_logger`` and ``flops_profiler`` blocks; it adds its fields
to the step metrics (runtime.observe.metrics).
"""

from .insight import BREAKDOWN_FIELDS, StepInsight

__all__ = ["StepInsight", "BREAKDOWN_FIELDS"]
