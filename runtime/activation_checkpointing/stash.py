"""Where the inputs of a checkpointed block wait for its recomputation.

A checkpoint keeps only its inputs between forward and backward. How it keeps them is what the
options change (`Stash` applies them to one tensor, `Stashed` is what it holds):

* plain: the input tensor itself;
* ``partition_activations``: only this rank's 1/N of it (N = model-parallel size). Tensor-
  parallel ranks compute identical block inputs, so each keeps a different slice and the whole
  is all-gathered over the model-parallel group just before recomputation;
* ``cpu_checkpointing``: a host copy (pinned, copied asynchronously, on CUDA), moved back to
  the device just before recomputation;
* ``contiguous_memory_optimization``: the (partitioned / host) copy goes into a slot of an
  `Arena` preallocated for ``number_checkpoints`` checkpoints instead of a fresh allocation,
  so the same memory serves every step and the device allocator does not fragment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.distributed import Communicator

from ..errors import UsageError

__all__ = ["Arena", "ArenaFull", "Stash", "Stashed"]


class ArenaFull(UsageError):
    """More checkpoints are held than ``number_checkpoints`` slots, or a slot does not fit."""


class Arena:
    """``slots`` rows of ``slot_numel`` elements in one allocation, taken in order.

    Rows are handed out in forward order and given back as backward consumes them; when every
    row is back, the next forward starts again at row 0 (the same memory every step).
    """

    def __init__(self, slots: int, slot_numel: int, dtype: torch.dtype, device: torch.device):
        pin = device.type == "cpu" and torch.cuda.is_available()
        self.buffer = torch.empty(slots, slot_numel, dtype=dtype, device=device, pin_memory=pin)
        self._next = 0
        self._live = 0

    @property
    def slot_numel(self) -> int:
        return self.buffer.shape[1]

    def take(self, numel: int) -> torch.Tensor:
        if numel != self.slot_numel:
            raise ArenaFull(
                f"contiguous_memory_optimization: a checkpoint input of {numel} elements does "
                f"not fit the buffer's slots of {self.slot_numel} (every checkpointed block "
                "must take inputs of the same shape); turn the option off for this model"
            )
        if self._next >= self.buffer.shape[0]:
            raise ArenaFull(
                f"contiguous_memory_optimization: more than number_checkpoints = "
                f"{self.buffer.shape[0]} checkpoints are held before a backward; raise "
                "number_checkpoints to the number of checkpointed blocks, or call "
                "checkpointing.reset() after forward passes that have no backward"
            )
        # A tensor of its own over the row's memory: views of the buffer would share one
        # version counter, and filling the next row would look like an in-place change of
        # this one to autograd.
        b = self.buffer
        row = torch.empty(0, dtype=b.dtype, device=b.device).set_(
            b.untyped_storage(), b.storage_offset() + self._next * b.stride(0), (numel,)
        )
        self._next += 1
        self._live += 1
        return row

    def give_back(self) -> None:
        self._live = max(0, self._live - 1)
        if self._live == 0:
            self._next = 0

    def reset(self) -> None:
        self._next = 0
        self._live = 0


@dataclass
class Stashed:
    """One kept input: ``held`` (what memory holds) and how to rebuild the original."""

    held: torch.Tensor
    shape: torch.Size
    device: torch.device
    requires_grad: bool
    partitioned: bool
    arena: Arena | None = None


class Stash:
    """Applies the configured options to the inputs of one checkpoint call.

    ``mp``: the model-parallel communicator for ``partition``; ``arenas``: one `Arena` per
    input position (shared by every checkpoint call, created on first use).
    """

    def __init__(
        self,
        *,
        mp: Communicator | None,
        partition: bool,
        to_cpu: bool,
        contiguous_slots: int | None,
        arenas: dict[tuple, Arena],
    ):
        self.mp = mp if (partition and mp is not None and mp.world_size > 1) else None
        self.to_cpu = to_cpu
        self.slots = contiguous_slots
        self.arenas = arenas

    @staticmethod
    def applies_to(t: object) -> bool:
        """Floating tensors are what a block's activations are; masks and ids stay as given."""
        return torch.is_tensor(t) and t.is_floating_point()

    def put(self, position: int, t: torch.Tensor) -> Stashed:
        data = t.detach()
        partitioned = self.mp is not None
        if partitioned:
            n, chunk = self.mp.world_size, -(-data.numel() // self.mp.world_size)
            flat = data.reshape(-1)
            lo = min(flat.numel(), self.mp.rank * chunk)
            part = flat[lo : lo + chunk]
        else:
            part = data
            n = 1
        target = torch.device("cpu") if self.to_cpu else data.device
        if self.slots is not None:
            numel = part.numel() if not partitioned else -(-data.numel() // n)
            key = (position, data.dtype, target)
            arena = self.arenas.get(key)
            if arena is None:
                arena = self.arenas[key] = Arena(self.slots, numel, data.dtype, target)
            row = arena.take(numel)
            row[: part.numel()].copy_(part.reshape(-1), non_blocking=True)
            held = row if partitioned else row.view(data.shape)
        elif partitioned or target != data.device:
            pin = target.type == "cpu" and data.device.type == "cuda"
            held = torch.empty(part.shape, dtype=data.dtype, device=target, pin_memory=pin)
            held.copy_(part, non_blocking=pin)
            arena = None
        else:
            held, arena = data, None
        return Stashed(held, data.shape, data.device, t.requires_grad, partitioned, arena)

    def get(self, s: Stashed, held: torch.Tensor | None = None) -> torch.Tensor:
        """The original input again (a new tensor, detached, with its requires_grad)."""
        held = s.held if held is None else held
        numel = s.shape.numel()
        if s.partitioned:
            comm = self.mp
            chunk = -(-numel // comm.world_size)
            full = torch.empty(chunk * comm.world_size, dtype=held.dtype, device=s.device)
            mine = full[comm.rank * chunk : (comm.rank + 1) * chunk]
            mine[: min(chunk, max(0, numel - comm.rank * chunk))].copy_(
                held.reshape(-1)[: min(chunk, max(0, numel - comm.rank * chunk))]
            )
            comm.all_gather(full, mine)
            out = full[:numel].view(s.shape)
        elif held.device != s.device or s.arena is not None:
            # A copy: the arena slot is reused by the next step's forward.
            out = held.to(s.device, non_blocking=True, copy=True)
        else:
            out = held
        if s.arena is not None:
            s.arena.give_back()
        return out.detach().requires_grad_(s.requires_grad)
