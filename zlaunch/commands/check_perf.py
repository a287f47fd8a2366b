"""`zlaunch check --perf`: what each host measures, and which hosts stand out (pure but the probe).

The probe part runs on every host beside `zlaunch check`'s own probe, bounded in time: the
compute rate of one slot (a float32 matrix product on the device the job uses: each selected
GPU where there are GPUs, else the CPU with the host's cores shared between its slots), and the
write and read rate of the checkpoint directory's filesystem (a file written and synced, then
read back past the page cache, then removed). `outliers` compares every figure with the fleet's
median and names the hosts that are slower by ``factor`` or more.

The network is measured after that, all hosts at once, through the backend a job would use
(NCCL on GPUs, gloo on CPUs): `NET_PROBE` joins one process group of every host, and every link
of a ring (host i and host i+1) is measured both ways, bandwidth (transfers doubled from 64 KiB
until one takes a quarter second, at most 64 MiB) and latency (the best of 20 round trips of
one float, after 3 untimed). The links are measured in at most three phases of disjoint pairs (`ring_phases`),
so no host carries two at once and the time is bounded at any fleet size. `link_outliers`
compares every direction with the median of them all; a host all of whose directions out (or
in) are slow is named as the host's network, else the link itself.
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
    "NET_PROBE",
    "ring_phases",
    "LinkOutlier",
    "link_outliers",
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


# Run on every host at once with the interpreter under test; its parameters are one JSON line
# on stdin. Rank 0 serves the rendezvous on a free port and says which before anything else.
NET_PROBE = r"""
import datetime, json, os, sys, time
p = json.loads(sys.stdin.readline())
import torch
import torch.distributed as dist
rank, world, seconds = p["rank"], p["world"], float(p.get("seconds", 0.25))
gpu = torch.cuda.is_available()
device = torch.device("cuda", int(p.get("slot", 0))) if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
if "GLOO_SOCKET_IFNAME" not in os.environ and p.get("addr"):
    try:  # the interface that reaches the rendezvous, as the agent picks it for a job
        from zlaunch.agent.netinfo import interface_for
        iface = interface_for(p["addr"])
        if iface:
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = iface
    except Exception:
        pass
timeout = datetime.timedelta(seconds=float(p.get("timeout", 60)))
if rank == 0:
    store = dist.TCPStore("0.0.0.0", 0, world, True, timeout=timeout, wait_for_workers=False)
    print("ZLAUNCH-NETPORT %d" % store.port, flush=True)
else:
    store = dist.TCPStore(p["addr"], int(p["port"]), world, False, timeout=timeout)
dist.init_process_group("nccl" if gpu else "gloo", store=store, rank=rank, world_size=world,
                        timeout=timeout)
one = torch.zeros(1, device=device)
def sync():
    if gpu:
        torch.cuda.synchronize(device)
