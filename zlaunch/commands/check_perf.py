"""`zlaunch check --perf`: what each host measures, and which hosts stand out (pure but the probe).

The probe part runs on every host beside `zlaunch check`'s own probe, bounded in time: the
compute rate of one slot (a float32 matrix product on the device the job uses: each selected
GPU where there are GPUs, else the CPU with the host's cores shared between its slots), and the
write and read rate of the checkpoint directory's filesystem (a file written and synced, then
read back past the page cache, then removed). `outliers` compares every figure with the fleet's
median and names the hosts that are slower by ``factor`` or more.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PERF_PROBE",
    "FIGURES",
    "DEFAULT_FACTOR",
    "Outlier",
    "outliers",
    "hostfile_line",
    "Kept",
    "kept_hosts",
]

DEFAULT_FACTOR = 1.25
"""A host is an outlier at this factor below the fleet's median rate (the straggler scores'
threshold, zlaunch/launcher/stragglers.py)."""

FIGURES = (
    ("gflops", "compute", "GFLOP/s per slot"),
    ("write_mbs", "checkpoint-dir write", "MB/s"),
    ("read_mbs", "checkpoint-dir read", "MB/s"),
)
"""(key in the probe's facts, what it measures, unit): every one a rate, higher is better."""

# Appended to check.py's probe, which has read its parameters into ``p`` and fills ``r``.
PERF_PROBE = r"""
def _perf(p):
    import os, tempfile, time
    out = {}
    seconds = float(p.get("seconds", 1.0))
    import torch
    n = int(p.get("size", 1024))
    slots = p.get("slots") or [0]
    gpu = torch.cuda.is_available()
    if not gpu:
        torch.set_num_threads(max(1, (len(os.sched_getaffinity(0)) or 1) // len(slots)))
    rates = []
    for slot in (slots if gpu else slots[:1]):
        device = torch.device("cuda", slot) if gpu else torch.device("cpu")
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        (a @ b).sum().item()  # warm-up, and the device is ready
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            c = a @ b
            count += 1
            if gpu and count % 8 == 0:
                torch.cuda.synchronize(device)
        if gpu:
            torch.cuda.synchronize(device)
        rates.append(2 * n**3 * count / (time.perf_counter() - start) / 1e9)
    out["gflops"] = min(rates)
    out["device"] = "cuda" if gpu else "cpu"
    where = p.get("dir") or "."
    size, block = int(p.get("io_bytes", 64 << 20)), os.urandom(1 << 20)
    fd, path = tempfile.mkstemp(prefix=".zlaunch-perf-", dir=where)
    try:
        start = time.perf_counter()
        for _ in range(size // len(block)):
            os.write(fd, block)
        os.fsync(fd)
        out["write_mbs"] = size / (time.perf_counter() - start) / 1e6
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk, not memory
        os.lseek(fd, 0, os.SEEK_SET)
        start = time.perf_counter()
        while os.read(fd, 1 << 20):
            pass
        out["read_mbs"] = size / (time.perf_counter() - start) / 1e6
    finally:
        os.close(fd)
        os.unlink(path)
    return out
if p.get("perf"):
    try:
        r["perf"] = _perf(p["perf"])
    except Exception as e:
        r["perf_error"] = f"{type(e).__name__}: {e}"
"""


@dataclass(frozen=True)
class Outlier:
    host: str
    figure: str
    """What was measured ("compute", "checkpoint-dir write", ...)."""
    value: float
    median: float
    unit: str

    @property
    def factor(self) -> float:
        """How many times slower than the median (above 1)."""
        return self.median / self.value if self.value > 0 else float("inf")

    @property
    def text(self) -> str:
        return (
            f"{self.figure} {self.value:.4g} {self.unit}, {self.factor:.2f}x below the median "
            f"{self.median:.4g}"
        )


def outliers(
    perf: Mapping[str, Mapping[str, float]], factor: float = DEFAULT_FACTOR
) -> list[Outlier]:
    """Every host's figures (``perf``: host -> the probe's figures) against the fleet's median:
    the ones ``factor`` times slower or more, slowest first. Fewer than two hosts with a
    figure: nothing to compare it with."""
    found = []
    for key, figure, unit in FIGURES:
        values = {h: f[key] for h, f in perf.items() if isinstance(f.get(key), (int, float))}
        if len(values) < 2:
            continue
        median = statistics.median(values.values())
        for host, value in values.items():
            if value * factor <= median:
                found.append(Outlier(host, figure, value, median, unit))
    return sorted(found, key=lambda o: -o.factor)


def hostfile_line(host, slots: int | None = None) -> str:
    """A `zlaunch.job.Host` as a hostfile line: ``slots`` of them (default: its selected slots
    as a count, which is what they are when they are 0..N-1)."""
    line = f"{host.display} slots={len(host.slots) if slots is None else slots}"
    if host.user:
        line += f" user={host.user}"
    if host.port:
        line += f" port={host.port}"
    return line


@dataclass(frozen=True)
class Kept:
    """What ``--write-hostfile`` writes, and the selectors that go with it."""

    lines: tuple[str, ...]
    include: str | None
    """The --include that selects, from the written file, the slots selected for the check;
    None when the file alone does (every kept host's selection is its slots 0..N-1)."""
    exclude: str | None
    """The hosts left out as an --exclude of the hostfile checked; None when none was."""


def kept_hosts(listed: Sequence, selected: Sequence, passed: Collection[str]) -> Kept:
    """The hostfile of the ``selected`` hosts (`zlaunch.job.Host`, with the slots chosen for
    the check) whose display name is in ``passed``. A hostfile line means slots 0..N-1, so a
    host checked on other slots (``--include node1:2,3``) is written with all its slots from
    ``listed`` (the hostfile as read) and `Kept.include` names the ones checked: the written
    file never puts a job on slots nobody checked."""
    total = {h.display: len(h.slots) for h in listed}
    lines, terms, subset = [], [], False
    for host in selected:
        if host.display not in passed:
            continue
        if host.slots == tuple(range(len(host.slots))):
            lines.append(hostfile_line(host))
            terms.append(host.display)
        else:
            subset = True
            lines.append(hostfile_line(host, total.get(host.display, max(host.slots) + 1)))
            terms.append(f"{host.display}:{_slot_ranges(host.slots)}")
    out = [h.display for h in selected if h.display not in passed]
    return Kept(tuple(lines), "@".join(terms) if subset else None, "@".join(out) or None)


def _slot_ranges(slots: Sequence[int]) -> str:
    """``0-3,6``: the selector grammar's slot list (zlaunch/job/selectors.py)."""
    parts: list[str] = []
    start = prev = None
    for slot in sorted(slots):
        if prev is not None and slot == prev + 1:
            prev = slot
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = slot
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
