"""The one module that calls torch.distributed collectives, with byte accounting.

Every collective takes the process group of the `Communicator` explicitly; there is no global
group. Bytes are counted per rank and per collective kind as the logical traffic of the ring
algorithm, so that numbers compare across backends:

=============== ==========================
all_reduce      2 (N-1)/N x tensor bytes
reduce_scatter  (N-1)/N x input bytes
all_gather      (N-1)/N x output bytes
all_to_all      (N-1)/N x input bytes
broadcast       (N-1)/N x tensor bytes
=============== ==========================

Gloo quirks (torch 2.13): gloo's reduce-scatter is a full all-reduce that keeps one chunk
(twice the traffic) and ignores the reduce op, while all_to_all_single is native. On gloo
`reduce_scatter` therefore runs all_to_all_single into a scratch buffer and sums the N
received chunks locally: true (N-1)/N traffic, and faster than the built-in (32 MiB fp32
input, 1 thread per rank: 40 vs 48 ms at 2 ranks, 89 vs 156 ms at 4 ranks). Reductions
always use SUM; callers divide.

Timing (`CommStats.observer`, set by runtime.observe.profiling for the comms logger and the wall-clock
breakdown): each collective reports its kind, message size (nccl-tests' "size": the tensor for
all_reduce and broadcast, the whole input of reduce_scatter and all_to_all, the whole output of
all_gather), latency from issue to completion and the time this rank was blocked waiting for
it. Without an observer nothing is timed. On CUDA an observed collective synchronizes the
device when waited for (the host cannot see completion otherwise), as DeepSpeed's comms logger
does.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = [
    "CommObserver",
    "CommStats",
    "Communicator",
    "Handle",
    "collectives_in_flight",
    "device_of_backend",
]

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def device_of_backend(backend: str) -> torch.device:
    """The device a group of ``backend`` (as `torch.distributed.get_backend` names it) takes
    small bookkeeping tensors on."""
    if backend.lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class CommObserver:
    """Told about every collective of the `CommStats` it is attached to (runtime.observe.profiling)."""

    sync_cuda = False
    """Synchronize the device when a collective is waited for (host-side completion time)."""

    def on_done(
        self, kind: str, size: int, traffic: int, latency: float, blocked: float, world: int
    ) -> None:
        """`size` message bytes, `traffic` logical bytes sent (the ring formula), seconds from
        issue to completion, seconds this rank was blocked waiting, over `world` ranks."""


@dataclass
class CommStats:
    """Logical bytes sent by this rank, per collective kind."""

    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    scoped: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """Bytes of the collectives run on a labelled subgroup (`Communicator.split`), by
    (label, kind); they are counted in `bytes` too."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    observer: CommObserver | None = field(default=None, repr=False)
    """Times every collective when set (runtime.observe.profiling); None: nothing is timed."""

    def add(self, kind: str, nbytes: float, scope: str | None = None) -> None:
        with self._lock:
            self.bytes[kind] += int(round(nbytes))
            self.calls[kind] += 1
            if scope is not None:
                self.scoped[(scope, kind)] += int(round(nbytes))

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.bytes)

    def reset(self) -> None:
        with self._lock:
            self.bytes.clear()
            self.calls.clear()
            self.scoped.clear()


class Handle:
    """An in-flight collective; `wait()` blocks and then runs the local post-processing."""

    __slots__ = ("_work", "_then", "_done", "_timing", "__weakref__")

    def __init__(self, work=None, then: Callable[[], None] | None = None, timing=None):
        self._work = work
        self._then = then
        self._done = False
        self._timing = timing  # _Timing of an observed collective, else None
        if work is not None:
            _issued.add(self)

    def wait(self) -> None:
        if self._done:
            return
        began = time.perf_counter() if self._timing is not None else 0.0
        if self._work is not None:
            self._work.wait()
        if self._then is not None:
            self._then()
        self._done = True
        _issued.discard(self)
        if self._timing is not None:
            self._timing.done(began)

    @property
    def done(self) -> bool:
        """wait() would not block (the collective finished; post-processing may be pending)."""
        return self._done or (self._work is not None and self._work.is_completed())

    def followed_by(self, then: Callable[[], None]) -> Handle:
        """A handle whose `wait()` waits for this one, then runs ``then`` (the caller's local
        post-processing of the received data: dequantizing, copying)."""
        if self._done:
            then()
            return _DONE
        return Handle(_After(self), then)