def send_side(peer):
    trips = []
    for _ in range(3):  # untimed: a pair's first messages may set up its connection
        dist.send(one, peer); dist.recv(one, peer); sync()
    for _ in range(20):
        start = time.perf_counter()
        dist.send(one, peer); dist.recv(one, peer); sync()
        trips.append(time.perf_counter() - start)
    size, rate = 1 << 16, 0.0
    while True:
        dist.send(torch.tensor([float(size)], device=device), peer)
        buf = torch.ones(size // 4, device=device)
        sync()
        start = time.perf_counter()
        dist.send(buf, peer); dist.recv(one, peer); sync()
        took = time.perf_counter() - start
        rate = size / took / 1e6
        if took >= seconds or size >= 64 << 20:
            break
        size *= 2
    dist.send(torch.zeros(1, device=device), peer)
    return {"mbs": rate, "latency_ms": min(trips) / 2 * 1e3, "bytes": size}
def recv_side(peer):
    for _ in range(23):
        dist.recv(one, peer); dist.send(one, peer)
    head = torch.zeros(1, device=device)
    while True:
        dist.recv(head, peer)
        size = int(head.item())
        if not size:
            return
        buf = torch.empty(size // 4, device=device)
        dist.recv(buf, peer); dist.send(one, peer)
links = []
for phase in p["phases"]:
    for a, b in phase:
        for src, dst in ((a, b), (b, a)):
            if rank == src:
                links.append({"src": src, "dst": dst, **send_side(dst)})
            elif rank == dst:
                recv_side(src)
    dist.barrier()
print("ZLAUNCH-NET " + json.dumps({"links": links, "backend": dist.get_backend()}), flush=True)
dist.destroy_process_group()
"""


def ring_phases(n: int) -> list[list[tuple[int, int]]]:
    """The ring's links (i, i+1; the last to the first) in phases of disjoint pairs: two for
    an even ring, three for an odd one, one link for two hosts, none for one."""
    if n < 2:
        return []
    links = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if n > 2 else [])
    phases: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for a, b in links:
        for index, used in enumerate(busy):
            if a not in used and b not in used:
                phases[index].append((a, b))
                used.update((a, b))
                break
        else:
            phases.append([(a, b)])
            busy.append({a, b})
    return phases


LATENCY_FLOOR_MS = 5.0
"""A direction's latency is named only this far above the median too: on a fast network the
median is tens of microseconds, and 1.25x of that (or a millisecond or two of a busy host's
scheduling) is noise."""


@dataclass(frozen=True)
class LinkOutlier:
    """A slow host's network (``dst`` None: every direction out of ``host``, or into it with
    ``inbound``) or one slow link ``host`` -> ``dst``, by one figure."""

    host: str
    dst: str | None
    figure: str
    """"bandwidth" or "latency"."""
    values: tuple[float, ...]
    median: float
    inbound: bool = False

    @property
    def factor(self) -> float:
        worst = min(self.values) if self.figure == "bandwidth" else max(self.values)
        if self.figure == "bandwidth":
            return self.median / worst if worst > 0 else float("inf")
        return worst / self.median if self.median > 0 else float("inf")

    @property
    def text(self) -> str:
        unit = "MB/s" if self.figure == "bandwidth" else "ms"
        low, high = min(self.values), max(self.values)
        value = f"{low:.3g}" if low == high else f"{low:.3g}-{high:.3g}"
        way = "below" if self.figure == "bandwidth" else "above"
        if self.dst is not None:
            who = f"link {self.host} -> {self.dst}"
        else:
            who = f"network of {self.host} ({'in' if self.inbound else 'out'}bound)"
        return (
            f"{who}: {self.figure} {value} {unit}, {self.factor:.2f}x {way} the median "
            f"{self.median:.3g} {unit}"
        )


def link_outliers(links: Sequence[Mapping], factor: float = DEFAULT_FACTOR) -> list[LinkOutlier]:
    """Every measured direction (``src``, ``dst`` host names, ``mbs``, ``latency_ms``)
    against the median of them all; slowest first. A host of which two or more directions out
    (or in) were measured and every one is slow is named once as the host's network; a slow
    direction with neither end so named is named as the link."""
    found: list[LinkOutlier] = []
    for key, figure in (("mbs", "bandwidth"), ("latency_ms", "latency")):
        values = [(lk["src"], lk["dst"], lk[key]) for lk in links if _rate(lk.get(key))]
        if len(values) < 2:
            continue
        median = statistics.median(v for _, _, v in values)

        def slow(value: float, median: float = median, figure: str = figure) -> bool:
            if figure == "bandwidth":
                return value * factor <= median
            return value >= median * factor and value >= median + LATENCY_FLOOR_MS

        bad = [(s, d, v) for s, d, v in values if slow(v)]
        explained: set[tuple[str, str]] = set()
        for side, inbound in ((0, False), (1, True)):
            hosts = sorted({v[side] for v in values})
            for host in hosts:
                mine = [v for v in values if v[side] == host]
                if len(mine) >= 2 and all(slow(v) for _, _, v in mine):
                    found.append(
                        LinkOutlier(host, None, figure, tuple(v for *_, v in mine), median, inbound)
                    )
                    explained.update((s, d) for s, d, _ in mine)
        # A host named as its network explains every slow direction it is an end of: a link
        # into a host whose outbound is throttled reads slow too (its replies queue behind the
        # host's own traffic), and the host leaves the fleet with its links anyway.
        named = {o.host for o in found if o.figure == figure}
        for src, dst, value in bad:
            if (src, dst) not in explained and src not in named and dst not in named:
                found.append(LinkOutlier(src, dst, figure, (value,), median))
    return sorted(found, key=lambda o: -o.factor)


def _rate(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
