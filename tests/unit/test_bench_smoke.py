"""The training benchmark harness end to end, tiny: DDP and this runtime, 2 ranks, 3 steps.

DeepSpeed is left out on purpose (an optional extra that CI may not have). The run checks the
harness itself: every field is present, and the measurements that are exact by construction
are exact (DDP's all-reduce volume, DDP's model states, the runtime's own byte counter agreeing
with the intercepted collectives, identical losses for identical work).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench_utils():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_utils
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return bench_utils


def test_reachable_tensor_bytes_counts_each_storage_once():
    import torch

    bench_utils = _bench_utils()
    flat = torch.zeros(100)  # 400 bytes behind two parameter views
    a, b = torch.nn.Parameter(flat[:60]), torch.nn.Parameter(flat[60:])
    a.grad = torch.zeros(60)  # 240
    b.partition = torch.zeros(10, dtype=torch.float64)  # 80, hung on the parameter

    class Holder:
        def __init__(self):
            self.params = [a, b]
            self.state = {"m": torch.zeros(5, dtype=torch.int16), "again": flat}  # 10
            self.hook = self.method  # bound method back to self: no loop, no double count

        def method(self):
            return None

    assert bench_utils.reachable_tensor_bytes(Holder()) == 400 + 240 + 80 + 10
    view = torch.zeros(8)[2:4]
    assert bench_utils.reachable_tensor_bytes(view) == 32  # the whole storage
