"""The two ways to recompute a block in backward: reentrant (an autograd Function that runs a
nested backward) and non-reentrant (saved-tensor hooks that recompute on first use).

Both keep only the block's inputs (through `Stash`) and an `RNGSnapshot`, and replay the
snapshot for recomputation, so dropout inside draws the same masks twice.

Reentrant (DeepSpeed's default ``checkpoint``) hands the kept inputs to
``ctx.save_for_backward``: saved-tensor hooks (and memory tools built on them) see exactly what
a checkpoint holds. Its gradients flow only into inputs that require grad and into
parameters; it cannot serve ``torch.autograd.grad``. Non-reentrant (``non_reentrant_checkpoint``)
builds the real graph of the block but swaps every tensor the graph would save for an index;
the first backward access recomputes the block and hands out the recomputed tensors. It works
when no input requires grad, and with ``torch.autograd.grad``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UsageError
from .rng_tracker import RNGSnapshot
from .stash import Stash, Stashed

__all__ = ["run_reentrant", "run_non_reentrant", "Hooks"]


class Hooks:
    """What a checkpoint call reports to its configuration: boundaries and timings."""

    def boundary(self, tensors: list[torch.Tensor]) -> None:  # synchronize_checkpoint_boundary
        pass

    def timed(self, kind: str, seconds: float) -> None:  # profile
        pass

    profiling = False


def _split(args: tuple) -> tuple[list[int], list[torch.Tensor]]:
    """Positions and tensors of the arguments to stash."""
    positions = [i for i, a in enumerate(args) if Stash.applies_to(a)]
    return positions, [args[i] for i in positions]


def _as_tuple(outputs: Any) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


class _Reentrant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable, stash: Stash, hooks: Hooks, *args):  # noqa: ANN001
        hooks.boundary([a for a in args if torch.is_tensor(a)])
        start = time.perf_counter() if hooks.profiling else 0.0
        ctx.run, ctx.stash, ctx.hooks = run, stash, hooks
        ctx.rng = RNGSnapshot.take()
        with torch.no_grad():
            outputs = run(*args)
        positions, tensors = _split(args)
        kept = [stash.put(i, t) for i, t in zip(positions, tensors, strict=True)]
        ctx.positions = positions
        ctx.kept = [
            Stashed(None, s.shape, s.device, s.requires_grad, s.partitioned, s.arena) for s in kept
        ]
        # The held tensors go through save_for_backward, where saved-tensor hooks see them.
        others = [
            a if torch.is_tensor(a) and i not in positions else None for i, a in enumerate(args)
        ]
        ctx.save_for_backward(*[s.held for s in kept], *[o for o in others if o is not None])
        ctx.plain = [(i, a) for i, a in enumerate(args) if not torch.is_tensor(a)]
        ctx.other_positions = [i for i, o in enumerate(others) if o is not None]
        ctx.nargs = len(args)
        ctx.mark_non_differentiable(
            *[o for o in _as_tuple(outputs) if torch.is_tensor(o) and not o.is_floating_point()]
        )
        if hooks.profiling:
            hooks.timed("forward", time.perf_counter() - start)
        hooks.boundary([o for o in _as_tuple(outputs) if torch.is_tensor(o)])
        return outputs

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001
        if not torch.autograd._is_checkpoint_valid():
            raise UsageError(
                "activation checkpointing (reentrant) cannot serve torch.autograd.grad(); call "
                ".backward(), or use checkpointing.non_reentrant_checkpoint"
            )
        hooks = ctx.hooks
        hooks.boundary(list(grads))
        start = time.perf_counter() if hooks.profiling else 0.0
        saved = ctx.saved_tensors
        held, others = saved[: len(ctx.kept)], saved[len(ctx.kept) :]
        args: list[Any] = [None] * ctx.nargs
        for i, s, h in zip(ctx.positions, ctx.kept, held, strict=True):
            args[i] = ctx.stash.get(s, h)
        for i, o in zip(ctx.other_positions, others, strict=True):
            args[i] = o.detach().requires_grad_(o.requires_grad)
        for i, a in ctx.plain:
            args[i] = a
        with ctx.rng.replayed(), torch.enable_grad():
            outputs = _as_tuple(ctx.run(*args))
        pairs = [
            (o, g)
            for o, g in zip(outputs, grads, strict=False)
            if torch.is_tensor(o) and o.requires_grad and g is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if hooks.profiling:
            hooks.timed("recompute", time.perf_counter() - start)
        hooks.boundary([a for a in args if torch.is_tensor(a)])
        return (None, None, None, *[a.grad if torch.is_tensor(a) else None for a in args])


def run_reentrant(run: Callable, stash: Stash, hooks: Hooks, args: tuple) -> Any:
    return _Reentrant.apply(run, stash, hooks, *args)


class _Frame:
    """One non-reentrant checkpoint: its kept inputs and, once recomputed, the saved tensors."""

    def __init__(self, run: Callable, stash: Stash, hooks: Hooks, args: tuple):
        self.run, self.stash, self.hooks = run, stash, hooks
        self.rng = RNGSnapshot.take()
        positions, tensors = _split(args)
        self.kept = {i: stash.put(i, t) for i, t in zip(positions, tensors, strict=True)}
        # Other arguments (ints, masks) are kept as given.
        self.plain = {i: a for i, a in enumerate(args) if i not in self.kept}
        self.nargs = len(args)
        self.count = 0
        self.recomputed: list[torch.Tensor | None] | None = None

    def pack(self, _t: torch.Tensor) -> int:
        self.count += 1
        return self.count - 1

    def unpack(self, index: int) -> torch.Tensor:
        if self.recomputed is None or self.recomputed[index] is None:
            self._recompute()
        t = self.recomputed[index]
        self.recomputed[index] = None  # each saved tensor is read once per backward
        return t

    def _recompute(self) -> None:
        hooks = self.hooks
        start = time.perf_counter() if hooks.profiling else 0.0
        args = [
            self.stash.get(self.kept[i]) if i in self.kept else self.plain[i]
            for i in range(self.nargs)
        ]
        collected: list[torch.Tensor] = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            collected.append(t)
            return t

        with (
            self.rng.replayed(),
            torch.enable_grad(),
            torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
        ):
            self.run(*args)
        if len(collected) != self.count:
            raise UsageError(
                f"activation checkpointing: recomputation saved {len(collected)} tensors, the "
                f"forward saved {self.count}; the checkpointed function must compute the same "
                "operations when run again (no data-dependent control flow on global state)"
            )
        self.recomputed = list(collected)
        if hooks.profiling:
            hooks.timed("recompute", time.perf_counter() - start)


def run_non_reentrant(run: Callable, stash: Stash, hooks: Hooks, args: tuple) -> Any:
    hooks.boundary([a for a in args if torch.is_tensor(a)])
    start = time.perf_counter() if hooks.profiling else 0.0
    frame = _Frame(run, stash, hooks, args)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        outputs = run(*args)
    if hooks.profiling:
        hooks.timed("forward", time.perf_counter() - start)
    return outputs
