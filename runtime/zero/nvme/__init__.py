"""ZeRO-Infinity's NVMe tier: tensors kept in private files under the config's `nvme_path`.

`swap_dir` owns the rank's private directory (0700, unnamed files, removed at the end, stale
ones of dead processes removed at the next start); `swapper` moves tensors between memory and
those files on a thread pool (`os.preadv`/`os.pwritev`, direct I/O where the filesystem takes
it), read-ahead and write-behind through `Pending` handles; `optimizer_swap` keeps the
partitioned optimizer's fp32 masters and their state there between steps; `param_swap` keeps
stage 3's parameter shards there between uses; `host_memory` keeps the host memory offload
frees from staying in the allocator's heap.
"""

from __future__ import annotations

from runtime.zero.nvme.host_memory import hold_mmap_threshold
from runtime.zero.nvme.optimizer_swap import MasterStash, OptimizerSwap
from runtime.zero.nvme.param_swap import SwappedShardStore
from runtime.zero.nvme.swap_dir import SwapDir, sweep_stale
from runtime.zero.nvme.swapper import ALIGN, Pending, SwapError, Swapper, SwapStats, aligned_buffer

__all__ = [
    "ALIGN",
    "MasterStash",
    "OptimizerSwap",
    "Pending",
    "SwapDir",
    "SwapError",
    "SwapStats",
    "SwappedShardStore",
    "Swapper",
    "aligned_buffer",
    "hold_mmap_threshold",
    "sweep_stale",
]
