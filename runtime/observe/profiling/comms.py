"""`comms_logger`: every collective by kind and message size, with nccl-tests' bandwidths.

runtime.distributed.comm reports each collective to a `CommObserver`; this one keeps, per (kind, message
size): count, logical bytes sent (runtime.distributed.comm's ring-formula counters), total/min/max latency.
Bandwidths follow nccl-tests (doc/PERFORMANCE.md): algbw = size / time, and busbw = algbw x
a factor that makes it comparable with the hardware's link speed:

=============== ==============
all_reduce      2 (n-1) / n
reduce_scatter  (n-1) / n      (size = the whole input)
all_gather      (n-1) / n      (size = the whole output)
all_to_all      (n-1) / n
broadcast       1
=============== ==============

Latency is host time from issue to completion (on CUDA the device is synchronized at the
wait, as DeepSpeed's logger does), so an asynchronous collective overlapped with compute shows
its full span; the wall-clock breakdown reports the part a rank actually waited for.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import threading
from dataclasses import dataclass

from runtime.distributed import CommObserver
from runtime.distributed import comm as _comm_module

__all__ = ["CommsLogger", "CommRecord", "bus_factor", "format_summary"]

log = logging.getLogger("runtime.comms")
_OWN_FILES = (os.path.dirname(os.path.abspath(__file__)), _comm_module.__file__)


def bus_factor(kind: str, world: int) -> float:
    """nccl-tests' busbw / algbw for a collective over `world` ranks."""
    if world <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (world - 1) / world
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (world - 1) / world
    return 1.0


@dataclass
class CommRecord:
    """All collectives of one kind and message size on this rank."""

    kind: str
    size: int
    world: int
    count: int = 0
    traffic: int = 0
    latency: float = 0.0
    min_latency: float = float("inf")
    max_latency: float = 0.0

    @property
    def mean_latency(self) -> float:
        return self.latency / self.count if self.count else 0.0

    @property
    def algbw(self) -> float:
        """Bytes per second (nccl-tests' algbw) at the mean latency."""
        return self.size / self.mean_latency if self.mean_latency > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.kind, self.world)

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "size": self.size,
            "count": self.count,
            "bytes": self.traffic,
            "latency_s": self.latency,
            "mean_latency_s": self.mean_latency,
            "min_latency_s": self.min_latency if self.count else 0.0,
            "max_latency_s": self.max_latency,
            "algbw_gbps": self.algbw / 1e9,
            "busbw_gbps": self.busbw / 1e9,
        }


class CommsLogger(CommObserver):
    """Records collectives reported by runtime.distributed.comm (see the module docstring)."""

    def __init__(
        self,
        *,
        kinds: frozenset[str] | None = None,
        verbose: bool = False,
        debug: bool = False,
        rank: int = 0,
        sync_cuda: bool = False,
        summary_at_exit: bool = True,
    ):
        self.kinds = kinds
        self.verbose = verbose and rank == 0
        self.debug = debug
        self.rank = rank
        self.sync_cuda = sync_cuda
        self.records: dict[tuple[str, int], CommRecord] = {}
        self._lock = threading.Lock()
        self.chained: CommObserver | None = None
        """Another observer told about every collective too (the wall-clock timers)."""
        if summary_at_exit and rank == 0:
            atexit.register(self._summary_at_exit)

    def on_done(
        self, kind: str, size: int, traffic: int, latency: float, blocked: float, world: int
    ) -> None:
        if self.chained is not None:
            self.chained.on_done(kind, size, traffic, latency, blocked, world)
        if self.kinds is not None and kind not in self.kinds:
            return
        with self._lock:
            record = self.records.get((kind, size))
            if record is None:
                record = self.records[(kind, size)] = CommRecord(kind, size, world)
            record.count += 1
            record.traffic += traffic
            record.latency += latency
            record.min_latency = min(record.min_latency, latency)
            record.max_latency = max(record.max_latency, latency)
        if self.verbose:
            caller = ""
            if self.debug:
                # The first frame outside runtime.distributed.comm and runtime.observe.profiling: who waited.
                for frame in inspect.stack(context=0)[1:12]:
                    if not frame.filename.startswith(_OWN_FILES):
                        caller = f" | caller {frame.function} ({frame.filename}:{frame.lineno})"
                        break
            algbw = size / latency if latency > 0 else 0.0
            log.info(
                "comm op: %s | time (ms): %.3f | msg size: %s | algbw (Gbps): %.2f | "
                "busbw (Gbps): %.2f%s",
                kind,
                latency * 1e3,
                _size(size),
                algbw * 8 / 1e9,
                algbw * bus_factor(kind, world) * 8 / 1e9,
                caller,
            )

    def summary(self) -> list[dict]:
        """One row per (kind, message size), sorted by kind then size."""
        with self._lock:
            rows = [r.as_dict() for r in self.records.values()]
        return sorted(rows, key=lambda r: (r["kind"], r["size"]))

    def reset(self) -> None:
        with self._lock:
            self.records.clear()

    def _summary_at_exit(self) -> None:
        rows = self.summary()
        if rows:
            _emit(format_summary(rows, self.rank))


def _emit(text: str) -> None:
    from runtime.observe.metrics import _log_line

    for line in text.splitlines():
        _log_line(line)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def format_summary(rows: list[dict], rank: int = 0) -> str:
    """The summary as a plain-text table (DeepSpeed's comms summary columns, nccl-tests' bw)."""
    header = (
        f"{'collective':<15} {'msg size':>11} {'count':>7} {'bytes sent':>11} "
        f"{'total ms':>10} {'avg ms':>9} {'min ms':>9} {'max ms':>9} "
        f"{'algbw GB/s':>10} {'busbw GB/s':>10}"
    )
    lines = [f"comms summary (rank {rank}; bandwidths as nccl-tests define them)", header]
    for r in rows:
        lines.append(
            f"{r['kind']:<15} {_size(r['size']):>11} {r['count']:>7} {_size(r['bytes']):>11} "
            f"{r['latency_s'] * 1e3:>10.2f} {r['mean_latency_s'] * 1e3:>9.3f} "
            f"{r['min_latency_s'] * 1e3:>9.3f} {r['max_latency_s'] * 1e3:>9.3f} "
            f"{r['algbw_gbps']:>10.3f} {r['busbw_gbps']:>10.3f}"
        )
    return "\n".join(lines)
