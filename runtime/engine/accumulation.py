"""Gradient accumulation: which backward ends an accumulation, and the loop misuses refused.

DeepSpeed's contract: `step()` follows every `backward()`, and the engine counts micro-batches
itself. A script may instead take the boundary over (`set_gradient_accumulation_boundary`) or
accumulate locally inside `no_sync()`; either way the script counts, not the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from runtime.errors import InvalidTypeError, UsageError

__all__ = ["Accumulation", "AccumulationError"]


class AccumulationError(UsageError):
    """backward() was called again without the step() that must follow it."""


class Accumulation:
    """The accumulation state of one engine between two `step()` calls."""

    def __init__(self, steps: Callable[[], int]):
        # A getter: set_train_batch_size changes gradient_accumulation_steps mid-run.
        self._steps = steps
        self._backward_calls = 0
        self._reduced_since_step = False
        self._boundary_override: bool | None = None
        self._in_no_sync = False
        self.step_applied = False
        """Whether the last step() updated the parameters."""

    def is_boundary(self, micro_steps: int) -> bool:
        """Whether this micro-batch ends an accumulation: counted from the micro-steps, or as
        the script set it."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (micro_steps + 1) % self._steps() == 0

    def begin_backward(self, micro_steps: int) -> bool:
        """Check the loop and count this backward; returns whether it reduces gradients."""
        gas = self._steps()
        counted = not self._in_no_sync and self._boundary_override is None
        if self._reduced_since_step or (counted and self._backward_calls >= gas):
            raise AccumulationError(
                f"engine.backward() was called {self._backward_calls + 1} times without "
                f"engine.step() (gradient_accumulation_steps={gas}). Call engine.step() after "
                "EVERY engine.backward(loss): the engine counts micro-batches itself and updates "
                "only at the accumulation boundary. Write the loop as\n"
                "    for batch in loader:\n"
                "        loss = engine(batch)\n"
                "        engine.backward(loss)\n"
                "        engine.step()\n"
                "(not `if engine.global_steps % accum == 0: engine.step()`)."
            )
        boundary = self.is_boundary(micro_steps) and not self._in_no_sync
        self._backward_calls += counted
        self._reduced_since_step = boundary
        return boundary

    def begin_step(self) -> None:
        """A step() starts: refuse one inside no_sync, and start counting afresh."""
        if self._in_no_sync:
            raise AccumulationError(
                "engine.step() was called inside engine.no_sync(); leave the no_sync block "
                "first (its backward passes only accumulate gradients locally)"
            )
        self._backward_calls = 0
        self._reduced_since_step = False
        self.step_applied = False

    @contextlib.contextmanager
    def no_sync(self, zero_stage: int) -> Iterator[None]:
        if zero_stage >= 2:
            raise AccumulationError(
                f"engine.no_sync() cannot be used at ZeRO stage {zero_stage}: stages 2 and 3 "
                "reduce gradients every micro-batch to partition them; use stage 0 or 1, or "
                "gradient_accumulation_steps"
            )
        if self._in_no_sync:
            raise AccumulationError("engine.no_sync() is already active; it cannot be nested")
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    def set_boundary(self, is_boundary: bool) -> None:
        if not isinstance(is_boundary, bool):
            raise InvalidTypeError(f"is_boundary must be True or False, got {is_boundary!r}")
        self._boundary_override = is_boundary
