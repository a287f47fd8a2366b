"""Checkpoint save and load against the disk's own floor, beside torch DCP, in one run.

    python benchmarks/checkpoint_floor.py --dir /var/tmp/zl-ckpt --stages 1 2 3 \\
        --width 2048 --layers 40 [--json out.json]

The model is ``--layers`` x ``Linear(width, width)`` in fp32 with Adam after one step, so a
checkpoint holds 12 bytes per parameter (parameter, exp_avg, exp_avg_sq; 40 x 2048^2 = 168M
parameters = 2.0 GB). Two gloo ranks (one thread each) per stage. Measured in the same run:

1. **the floor**: ``dd`` of the checkpoint's size, 1 MiB blocks, ``oflag=direct
   conv=fsync`` (write) and ``iflag=direct`` (read), two writers at once as the two ranks
   write (best of two);
2. **this runtime**: ``engine.save_checkpoint`` (sync: serialise, write, fsync, commit) and
   ``engine.load_checkpoint`` of it (the page cache dropped between, so the load reads the
   disk), wall time between barriers on both ranks;
3. **torch DCP**: ``torch.distributed.checkpoint.save`` of the same bytes (each rank's
   owned optimizer state: its fp32 masters and both Adam moments) and ``load`` into them;
4. **the async save's cost**: the CPU time (``RUSAGE_SELF``: every thread of the process, the
   writer's included) of ``--steps`` steps with an ``async_save`` in flight, beside the same
   steps without one; CPU seconds, not wall (the wall figure is lost in the machine's noise).

Rates are the checkpoint's bytes over the wall seconds. Everything written is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _drop_caches() -> None:
    # The load must read the disk, not the page cache the save just filled.
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        pass


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def worker(args) -> None:
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import runtime

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 4 * world,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": args.stage},
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
    engine, *_ = runtime.initialize(model=torch.nn.Sequential(*layers), config=config)

    def step(i: int) -> None:
        g = torch.Generator().manual_seed(i * world + rank)
        loss = engine(torch.randn(4, args.width, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()

    step(0)
    out: dict = {"rank": rank}
    base = Path(args.dir)

    def timed(fn) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t

    ours = base / "ours"
    out["save_s"] = timed(lambda: engine.save_checkpoint(str(ours), tag="t"))
    if rank == 0:
        out["bytes"] = _tree_bytes(ours / "t")
        _drop_caches()
    out["load_s"] = timed(lambda: engine.load_checkpoint(str(ours), tag="t"))
    if rank == 0:
        shutil.rmtree(ours)

    # The same bytes through DCP: this rank's masters and Adam moments, named per rank.
    opt = engine.optimizer
    state = {}
    with opt.resident():
        for i, m in enumerate(opt.master):
            s = opt.state.get(m, {})
            if m.numel() == 0:
                continue
            state[f"r{rank}.g{i}.param"] = m.detach().clone()
            for kind in ("exp_avg", "exp_avg_sq"):
                state[f"r{rank}.g{i}.{kind}"] = s[kind].detach().clone()
    theirs = base / "dcp"
    out["dcp_save_s"] = timed(lambda: dcp.save(state, checkpoint_id=str(theirs)))
    if rank == 0:
        out["dcp_bytes"] = _tree_bytes(theirs)
        _drop_caches()
    out["dcp_load_s"] = timed(lambda: dcp.load(state, checkpoint_id=str(theirs)))
    state.clear()
    if rank == 0:
        shutil.rmtree(theirs)

    if args.deepspeed:
        out.update(_deepspeed(args, config, base, timed, rank))

    # The async save's cost to the steps it runs beside, in CPU seconds of this process.
    dist.barrier()
    t = _cpu_s()
    for i in range(args.steps):
        step(100 + i)
    out["cpu_steps_plain_s"] = _cpu_s() - t
    dist.barrier()
    t = _cpu_s()
    engine.save_checkpoint(str(ours), tag="a", async_save=True)
    for i in range(args.steps):
        step(200 + i)
    out["cpu_steps_async_s"] = _cpu_s() - t
    out["async_still_writing_after_steps"] = bool(engine.checkpoint_saver.in_flight)
    engine.wait_for_checkpoint()
    out["cpu_steps_async_incl_wait_s"] = _cpu_s() - t
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ours, ignore_errors=True)
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(out))


def _deepspeed(args, config: dict, base: Path, timed, rank: int) -> dict:
    """DeepSpeed's own engine on the same model and config: its save_checkpoint and
    load_checkpoint of the same states (torch's Adam: no C++ op to build)."""
    import deepspeed
    import torch

    config = json.loads(json.dumps(config))
    config["optimizer"]["params"]["torch_adam"] = True
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
    engine, *_ = deepspeed.initialize(model=torch.nn.Sequential(*layers), config=config)
    loss = engine(torch.randn(4, args.width)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    path = base / "deepspeed"
    out = {"ds_save_s": timed(lambda: engine.save_checkpoint(str(path), tag="t"))}
    if rank == 0:
        out["ds_bytes"] = _tree_bytes(path / "t")
        _drop_caches()
    out["ds_load_s"] = timed(lambda: engine.load_checkpoint(str(path), tag="t"))
    if rank == 0:
        shutil.rmtree(path)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def floor(path: Path, total_bytes: int, writers: int) -> dict:
    """`writers` concurrent dd's of total/writers each: direct write+fsync, then direct read."""
    mib = max(1, total_bytes // writers // 2**20)
    files = [path / f"floor{i}.bin" for i in range(writers)]
    best = {"write_gbps": 0.0, "read_gbps": 0.0}
    for _ in range(2):
        t = time.perf_counter()
        ps = [subprocess.Popen(["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mib}",
                                "oflag=direct", "conv=fsync", "status=none"]) for f in files]  # fmt: skip
        assert all(p.wait() == 0 for p in ps)
        w = writers * mib * 2**20 / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        ps = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=1M", "iflag=direct",
                                "status=none"]) for f in files]  # fmt: skip
        assert all(p.wait() == 0 for p in ps)
        r = writers * mib * 2**20 / (time.perf_counter() - t) / 1e9
        best = {"write_gbps": max(best["write_gbps"], w), "read_gbps": max(best["read_gbps"], r)}
        for f in files:
            f.unlink()
    return best