class _After:
    """A `Handle` seen as the work another handle waits for (`Handle.followed_by`)."""

    __slots__ = ("_handle",)

    def __init__(self, handle: Handle):
        self._handle = handle

    def wait(self) -> None:
        self._handle.wait()

    def is_completed(self) -> bool:
        return self._handle.done


class _Timing:
    """One observed collective: what it was and when it was issued."""

    __slots__ = ("observer", "kind", "size", "traffic", "world", "issued", "sync")

    def __init__(self, observer, kind, size, traffic, world, issued, sync):
        self.observer = observer
        self.kind = kind
        self.size = size
        self.traffic = traffic
        self.world = world
        self.issued = issued
        self.sync = sync

    def done(self, wait_began: float) -> None:
        if self.observer.sync_cuda and torch.cuda.is_available():
            torch.cuda.synchronize()
        end = time.perf_counter()
        began = self.issued if self.sync else wait_began
        self.observer.on_done(
            self.kind, self.size, self.traffic, end - self.issued, end - began, self.world
        )


_DONE = Handle()
_DONE._done = True

# Async collectives issued and not yet waited for, so that a process exiting on an exception
# can tell whether leaving the process group would wait for peers (runtime.distributed.teardown).
_issued: weakref.WeakSet[Handle] = weakref.WeakSet()


def collectives_in_flight() -> int:
    """How many async collectives this process issued that have not completed."""
    return sum(1 for h in list(_issued) if not h.done)


class _Works:
    """Several in-flight collectives behind one `wait()` (all_gather by broadcasts)."""

    __slots__ = ("_works",)

    def __init__(self, works: list):
        self._works = works

    def wait(self) -> None:
        for w in self._works:
            w.wait()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)


