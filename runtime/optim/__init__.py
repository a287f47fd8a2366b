"""Optimisation: the optimizers (`optimizers`, and what a script passes: `client_optimizer`),
the learning-rate schedules (`lr_schedules`), mixed precision and the step's one small
all-reduce (`precision`) with dynamic loss scaling (`loss_scaler`)."""

from __future__ import annotations

from runtime.optim.client_optimizer import build_lr_scheduler, optimizer_factory, param_groups_of
from runtime.optim.optimizers import resolve_optimizer_class
from runtime.optim.precision import GradStats, Precision, StepRiders, global_grad_stats

__all__ = [
    "GradStats",
    "Precision",
    "StepRiders",
    "build_lr_scheduler",
    "global_grad_stats",
    "optimizer_factory",
    "param_groups_of",
    "resolve_optimizer_class",
]
