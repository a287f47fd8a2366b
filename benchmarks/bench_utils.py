"""Measurement tools shared by every framework in the training benchmark.

Everything here is framework-agnostic on purpose: the same code measures torch DDP, DeepSpeed,
FSDP2 and this runtime, so the columns of the comparison table mean the same thing for each.

- ``pin_threads``: one intra-op and one inter-op thread per rank (fairness on small hosts).
- ``peak_rss_bytes`` / ``current_rss_bytes``: the kernel's own view of the process.
- ``reachable_tensor_bytes``: model-state bytes, measured by walking the Python object graph
  from the framework's root objects and summing each unique tensor storage once.
- ``CollectiveCounter``: wraps the ``torch.distributed`` collective functions in the worker
  process and adds up the bytes each rank sends, with one cost model for every framework.
- ``window_batch``: the deterministic micro-batches every framework trains on.
"""

from __future__ import annotations

import functools
import inspect
import os
import statistics
import threading
import types
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CollectiveCounter",
    "THREAD_ENV",
    "current_rss_bytes",
    "format_bytes",
    "median",
    "peak_rss_bytes",
    "pin_threads",
    "reachable_tensor_bytes",
    "window_batch",
]

# Every rank gets one compute thread: with 2 ranks on a 2-core host this is the only setting
# where no framework wins or loses by oversubscription.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def pin_threads() -> None:
    """Use one intra-op and one inter-op thread (call before any parallel work starts)."""
    import torch

    os.environ.update(THREAD_ENV)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        # Already set, or inter-op work already started: intra-op is the one that matters.
        pass


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name} line")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (VmHWM), in bytes."""
    try:
        return _status_kib("VmHWM") * 1024
    except (OSError, RuntimeError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Current resident set size of this process (VmRSS), in bytes."""
    return _status_kib("VmRSS") * 1024


def format_bytes(n: float | None) -> str:
    """MiB with one decimal from 1 MiB up (so that table columns compare at a glance)."""
    if n is None:
        return "-"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    if abs(n) >= 2**10:
        return f"{n / 2**10:.1f} KiB"
    return f"{n:.0f} B"


def median(values: Iterable[float]) -> float:
    values = list(values)
    if not values:
        raise ValueError("median of no values: run at least one timed step (--steps > --warmup)")
    return statistics.median(values)


# --------------------------------------------------------------------------------------------
# Model-state bytes
# --------------------------------------------------------------------------------------------

# Objects that never lead to training state: walking into modules, classes or plain functions'
# globals would pull in the whole interpreter.
_OPAQUE = (
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    threading.Thread,
)


def _tensor_children(tensor: Any) -> list[Any]:
    children: list[Any] = []
    grad = getattr(tensor, "grad", None) if tensor.is_leaf else None
    if grad is not None:
        children.append(grad)
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None:
        # Wrapper subclasses (DTensor) own no storage themselves: their inner tensors do.
        inner_names, _ = tensor.__tensor_flatten__()
        children.extend(getattr(tensor, name) for name in inner_names)
    # Frameworks hang their shards on parameters as attributes (for example a partition tensor).
    children.extend(getattr(tensor, "__dict__", {}).values())
    return children


def _storage_of(tensor: Any) -> tuple[int, int] | None:
    try:
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        pointer = storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        # Wrapper subclasses and freed (resized-to-zero) storages hold no memory of their own.
        return None
    if nbytes == 0 or pointer == 0 or tensor.device.type == "meta":
        return None
    return pointer, nbytes


def reachable_tensor_bytes(*roots: Any) -> int:
    """Sum of the unique tensor storages reachable from ``roots``, in bytes.

    The walk follows instance attributes, containers, tensor ``.grad`` and tensor attributes,
    bound methods, ``functools.partial`` arguments and closure cells; it does not enter modules,
    classes, function globals or autograd graphs. A storage shared by many views (a flat buffer
    behind every parameter) is counted once, at its full size. C++-only buffers (for example
    DDP's reducer buckets when gradients are not bucket views) are invisible to it.
    """
    import torch

    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack: list[Any] = list(roots)
    while stack:
        obj = stack.pop()
        if isinstance(obj, _OPAQUE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found = _storage_of(obj)
            if found is not None:
                pointer, nbytes = found
                storages[pointer] = max(nbytes, storages.get(pointer, 0))
            stack.extend(_tensor_children(obj))
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
            stack.extend(obj)
            continue
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
            continue
        if isinstance(obj, functools.partial):
            stack.extend((obj.func, obj.args, obj.keywords))
            continue
        if isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # empty cell
                    pass
            continue
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            stack.append(attributes)
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                stack.append(getattr(obj, slot))
    return sum(storages.values())


# --------------------------------------------------------------------------------------------
# Bytes sent per collective
# --------------------------------------------------------------------------------------------

# How many bytes one rank sends for a collective over N ranks whose full tensor is S bytes,
# for the bandwidth-optimal (ring) algorithm: the total minimum traffic divided by N.
# all-reduce = reduce-scatter + all-gather: 2S(N-1)/N; reduce-scatter / all-gather of a full
# tensor of S bytes: S(N-1)/N; broadcast and reduce: S(N-1)/N; all-to-all of an S-byte input:
# S(N-1)/N; a point-to-point send: S (counted on the sender).
_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_reduce_coalesced": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: (n - 1) / n,
    "reduce": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
    "barrier": lambda n: 0.0,
}


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _sum_nbytes(tensors: Any) -> int:
    return sum(_nbytes(t) for t in tensors)


def _nested_nbytes(lists: Any) -> int:
    return sum(_sum_nbytes(inner) for inner in lists)


# function name -> (collective kind, full tensor size in bytes from the bound arguments)
_COLLECTIVES: dict[str, tuple[str, Callable[[dict[str, Any]], int]]] = {
    "all_reduce": ("all_reduce", lambda a: _nbytes(a["tensor"])),
    "all_reduce_coalesced": ("all_reduce_coalesced", lambda a: _sum_nbytes(a["tensors"])),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "reduce_scatter_single": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "_reduce_scatter_base": ("reduce_scatter", lambda a: _nbytes(a["input"])),
    "reduce_scatter": ("reduce_scatter", lambda a: _sum_nbytes(a["input_list"])),
    "all_gather_into_tensor": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "all_gather_single": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "_all_gather_base": ("all_gather", lambda a: _nbytes(a["output_tensor"])),
    "all_gather": ("all_gather", lambda a: _sum_nbytes(a["tensor_list"])),
    "all_gather_coalesced": ("all_gather", lambda a: _nested_nbytes(a["output_tensor_lists"])),
    "broadcast": ("broadcast", lambda a: _nbytes(a["tensor"])),
    "reduce": ("reduce", lambda a: _nbytes(a["tensor"])),
    "all_to_all_single": ("all_to_all", lambda a: _nbytes(a["input"])),
    "all_to_all": ("all_to_all", lambda a: _sum_nbytes(a["input_list"])),
    "gather": ("gather", lambda a: _nbytes(a["tensor"])),
    "scatter": ("scatter", lambda a: _nbytes(a["tensor"])),
    "send": ("send", lambda a: _nbytes(a["tensor"])),
    "isend": ("send", lambda a: _nbytes(a["tensor"])),
    "recv": ("recv", lambda a: _nbytes(a["tensor"])),
    "irecv": ("recv", lambda a: _nbytes(a["tensor"])),
    "barrier": ("barrier", lambda a: 0),
}


@dataclass
class CollectiveCounter:
    """Counts what this rank sends through ``torch.distributed`` collectives.

    ``install()`` replaces the collective functions in ``torch.distributed`` and
    ``torch.distributed.distributed_c10d`` with counting wrappers. Install it before any
    framework is imported or initialised, so that frameworks which look a function up once and
    keep it (DeepSpeed does) keep the wrapper. A collective issued from inside another wrapped
    collective is not counted twice. Object collectives are not wrapped: the tensor collectives
    they are built on are counted instead.
    """

    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    payload_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    enabled: bool = True
    _originals: dict[tuple[Any, str], Any] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)

    def install(self) -> CollectiveCounter:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, (kind, size_of) in _COLLECTIVES.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapper = self._wrap(original, kind, size_of)
            for namespace in (dist, c10d):
                if getattr(namespace, name, None) is original:
                    self._originals[(namespace, name)] = original
                    setattr(namespace, name, wrapper)
        return self

    def uninstall(self) -> None:
        for (namespace, name), original in self._originals.items():
            setattr(namespace, name, original)
        self._originals.clear()

    def reset(self) -> None:
        self.calls.clear()
        self.payload_bytes.clear()
        self.sent_bytes.clear()

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {
            kind: {
                "calls": self.calls[kind],
                "payload_bytes": self.payload_bytes[kind],
                "sent_bytes": self.sent_bytes[kind],
            }
            for kind in sorted(self.calls)
        }

    @property
    def total_sent_bytes(self) -> float:
        return float(sum(self.sent_bytes.values()))

    def _wrap(self, original: Callable, kind: str, size_of: Callable) -> Callable:
        signature = inspect.signature(original)
        factor = _RING_FACTOR[kind]
        counter = self

        @functools.wraps(original)
        def counting(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(counter._local, "depth", 0)
            if depth == 0 and counter.enabled:
                counter._record(signature, kind, size_of, factor, args, kwargs)
            counter._local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._local.depth = depth

        return counting

    def _record(self, signature, kind, size_of, factor, args, kwargs) -> None:
        import torch.distributed as dist

        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        size = size_of(arguments)
        group_size = dist.get_world_size(arguments.get("group"))
        self.calls[kind] += 1
        self.payload_bytes[kind] += size
        self.sent_bytes[kind] += size * factor(group_size)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def window_batch(tokens, step: int, rank: int, micro_batch: int, seq_len: int, seed: int = 1234):
    """The (inputs, targets) micro-batch of ``rank`` at ``step``: the same for every framework.

    Rows are windows of the token stream ``tokens`` at offsets drawn from a generator seeded by
    (seed, step, rank), so every framework, run and machine sees the same batches in the same
    order, and a run needs no data loader (whose workers would cost CPU of their own).
    """
    import torch

    if tokens.numel() <= seq_len + 1:
        raise ValueError(f"the token stream ({tokens.numel()}) is shorter than seq_len + 1")
    rng = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (micro_batch,), generator=rng)
    rows = torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
