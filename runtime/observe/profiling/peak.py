"""The peak FLOP rate that MFU divides by: `--peak-tflops`, a table of known GPUs, or a probe.

Dense peaks (no structured sparsity) in TFLOP/s per device, from the vendors' datasheets:
16-bit is the BF16/FP16 tensor-core figure (the datasheets print twice it "with sparsity"),
fp32 the plain FP32 figure (torch does not use TF32 for matmuls unless asked). The first
entry whose name occurs in ``torch.cuda.get_device_name()`` wins, so longer names come first.

On a CPU there is no honest datasheet figure for "this many cores, shared": a short fp32/bf16
matmul probe is run once and its rate is the peak; the label says so.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["GPU_PEAKS", "Peak", "resolve_peak", "probe_matmul_tflops"]

# (name substring, 16-bit TFLOP/s, fp32 TFLOP/s, source)
GPU_PEAKS: tuple[tuple[str, float, float, str], ...] = (
    ("H100 PCIe", 756.0, 51.0, "NVIDIA H100 datasheet (PCIe): BF16 1,513 sparse, FP32 51"),
    ("H100 NVL", 835.5, 60.0, "NVIDIA H100 datasheet (NVL): BF16 1,671 sparse, FP32 60"),
    ("H100", 989.5, 67.0, "NVIDIA H100 datasheet (SXM): BF16 1,979 sparse, FP32 67"),
    ("H200", 989.5, 67.0, "NVIDIA H200 datasheet (SXM): BF16 1,979 sparse, FP32 67"),
    ("H800", 989.5, 67.0, "NVIDIA H800 SXM: H100 SXM compute figures"),
    ("A100", 312.0, 19.5, "NVIDIA A100 datasheet: BF16 312 (624 sparse), FP32 19.5"),
    ("A800", 312.0, 19.5, "NVIDIA A800: A100 compute figures"),
    ("L40S", 362.05, 91.6, "NVIDIA L40S datasheet: BF16 362.05 (733 sparse), FP32 91.6"),
    ("L40", 181.05, 90.5, "NVIDIA L40 datasheet: BF16 181.05 (362.1 sparse), FP32 90.5"),
    ("L4", 121.0, 30.3, "NVIDIA L4 datasheet: BF16 121 (242 sparse), FP32 30.3"),
    ("A10", 125.0, 31.2, "NVIDIA A10 datasheet: BF16 125 (250 sparse), FP32 31.2"),
    ("V100", 125.0, 15.7, "NVIDIA V100 datasheet (SXM2): FP16 tensor 125, FP32 15.7"),
    ("MI300X", 1307.4, 163.4, "AMD Instinct MI300X datasheet: BF16 1,307.4, FP32 matrix 163.4"),
)


class Peak:
    """A peak figure and where it came from (shown next to MFU)."""

    __slots__ = ("tflops", "source")

    def __init__(self, tflops: float | None, source: str):
        self.tflops = tflops
        self.source = source

    def __repr__(self) -> str:
        return f"Peak({self.tflops!r}, {self.source!r})"


def probe_matmul_tflops(
    dtype: torch.dtype = torch.float32, n: int = 512, budget_s: float = 0.25, windows: int = 5
) -> float:
    """TFLOP/s of n x n matmuls on the CPU: the best of ``windows`` short measurements.

    A peak is what the core can do, not what it did while a neighbouring rank shared it: the
    ranks of a job probe at the same moment, so a single long measurement can come out at a
    fraction of the core's rate (and MFU above 100%). The best window is the one least
    disturbed."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: thread pool, allocation
    best = 0.0
    for _ in range(windows):
        iters, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            iters += 1
            elapsed = time.perf_counter() - start
            if elapsed >= budget_s / windows or iters >= 200:
                break
        best = max(best, 2.0 * n**3 * iters / elapsed / 1e12)
    return best


def resolve_peak(
    device: torch.device, dtype: torch.dtype, environ: dict[str, str] | None = None
) -> Peak:
    """The peak for one device of this run (see the module docstring for the order)."""
    from zlaunch.wire import PEAK_TFLOPS_ENV

    environ = os.environ if environ is None else environ
    raw = environ.get(PEAK_TFLOPS_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if 0 < value < float("inf"):
            return Peak(value, "--peak-tflops")
    half = dtype in (torch.float16, torch.bfloat16)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, sixteen, fp32, source in GPU_PEAKS:
            if key in name:
                return Peak(sixteen if half else fp32, f"{name}: {source}")
        return Peak(None, f"{name} is not in the table of peaks; pass --peak-tflops")
    if device.type == "cpu":
        probe_dtype = dtype if half else torch.float32
        tflops = probe_matmul_tflops(probe_dtype)
        kind = "bf16" if probe_dtype == torch.bfloat16 else str(probe_dtype).split(".")[-1]
        return Peak(tflops, f"CPU matmul probe ({kind}, 512x512, measured)")
    return Peak(None, f"no peak known for {device.type}; pass --peak-tflops")