def run_stage(args, stage: int, work: Path) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(args.world_size):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(args.world_size), LOCAL_WORLD_SIZE=str(args.world_size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(REPO))  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", "--stage", str(stage), "--dir", str(work),
               "--out", str(work / "out"), "--width", str(args.width),
               "--layers", str(args.layers), "--steps", str(args.steps)]  # fmt: skip
        cmd += ["--deepspeed"] if args.deepspeed else []
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait(timeout=3600):
            raise SystemExit(f"stage {stage}: a rank exited with {p.returncode}")
    return [json.loads((work / f"out.rank{r}.json").read_text()) for r in range(args.world_size)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="/var/tmp/zl-ckpt", help="a directory on a local disk")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--steps", type=int, default=4, help="steps beside the async save")
    parser.add_argument("--deepspeed", action="store_true", help="DeepSpeed's save beside")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    nbytes = 12 * args.layers * args.width**2
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    record: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "stages": {}}
    with tempfile.TemporaryDirectory(prefix="zl-ckpt-floor-", dir=args.dir) as tmp:
        work = Path(tmp)
        record["floor"] = fl = floor(work, nbytes, args.world_size)
        print(f"checkpoint {nbytes / 1e9:.2f} GB on {args.world_size} ranks; floor "
              f"({args.world_size} dd at once): write {fl['write_gbps']:.2f} GB/s, read "
              f"{fl['read_gbps']:.2f} GB/s", flush=True)  # fmt: skip
        for stage in args.stages:
            ranks = run_stage(args, stage, work)
            size = ranks[0]["bytes"]

            def rate(key, ranks=ranks, size=size):
                return size / max(r[key] for r in ranks) / 1e9

            row = {
                "ranks": ranks,
                "save_gbps": rate("save_s"),
                "load_gbps": rate("load_s"),
                "dcp_save_gbps": ranks[0]["dcp_bytes"] / max(r["dcp_save_s"] for r in ranks) / 1e9,
                "dcp_load_gbps": ranks[0]["dcp_bytes"] / max(r["dcp_load_s"] for r in ranks) / 1e9,
                "cpu_plain_s": sum(r["cpu_steps_plain_s"] for r in ranks),
                "cpu_async_s": sum(r["cpu_steps_async_s"] for r in ranks),
                "cpu_async_incl_wait_s": sum(r["cpu_steps_async_incl_wait_s"] for r in ranks),
            }
            if "ds_bytes" in ranks[0]:
                row["ds_save_gbps"] = (
                    ranks[0]["ds_bytes"] / max(r["ds_save_s"] for r in ranks) / 1e9
                )
                row["ds_load_gbps"] = (
                    ranks[0]["ds_bytes"] / max(r["ds_load_s"] for r in ranks) / 1e9
                )
                print(f"stage {stage}: DeepSpeed save {row['ds_save_gbps']:.2f} GB/s, load "
                      f"{row['ds_load_gbps']:.2f} GB/s", flush=True)  # fmt: skip
            record["stages"][stage] = row
            print(f"stage {stage}: {size / 1e9:.2f} GB; ours save {row['save_gbps']:.2f} GB/s "
                  f"({row['save_gbps'] / fl['write_gbps']:.0%} of floor), load "
                  f"{row['load_gbps']:.2f} GB/s ({row['load_gbps'] / fl['read_gbps']:.0%}); "
                  f"DCP save {row['dcp_save_gbps']:.2f} GB/s, load {row['dcp_load_gbps']:.2f} "
                  f"GB/s; {args.steps} steps' CPU: {row['cpu_plain_s']:.2f} s plain, "
                  f"{row['cpu_async_s']:.2f} s beside an async save "
                  f"({row['cpu_async_incl_wait_s']:.2f} s with its wait)", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
