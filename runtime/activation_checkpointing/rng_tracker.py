"""RNG states for recomputation: capture before a checkpointed forward, replay during backward.

A checkpointed block runs its forward twice (once without a graph, once during backward). Any
randomness inside it (dropout) must draw the same numbers both times, or the gradients belong
to a different network than the loss. Three generators can be involved: the CPU default
generator, the accelerator's generator of the current device, and the named states of the
`RNGStatesTracker` that Megatron-style tensor-parallel layers fork into (dropout inside a
tensor-parallel region must differ across model-parallel ranks, elsewhere it must not).

The tracker is device-neutral: on a machine without CUDA its states are CPU generator states,
so the same model code runs (and is tested) on CPU.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import InvalidValueError

__all__ = [
    "MODEL_PARALLEL_RNG",
    "RNGStatesTracker",
    "RNGSnapshot",
    "get_rng_tracker",
    "model_parallel_manual_seed",
]

MODEL_PARALLEL_RNG = "model-parallel-rng"
"""The tracker state Megatron's tensor-parallel layers fork for their dropout."""

# Any positive offset works; this is the one Megatron and DeepSpeed use, so that a model seeded
# the same way draws the same model-parallel numbers here and there.
_MODEL_PARALLEL_SEED_OFFSET = 2718


def _use_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _device_get_state() -> torch.Tensor:
    """The generator state of the accelerator's current device, else of the CPU."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state()


def _device_set_state(state: torch.Tensor) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _device_manual_seed(seed: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


class RNGStatesTracker:
    """Named generator states (DeepSpeed's / Megatron's ``CudaRNGStatesTracker``).

    ``add(name, seed)`` creates a state; ``with fork(name):`` draws from it and keeps the
    advanced state for the next fork, leaving the default generator as it was.
    """

    def __init__(self) -> None:
        self._states: dict[str, torch.Tensor] = {}
        self._seeds: set[int] = set()

    def reset(self) -> None:
        self._states = {}
        self._seeds = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A copy of the name -> state mapping (the states themselves are not mutated later)."""
        return copy.copy(self._states)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._states = copy.copy(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self._seeds:
            raise InvalidValueError(f"RNG tracker: seed {seed} is already used by another state")
        if name in self._states:
            raise InvalidValueError(f"RNG tracker: a state named {name!r} already exists")
        self._seeds.add(seed)
        before = _device_get_state()
        _device_manual_seed(seed)
        self._states[name] = _device_get_state()
        _device_set_state(before)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        if name not in self._states:
            raise KeyError(
                f"RNG tracker: no state named {name!r}; call model_parallel_cuda_manual_seed(seed) "
                "(or get_cuda_rng_tracker().add(name, seed)) first"
            )
        before = _device_get_state()
        _device_set_state(self._states[name])
        try:
            yield
        finally:
            self._states[name] = _device_get_state()
            _device_set_state(before)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """The process's tracker (``get_cuda_rng_tracker`` in DeepSpeed's spelling)."""
    return _TRACKER


def model_parallel_manual_seed(seed: int, model_parallel_rank: int) -> None:
    """Seed the default generator with ``seed`` (the same on every model-parallel rank) and the
    tracker's model-parallel state with ``seed + 2718 + model_parallel_rank`` (different)."""
    _TRACKER.reset()
    _device_manual_seed(seed)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + _MODEL_PARALLEL_SEED_OFFSET + model_parallel_rank)


@dataclass(frozen=True)
class RNGSnapshot:
    """Every generator a checkpointed forward may draw from, as it was before that forward."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None
    tracker: dict[str, torch.Tensor]

    @classmethod
    def take(cls) -> RNGSnapshot:
        return cls(
            torch.get_rng_state(),
            torch.cuda.get_rng_state() if _use_cuda() else None,
            _TRACKER.get_states(),
        )

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)
        _TRACKER.set_states(self.tracker)

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block with the generators as they were at `take`, then put back the
        states they have now (the backward pass continues from where it was)."""
        now = RNGSnapshot.take()
        self.restore()
        try:
            yield
        finally:
            now.restore()
