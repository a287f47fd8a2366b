"""What runs at the end of every `Engine.step()`: step metrics, profiles, save on a signal.

Each is registered with `Engine.add_step_hook` and called in registration order after the
micro-step is counted, with the optimizer step's outcome at an accumulation boundary and None
between boundaries. Hooks that run collectives must run on every rank; a hook that only needs
a few numbers summed over the ranks boards them on the step's all-reduce instead
(`RidingStepHook`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from runtime.zero import StepOutcome

__all__ = ["StepEngine", "StepHook", "RidingStepHook", "CheckpointingProfile"]


class StepEngine(Protocol):
    """What a hook may read of the engine that calls it (the engine is one; hooks are
    written against this, so the engine's module and theirs do not import each other)."""

    config: Any
    global_steps: int

    def log_metrics(self, values: dict[str, Any], step: int) -> None: ...


class StepHook(Protocol):
    def after_step(self, engine: StepEngine, outcome: StepOutcome | None) -> None: ...


@runtime_checkable
class RidingStepHook(StepHook, Protocol):
    """A hook whose numbers are summed over the data-parallel ranks in the step's one
    all-reduce (`runtime.optim.precision.StepRiders`) instead of a collective and a host read of
    its own: it boards them before the optimizer step and reads the sums in `after_step`."""

    def board(self, riders: Any) -> None: ...


class CheckpointingProfile:
    """activation_checkpointing.profile: forward and recomputation seconds of the checkpointed
    blocks, sent with the step metrics (the same steps: the first and every
    ``steps_per_print``-th, from rank 0)."""

    def after_step(self, engine: StepEngine, outcome: StepOutcome | None) -> None:
        if outcome is None:
            return
        every = int(engine.config.steps_per_print or 0)
        step = engine.global_steps
        if step != 1 and not (every > 0 and step % every == 0):
            return
        from runtime import activation_checkpointing as checkpointing

        timings = checkpointing.take_profile()
        if timings:
            engine.log_metrics(timings, step)
