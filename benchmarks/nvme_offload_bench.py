"""ZeRO-Infinity against a memory limit: a model whose states are 4x the job's memory, trained.

    python benchmarks/nvme_offload_bench.py --nvme-path /var/tmp/zl-nvme --limit-mib 1536 \\
        --width 4096 --layers 24 --steps 4 [--largest] [--json out.json]

The model is a stack of ``--layers`` ``Linear(width, width)`` + GELU blocks (one stage-3 unit
each) regressing a fixed random target, trained in bf16 with Adam (fp32 masters): 16 bytes of
model states per parameter (2 parameter, 2 gradient, 4 master, 4+4 Adam). It is built under
``runtime.zero.Init`` so no rank ever holds it whole. Every run is a real zlaunch job
(``zlaunch --num-gpus N``, the local launcher) started by a shell that first puts itself into
a fresh memory cgroup (v1 ``memory.limit_in_bytes``; v2 ``memory.max``), so the controller and
every rank it starts are under the limit; the cgroup's ``max_usage_in_bytes`` is the job's
peak.

One invocation measures, in this order:

1. **the disk floor** at ``--nvme-path``: ``dd`` of ``--floor-mib`` with ``oflag=direct
   conv=fsync`` (write) and ``iflag=direct`` (read), 1 MiB blocks, best of two;
2. **the reference**: the same model, data and seed with ``offload_optimizer`` and
   ``offload_param`` on ``"cpu"``, no limit (it needs the states in memory);
3. **ZeRO-Infinity**: both offloads on ``"nvme"`` at ``--nvme-path``, under the limit, to the
   last step. Its losses must equal the reference's to rounding; the swap rate is the bytes the
   swappers moved over the seconds their requests took (summed per request and divided by the
   pool's threads: the rate the disk delivered while it was busy), beside the floor; the step
   time beside the reference's;
4. with ``--largest``: for each of DDP (torch's, no ZeRO), stage 3, stage 3 + CPU offload and
   stage 3 + NVMe, the largest ``--layers`` that trains two steps under the same limit: a
   bisection over layer counts, each probe a job of its own (a job the cgroup's OOM killer
   ends, or one that fails, is "does not fit").

Everything written under ``--nvme-path`` is removed at the end; the swap files themselves are
private unnamed files the kernel frees when the ranks end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup/unified")
BATCH = 8  # rows per micro-batch: the point is the states, not the activations

# ---------------------------------------------------------------------------------------------
# The rank's side (run by zlaunch)


def _model(width: int, layers: int):
    import torch

    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width, bias=False), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks)


def _config(mode: str, nvme_path: str, world: int) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": BATCH * world,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
    }
    if mode == "ddp":
        return config
    zero = {
        "stage": 3,
        "sub_group_size": 4 * 2**20,
        "stage3_param_persistence_threshold": 0,
        "stage3_max_live_parameters": 3 * 2**24,
        "stage3_prefetch_bucket_size": 2**24,
    }
    if mode in ("cpu", "nvme"):
        block = {"device": "cpu"} if mode == "cpu" else {"device": "nvme", "nvme_path": nvme_path}
        zero["offload_param"] = dict(block)
        zero["offload_optimizer"] = dict(block)
    config["zero_optimization"] = zero
    return config


def _swap_stats(engine) -> dict:
    """Bytes and request-seconds of every swapper the engine holds (parameters, optimizer)."""
    found = {}
    store = getattr(getattr(engine, "sharding", None), "store", None)
    if getattr(store, "swapper", None) is not None:
        found["params"] = store.swapper
    for holder in (getattr(engine, "optimizer", None), getattr(engine, "zero_optimizer", None)):
        swap = getattr(holder, "swap", None)
        if swap is not None:
            found["optimizer"] = swap.swapper
    out = {}
    for name, swapper in found.items():
        s = swapper.stats
        out[name] = {
            "bytes_read": s.bytes_read,
            "bytes_written": s.bytes_written,
            "read_seconds": s.read_seconds,
            "write_seconds": s.write_seconds,
            "workers": getattr(swapper, "workers", None),
        }
    return out


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _RssSampler:
    """The rank's largest resident set per phase (init, each step's forward/backward/step),
    sampled every 5 ms on a thread: where the memory goes, not only how much."""

    def __init__(self):
        import threading

        self.phase = "init"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.005):
            phase, rss = self.phase, _rss_mib()
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), rss)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def worker(args) -> None:
    import torch

    import runtime

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    config = _config(args.mode, args.nvme_path, world)
    torch.manual_seed(0)
    sampler = _RssSampler()
    t0 = time.perf_counter()
    if args.mode == "ddp":
        model = _model(args.width, args.layers).to(torch.bfloat16)
        engine, *_ = runtime.initialize(model=model, config=config)
    else:
        # dtype: the shards are kept in bf16 from the start (the default keeps the fp32 the
        # modules were made in: 4 bytes per parameter until initialize, over the limit).
        with runtime.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16):
            model = _model(args.width, args.layers)
        engine, *_ = runtime.initialize(model=model, config=config)
    init_s = time.perf_counter() - t0
    peak_init = _maxrss_mib()
    g = torch.Generator().manual_seed(1234)
    target_map = torch.randn(args.width, args.width, generator=g) / args.width**0.5
    losses, times, rss = [], [], []
    for step in range(args.steps):
        gs = torch.Generator().manual_seed(10_000 + step * world + rank)
        x = torch.randn(BATCH, args.width, generator=gs)
        y = torch.tanh(x @ target_map)
        t = time.perf_counter()
        sampler.phase = f"{step}.forward"
        out = engine(x.to(torch.bfloat16))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        sampler.phase = f"{step}.backward"
        engine.backward(loss)
        sampler.phase = f"{step}.step"
        engine.step()
        sampler.phase = "between"
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        rss.append(_rss_mib())
        print(f"step {step} loss {losses[-1]:.6f} time {times[-1]:.2f}s", flush=True)
    result = {
        "rank": rank,
        "mode": args.mode,
        "params": sum(
            p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters()
        ),  # fmt: skip
        "init_s": init_s,
        "losses": losses,
        "step_s": times,
        "swap": _swap_stats(engine),
        "maxrss_after_init_mib": peak_init,
        "rss_after_step_mib": rss,
        "maxrss_mib": _maxrss_mib(),
        "peak_rss_by_phase_mib": sampler.stop(),
    }
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    if hasattr(engine, "close"):
        engine.close()


# ---------------------------------------------------------------------------------------------
# The controller's side


class MemoryCgroup:
    """A fresh memory cgroup: `wrap` turns a command into one that runs inside it."""

    def __init__(self, limit_bytes: int | None):
        self.limit = limit_bytes
        self.path: Path | None = None
        self.v1 = CGROUP_V1.is_dir()
        if limit_bytes is None:
            return
        root = CGROUP_V1 if self.v1 else CGROUP_V2
        if not root.is_dir():
            raise SystemExit(f"no memory cgroup hierarchy at {CGROUP_V1} or {CGROUP_V2}")
        self.path = root / f"zl-nvme-bench-{os.getpid()}-{time.monotonic_ns()}"
        self.path.mkdir()
        if self.v1:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (self.path / "memory.max").write_text(str(limit_bytes))
            (self.path / "memory.swap.max").write_text("0")

    def wrap(self, argv: list[str]) -> list[str]:
        if self.path is None:
            return argv
        shell = f'echo $$ > {self.path}/cgroup.procs && exec "$@"'
        return ["sh", "-c", shell, "sh", *argv]

    def peak_bytes(self) -> int | None:
        if self.path is None:
            return None
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        f = self.path / name
        return int(f.read_text()) if f.exists() else None

    def oom_killed(self) -> bool:
        if self.path is None:
            return False
        if self.v1:
            text = (self.path / "memory.oom_control").read_text()
            m = re.search(r"oom_kill (\d+)", text)
            return bool(m and int(m.group(1)))
        m = re.search(r"oom_kill (\d+)", (self.path / "memory.events").read_text())
        return bool(m and int(m.group(1)))

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)  # the last process may still be leaving


def run_job(args, mode: str, layers: int, steps: int, limit: int | None, work: Path) -> dict:
    """One zlaunch job; returns its ranks' results, the cgroup's peak and how it ended."""
    out = work / f"{mode}-{layers}"
    nvme = work / "swap"
    nvme.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "zlaunch", "--num-gpus", str(args.world_size),
            str(Path(__file__).resolve()), "--worker", "--mode", mode,
            "--width", str(args.width), "--layers", str(layers), "--steps", str(steps),
            "--nvme-path", str(nvme), "--out", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
    env.setdefault("DS_ACCELERATOR", "cpu")
    group = MemoryCgroup(limit)
    t = time.perf_counter()
    try:
        done = subprocess.run(group.wrap(argv), cwd=work, env=env, capture_output=True,
                              text=True, timeout=args.job_timeout)  # fmt: skip
        rc, tail = done.returncode, (done.stdout + done.stderr)[-2500:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e.stdout or "")[-2500:]
    wall = time.perf_counter() - t
    peak, oom = group.peak_bytes(), group.oom_killed()
    group.remove()
    ranks = []
    for r in range(args.world_size):
        f = out.with_suffix(f".rank{r}.json")
        if f.exists():
            ranks.append(json.loads(f.read_text()))
            f.unlink()
    ok = rc == 0 and len(ranks) == args.world_size
    left = sorted(os.listdir(nvme))
    return {"mode": mode, "layers": layers, "ok": ok, "rc": rc, "oom_killed": oom,
            "peak_mib": peak / 2**20 if peak else None, "wall_s": wall, "ranks": ranks,
            "left_in_nvme_path": left, "tail": None if ok else tail}  # fmt: skip


def disk_floor(path: Path, mib: int) -> dict:
    """Sequential direct-I/O write (with fsync) and read of `mib` MiB at `path`, best of two."""
    f = path / "floor.bin"
    best = {"write_gbps": 0.0, "read_gbps": 0.0}
    for _ in range(2):
        t = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mib}",
                        "oflag=direct", "conv=fsync", "status=none"], check=True)  # fmt: skip
        w = mib * 2**20 / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=1M", "iflag=direct",
                        "status=none"], check=True)  # fmt: skip
        r = mib * 2**20 / (time.perf_counter() - t) / 1e9
        best = {"write_gbps": max(best["write_gbps"], w), "read_gbps": max(best["read_gbps"], r)}
        f.unlink()
    return best


def swap_rates(job: dict) -> dict:
    """GB/s the swappers got from the disk while busy (per rank, then summed over ranks)."""
    read = write = 0.0
    moved = {"bytes_read": 0, "bytes_written": 0}
    for rank in job["ranks"]:
        for s in rank["swap"].values():
            workers = s["workers"] or 1
            moved["bytes_read"] += s["bytes_read"]
            moved["bytes_written"] += s["bytes_written"]
            read += s["read_seconds"] / workers
            write += s["write_seconds"] / workers
    return {
        **moved,
        "read_gbps": moved["bytes_read"] / read / 1e9 if read else None,
        "write_gbps": moved["bytes_written"] / write / 1e9 if write else None,
    }


def _losses(job: dict) -> list[float]:
    return job["ranks"][0]["losses"]


def _median_step(job: dict) -> float:
    # The first step of an engine pays one-time costs (optimizer state creation): left out.
    return statistics.median(s for r in job["ranks"] for s in r["step_s"][1:])


def largest(args, mode: str, limit: int, work: Path, lo: int, hi: int) -> dict:
    """The largest layer count in [lo, hi] that trains 2 steps under `limit` (bisection)."""
    probes = []
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        job = run_job(args, mode, mid, 2, limit, work)
        probes.append({k: job[k] for k in ("layers", "ok", "rc", "oom_killed", "peak_mib",
                                             "wall_s")})  # fmt: skip
        print(
            f"  {mode:>5} layers {mid:>3}: {'fits' if job['ok'] else 'does not fit'}"
            f" (peak {job['peak_mib'] or 0:.0f} MiB, {job['wall_s']:.0f} s)",
            flush=True,
        )
        if job["ok"]:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return {"largest_layers": best, "probes": probes}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nvme-path", default="/var/tmp", help="a directory on a local disk")
    parser.add_argument("--limit-mib", type=int, default=1536, help="the job's memory limit")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="OMP threads per rank")
    parser.add_argument("--floor-mib", type=int, default=2048)
    parser.add_argument("--largest", action="store_true", help="bisect the largest model")
    parser.add_argument("--largest-min", type=int, default=1, help="layers, lower bound")
    parser.add_argument("--largest-max", type=int, default=64, help="layers, upper bound")
    parser.add_argument("--largest-modes", nargs="+", default=["ddp", "stage3", "cpu", "nvme"],
                        choices=["ddp", "stage3", "cpu", "nvme"])  # fmt: skip
    parser.add_argument("--only-largest", action="store_true", help="skip the 4x run")
    parser.add_argument("--job-timeout", type=int, default=1800)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    limit = args.limit_mib * 2**20
    params = args.layers * args.width**2
    states = 16 * params
    print(f"model: {args.layers} x Linear({args.width}, {args.width}) = {params / 1e6:.0f}M "
          f"parameters, model states {states / 2**30:.2f} GiB = {states / limit:.2f}x the "
          f"{args.limit_mib} MiB limit; {args.world_size} rank(s)", flush=True)  # fmt: skip
    base = Path(args.nvme_path)
    base.mkdir(parents=True, exist_ok=True)
    record: dict = {"args": {k: str(v) for k, v in vars(args).items()},
                    "params": params, "model_states_bytes": states}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="zl-nvme-bench-", dir=base) as tmp:
        work = Path(tmp)
        record["floor"] = disk_floor(work, args.floor_mib)
        print(
            f"disk floor: write {record['floor']['write_gbps']:.2f} GB/s (direct, fsync), "
            f"read {record['floor']['read_gbps']:.2f} GB/s (direct)",
            flush=True,
        )
        if args.only_largest:
            record["largest"] = {
                mode: largest(args, mode, limit, work, args.largest_min, args.largest_max)
                for mode in args.largest_modes
            }
            args.largest = False
        if not args.skip_reference and not args.only_largest:
            ref = run_job(args, "cpu", args.layers, args.steps, None, work)
            record["reference_cpu_offload"] = ref
            if not ref["ok"]:
                raise SystemExit(f"the CPU-offload reference failed ({ref['rc']}):\n{ref['tail']}")
            print(
                f"cpu offload, no limit: losses {_losses(ref)}, step "
                f"{_median_step(ref):.2f} s, peak (no limit) n/a",
                flush=True,
            )
        if args.only_largest:
            if args.json:
                args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
            return
        inf = run_job(args, "nvme", args.layers, args.steps, limit, work)
        record["infinity"] = inf
        if not inf["ok"]:
            raise SystemExit(f"ZeRO-Infinity under {args.limit_mib} MiB failed ({inf['rc']}, "
                             f"oom_killed={inf['oom_killed']}):\n{inf['tail']}")  # fmt: skip
        rates = swap_rates(inf)
        record["swap"] = rates
        print(
            f"nvme, {args.limit_mib} MiB limit: losses {_losses(inf)}, step "
            f"{_median_step(inf):.2f} s, cgroup peak {inf['peak_mib']:.0f} MiB",
            flush=True,
        )
        print(f"swap: read {rates['read_gbps']:.2f} GB/s "
              f"({rates['read_gbps'] / record['floor']['read_gbps']:.0%} of floor), write "
              f"{rates['write_gbps']:.2f} GB/s "
              f"({rates['write_gbps'] / record['floor']['write_gbps']:.0%} of floor); "
              f"{rates['bytes_read'] / 2**30:.1f} GiB read, "
              f"{rates['bytes_written'] / 2**30:.1f} GiB written", flush=True)  # fmt: skip
        if not args.skip_reference:
            a, b = _losses(ref), _losses(inf)
            record["max_rel_loss_diff"] = max(
                abs(x - y) / abs(x) for x, y in zip(a, b, strict=True)
            )
            record["step_ratio_nvme_over_cpu"] = _median_step(inf) / _median_step(ref)
            print(
                f"largest relative loss difference {record['max_rel_loss_diff']:.2e}; step "
                f"time nvme/cpu {record['step_ratio_nvme_over_cpu']:.2f}x",
                flush=True,
            )
        record["swap_files_left"] = inf["left_in_nvme_path"]
        if args.largest:
            record["largest"] = {}
            for mode in args.largest_modes:
                record["largest"][mode] = largest(
                    args, mode, limit, work, args.largest_min, args.largest_max
                )
    shutil.rmtree(base / "swap", ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