class Communicator:
    """Collectives over one process group, counting bytes into `stats`.

    `use_reduce_scatter=False` and `use_all_gather=False` are DeepSpeed's
    ``zero_optimization.reduce_scatter`` / ``allgather_partitions`` = false: `reduce_scatter`
    becomes an all-reduce of the whole input that keeps this rank's chunk (the input is summed
    in place), and `all_gather` becomes one broadcast per rank. Same results, more traffic;
    users pick them to work around a backend's reduce-scatter or all-gather.
    """

    def __init__(
        self,
        group,
        stats: CommStats | None = None,
        *,
        use_reduce_scatter: bool = True,
        use_all_gather: bool = True,
        scope: str | None = None,
    ):
        self.group = group
        self.scope = scope
        """The label its bytes are also counted under in `CommStats.scoped` (a subgroup)."""
        self.stats = stats if stats is not None else CommStats()
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group)).lower()
        self.use_reduce_scatter = use_reduce_scatter
        self.use_all_gather = use_all_gather

    def with_strategy(self, *, use_reduce_scatter: bool, use_all_gather: bool) -> Communicator:
        """The same group and byte counters, with the given collective choices."""
        return Communicator(
            self.group,
            self.stats,
            use_reduce_scatter=use_reduce_scatter,
            use_all_gather=use_all_gather,
            scope=self.scope,
        )

    def split(self, size: int, scope: str) -> Communicator:
        """This rank's group among runs of ``size`` consecutive ranks of this group (ranks
        0..size-1, size..2 size-1, ...), counting into the same `stats`, its bytes also under
        ``scope``. Collective: every rank of the world must call it, in the same order, and
        this communicator's group must be the whole world (creating a group involves every
        process)."""
        if self.world_size % size:
            raise ValueError(f"split: {size} does not divide the group's {self.world_size} ranks")
        if not self.is_world:
            raise ValueError("split: only the world group can be split")
        mine = None
        for start in range(0, self.world_size, size):
            group = dist.new_group(list(range(start, start + size)))
            if start <= self.rank < start + size:
                mine = group
        return Communicator(
            mine,
            self.stats,
            use_reduce_scatter=self.use_reduce_scatter,
            use_all_gather=self.use_all_gather,
            scope=scope,
        )

    @property
    def is_world(self) -> bool:
        """This group holds every process of the job (no model parallelism beside it)."""
        return self.world_size == dist.get_world_size()

    @property
    def is_gloo(self) -> bool:
        return self.backend == "gloo"

    @property
    def device(self) -> torch.device:
        """Where this group's collectives take their tensors: the current GPU on an NCCL
        group (NCCL refuses host tensors), the host otherwise (gloo; a group of several
        backends, ``cpu:gloo,cuda:nccl``, takes host tensors too)."""
        return device_of_backend(self.backend)

    @property
    def needs_reduce_scatter_scratch(self) -> bool:
        """Whether `reduce_scatter` needs a scratch buffer as large as its input."""
        return self.is_gloo and self.world_size > 1 and self.use_reduce_scatter

    def _frac(self) -> float:
        n = self.world_size
        return (n - 1) / n

    @staticmethod
    def _nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Handle:
        """Sum `tensor` over all ranks, in place."""
        if self.world_size == 1:
            return _DONE
        size = self._nbytes(tensor)
        timing = self._count("all_reduce", 2 * self._frac() * size, size, async_op)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        return self._finish(work, None, async_op, timing)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        *,
        scratch: torch.Tensor | None = None,
        accumulate: bool = False,
        async_op: bool = False,
    ) -> Handle:
        """output (+)= this rank's chunk of the sum over ranks of `input`.

        `input` is split into N equal chunks (its numel must divide by N); `output` may be a
        view of this rank's chunk of `input`. On gloo, `scratch` (at least input's numel, same
        dtype) receives the other ranks' chunks; without it one is allocated.

        `output` may have another dtype than `input` (16-bit on the wire, fp32 gradients):
        on gloo the received chunks are summed in the wider of the two dtypes; elsewhere the
        backend sums in `input`'s dtype and the result is cast into `output`.
        """
        n = self.world_size
        if input.numel() != output.numel() * n:
            raise ValueError(f"reduce_scatter: input {input.numel()} != {n} x {output.numel()}")
        if n == 1:
            if accumulate:
                output.add_(input.view_as(output))
            elif output.data_ptr() != input.data_ptr():
                output.copy_(input.view_as(output))
            return _DONE
        if not self.use_reduce_scatter:
            return self._reduce_scatter_by_all_reduce(output, input, accumulate, async_op)
        size = self._nbytes(input)
        timing = self._count("reduce_scatter", self._frac() * size, size, async_op)
        if self.is_gloo:
            recv = scratch[: input.numel()] if scratch is not None else torch.empty_like(input)
            work = dist.all_to_all_single(recv, input, group=self.group, async_op=async_op)
            chunks = recv.view(n, -1)
            flat_out = output.view(-1)
            # fp32 on the wire into 16-bit gradients: sum the chunks in fp32, round once.
            sum_first = input.element_size() > output.element_size()

            def then() -> None:
                if accumulate and sum_first:
                    flat_out.add_(torch.sum(chunks, dim=0))
                elif accumulate:
                    for c in chunks:
                        flat_out.add_(c)
                else:
                    torch.sum(chunks, dim=0, dtype=flat_out.dtype, out=flat_out)

            return self._finish(work, then, async_op, timing)
        if output.dtype != input.dtype:
            tmp = torch.empty(output.shape, dtype=input.dtype, device=output.device)
            work = _reduce_scatter(
                tmp, input, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op
            )
            into = output.add_ if accumulate else output.copy_
            return self._finish(work, lambda: into(tmp), async_op, timing)
        if accumulate:
            tmp = torch.empty_like(output)
            work = _reduce_scatter(
                tmp, input, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op
            )
            return self._finish(work, lambda: output.add_(tmp), async_op, timing)
        work = _reduce_scatter(
            output, input, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op
        )
        return self._finish(work, None, async_op, timing)

    def _reduce_scatter_by_all_reduce(
        self, output: torch.Tensor, input: torch.Tensor, accumulate: bool, async_op: bool
    ) -> Handle:
        size = self._nbytes(input)
        timing = self._count("all_reduce", 2 * self._frac() * size, size, async_op)
        work = dist.all_reduce(input, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        mine = input.view(self.world_size, -1)[self.rank].view_as(output)

        def then() -> None:
            if accumulate:
                output.add_(mine)
            elif output.data_ptr() != mine.data_ptr():
                output.copy_(mine)

        return self._finish(work, then, async_op, timing)

    def all_gather(
        self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False
    ) -> Handle:
        """Concatenate every rank's `input` into `output` (input may be its own chunk of it)."""
        if self.world_size == 1:
            if output.data_ptr() != input.data_ptr():
                output.copy_(input.view_as(output))
            return _DONE
        if not self.use_all_gather:
            return self._all_gather_by_broadcasts(output, input, async_op)
        size = self._nbytes(output)
        timing = self._count("all_gather", self._frac() * size, size, async_op)
        work = _all_gather(output, input, group=self.group, async_op=async_op)
        return self._finish(work, None, async_op, timing)

    def _all_gather_by_broadcasts(
        self, output: torch.Tensor, input: torch.Tensor, async_op: bool
    ) -> Handle:
        chunks = output.view(self.world_size, -1)
        mine = chunks[self.rank]
        if mine.data_ptr() != input.data_ptr():
            mine.copy_(input.view(-1))
        works = []
        # Observed as one "broadcast" of the whole output (the N broadcasts run together).
        size = self._nbytes(output)
        timing = self._timing("broadcast", size * self._frac(), size, async_op)
        for r, chunk in enumerate(chunks):
            # Each broadcast sends one chunk to N-1 ranks: (N-1)/N of the output in all.
            self.stats.add("broadcast", self._nbytes(chunk) * self._frac(), self.scope)
            src = dist.get_global_rank(self.group, r) if self.group is not None else r
            works.append(dist.broadcast(chunk, src=src, group=self.group, async_op=async_op))
        return self._finish(_Works(works) if async_op else None, None, async_op, timing)

    def all_to_all(
        self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False
    ) -> Handle:
        if self.world_size == 1:
            output.copy_(input)
            return _DONE
        size = self._nbytes(input)
        timing = self._count("all_to_all", self._frac() * size, size, async_op)
        work = dist.all_to_all_single(output, input, group=self.group, async_op=async_op)
        return self._finish(work, None, async_op, timing)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Handle:
        """Send ``tensor`` from the group's rank ``src`` (a rank *within* this group, as
        every rank of this class is) to the others."""
        if self.world_size == 1:
            return _DONE
        size = self._nbytes(tensor)
        timing = self._count("broadcast", self._frac() * size, size, async_op)
        if self.group is not None:
            src = dist.get_global_rank(self.group, src)
        work = dist.broadcast(tensor, src=src, group=self.group, async_op=async_op)
        return self._finish(work, None, async_op, timing)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def _count(self, kind: str, traffic: float, size: int, async_op: bool) -> _Timing | None:
        """Count the bytes; with an observer, the timing record of the collective."""
        self.stats.add(kind, traffic, self.scope)
        return self._timing(kind, traffic, size, async_op)

    def _timing(self, kind: str, traffic: float, size: int, async_op: bool) -> _Timing | None:
        observer = self.stats.observer
        if observer is None:
            return None
        return _Timing(
            observer,
            kind,
            size,
            int(round(traffic)),
            self.world_size,
            time.perf_counter(),
            not async_op,
        )

    @staticmethod
    def _finish(work, then, async_op: bool, timing: _Timing | None = None) -> Handle:
        handle = Handle(work if async_op else None, then, timing)
        if not async_op:
            handle.wait()
        return handle
