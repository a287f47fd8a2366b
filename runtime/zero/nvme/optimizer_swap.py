"""ZeRO-Infinity's optimizer tier: fp32 master weights and their optimizer state in swap files.

The partitioned optimizer keeps one fp32 master tensor per owned group. Under
`offload_optimizer.device: "nvme"` those masters and every optimizer state tensor with one value
per element (Adam's `exp_avg`, `exp_avg_sq`) live in the rank's swap files between steps; in
memory each is an empty placeholder. The step runs over chunks of groups (stage 3: its
`sub_group_size` sub-groups; stages 1-2: one group at a time): while chunk j is updated, chunk
j+1 is being read and chunk j-1 written, so memory holds about three chunks of optimizer
state whatever the model's size. Small state (Adam's `step`) stays in memory.

Everything that must see the whole state (a checkpoint save or load, replacing the masters)
goes through `resident`, which reads the named groups in, and writes back and releases them
after; nothing reads a placeholder as if it were data: the placeholders are empty tensors, so
a stray use fails on its shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch

from runtime.zero.nvme.swapper import Swapper, aligned_buffer

__all__ = ["MasterStash", "OptimizerSwap"]

_MASTER = "master"


def _placeholder(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=like.dtype, device=like.device)


class MasterStash:
    """Writes the fp32 masters into the swap files one by one as the optimizer makes them, so
    that setting up never holds more than two of them in memory (making them all first would
    hold 4 bytes per parameter at once, the memory the offload exists to spare)."""

    def __init__(self, swapper: Swapper) -> None:
        self.swapper = swapper
        self.numels: list[int] = []
        self._last = None

    def add(self, master: torch.Tensor) -> torch.Tensor:
        """Write `master` as the next group's master; it becomes a placeholder (the pending
        write keeps its memory until the bytes are on disk)."""
        key = OptimizerSwap._key(len(self.numels), _MASTER)
        self.numels.append(master.numel())
        self.swapper.allocate(key, master.numel() * 4)
        if self._last is not None:
            self._last.wait()
        # `master.data` is a tensor of its own over the same memory: the pending write keeps it
        # (and so the memory) alive after `master` itself is pointed at the placeholder.
        self._last = self.swapper.write(key, master.data)
        master.data = _placeholder(master)
        return master


class OptimizerSwap:
    """Keeps `masters` (and their element-wise optimizer state) in `swapper`'s files."""

    def __init__(
        self,
        swapper: Swapper,
        masters: list[torch.Tensor],
        optimizer,
        stash: MasterStash | None = None,
    ) -> None:
        """`stash`: the masters were written by it as they were made (they are placeholders
        now); without one they are in memory and are written out here."""
        self.swapper = swapper
        self.masters = masters
        self.optimizer = optimizer
        self.numels = list(stash.numels) if stash else [m.numel() for m in masters]
        self.kinds: list[list[str]] = [[] for _ in masters]  # element states kept in files
        self.resident_set: set[int] = set() if stash else set(range(len(masters)))
        self._depth = 0  # `resident` blocks open: only the outermost swaps
        if stash is None:
            for i in range(len(masters)):
                self.swapper.allocate(self._key(i, _MASTER), self.numels[i] * 4)
            self._swap_out(range(len(masters)))
        self.swapper.wait_all()  # a disk too small fails here, at setup

    @staticmethod
    def _key(i: int, kind: str) -> str:
        return f"{i}.{kind}"

    def _element_states(self, i: int) -> dict[str, torch.Tensor]:
        m = self.masters[i]
        state = self.optimizer.state.get(m, {})
        return {
            k: v
            for k, v in state.items()
            if torch.is_tensor(v) and v.numel() == self.numels[i] and v.numel() > 1
        }

    def _swap_in(self, indices: Iterable[int]) -> list:
        """Issue the reads of `indices` into new aligned buffers; returns the pendings. The
        tensors take their buffers now: they must not be used before the pendings are done."""
        pendings = []
        for i in indices:
            if i in self.resident_set:
                continue
            m = self.masters[i]
            n = self.numels[i]
            kinds = [_MASTER, *self.kinds[i]]
            state = self.optimizer.state.get(m, {})
            for kind in kinds:
                like = m if kind == _MASTER else state[kind]
                nbytes = n * like.element_size()
                buf = torch.frombuffer(aligned_buffer(nbytes), dtype=like.dtype, count=n)
                pendings.append(self.swapper.read(self._key(i, kind), buf))
                if kind == _MASTER:
                    m.data = buf
                else:
                    state[kind] = buf
            self.resident_set.add(i)
        return pendings

    def _swap_out(self, indices: Iterable[int]) -> list:
        """Issue the writes of `indices` and release their memory (the pending writes hold
        the buffers until they are on disk); returns the pendings."""
        pendings = []
        for i in indices:
            if i not in self.resident_set:
                continue
            m = self.masters[i]
            states = self._element_states(i)
            pendings.append(self.swapper.write(self._key(i, _MASTER), m.data))
            for kind, t in states.items():
                pendings.append(self.swapper.write(self._key(i, kind), t.contiguous()))
            self.kinds[i] = sorted(states)
            state = self.optimizer.state.get(m)
            for kind in states:
                state[kind] = _placeholder(states[kind])
            m.data = _placeholder(m)
            self.resident_set.discard(i)
        return pendings

    def run(self, chunks: list[list[int]], update: Callable[[list[int]], None]) -> None:
        """`update(chunk)` for each chunk in order, each with its groups resident: the next
        chunk is read ahead and the previous one written behind while `update` runs."""
        if not chunks:
            return
        ahead = self._swap_in(chunks[0])
        behind: list = []
        for j, chunk in enumerate(chunks):
            for p in ahead:
                p.wait()
            ahead = self._swap_in(chunks[j + 1]) if j + 1 < len(chunks) else []
            update(chunk)
            # The previous chunk's writes hold its buffers until they are on disk: wait for
            # them before this chunk's start, or a disk slower than the update would pile up
            # every chunk's state in memory (measured: the whole optimizer state at once).
            for p in behind:
                p.wait()
            behind = self._swap_out(chunk)
        self.swapper.wait_all()  # a failed write stops this step, not a later one

    @contextlib.contextmanager
    def resident(self, indices: Iterable[int] | None = None):
        """The groups `indices` (all by default) in memory for the block; written back (with
        any state the block added or replaced) and released after it."""
        indices = list(range(len(self.masters)) if indices is None else indices)
        # Inside an outer block (a checkpoint load that refreshes the parameters), what the
        # outer one holds stays; what it lacks comes in and goes with this block.
        fresh = [i for i in indices if i not in self.resident_set]
        for p in self._swap_in(fresh):
            p.wait()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self._swap_out(fresh if self._depth else indices)
            self.swapper.wait_all()

    def close(self) -> None:
        self.swapper.close()
