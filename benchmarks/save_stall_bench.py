"""How long a checkpoint save stops training: ``save_checkpoint`` sync vs ``async_save=True``.

    python benchmarks/save_stall_bench.py [--rounds 3] [--world-size 2] [--stage 2] [--tiny]
        [--json out.json]

The benchmark GPT (examples/gpt.py ``bench_model``, 23.2M parameters, fp32, Adam) trains on
``--world-size`` gloo ranks, one thread each. Each round measures, for sync and then async:
three plain steps (the round's step time), then ``save_checkpoint`` followed by ``--after``
steps (3: long enough for a background write to finish). The **stall** is that save + those
steps minus as many median steps: the time training lost to the save, including what a
background write takes from the steps it runs beside (on CPU it competes for the same cores). Sync and async alternate in the same processes, so load from other work on the machine
hits both alike; judge the ratio, not the absolute seconds. Between measurements the async
save is waited for (untimed) and every checkpoint is removed (disk stays small).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _step(engine, step: int, shape) -> None:
    import torch

    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, shape["vocab"], (shape["micro"], shape["seq"]), generator=g)
    _, loss = engine(x, torch.roll(x, -1, 1))
    engine.backward(loss)
    engine.step()


def worker(args) -> None:
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    import runtime
    from examples.gpt import GPT, GPTConfig, bench_model

    if args.tiny:
        model = GPT(GPTConfig(vocab_size=97, n_layer=2, n_head=4, d_model=64, seq_len=32))
        shape = {"vocab": 97, "micro": 2, "seq": 32}
    else:
        model = bench_model()
        shape = {"vocab": 8192, "micro": 4, "seq": 128}
    world = int(os.environ["WORLD_SIZE"])
    config = {
        "train_micro_batch_size_per_gpu": shape["micro"],
        "gradient_accumulation_steps": 1,
        "train_batch_size": shape["micro"] * world,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": args.stage},
        "steps_per_print": 10**9,
    }
    engine, *_ = runtime.initialize(model=model, config=config)
    rank = engine.global_rank
    step = 0
    for _ in range(3):
        _step(engine, step, shape)
        step += 1
    rows = {"sync": [], "async": []}
    for r in range(args.rounds):
        for mode in ("sync", "async"):
            plain = []
            for _ in range(3):
                t = time.perf_counter()
                _step(engine, step, shape)
                step += 1
                plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            path = engine.save_checkpoint(args.dir, tag=f"{mode}{r}", async_save=mode == "async")
            returned = time.perf_counter() - t
            for _ in range(args.after):
                _step(engine, step, shape)
                step += 1
            total = time.perf_counter() - t
            in_flight = engine.checkpoint_saver.in_flight
            engine.wait_for_checkpoint()
            step_time = statistics.median(plain)
            rows[mode].append(
                {
                    "step": step_time,
                    "save_call": returned,
                    "stall": total - args.after * step_time,
                    "still_writing": float(in_flight),
                }
            )
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--after", type=int, default=3, help="steps timed after the save")
    parser.add_argument("--tiny", action="store_true", help="a 0.1M-parameter model (smoke)")
    parser.add_argument("--json", help="write the per-round numbers here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="save-stall-") as tmp:
        procs = []
        for rank in range(args.world_size):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(args.world_size),
                LOCAL_WORLD_SIZE=str(args.world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO),
            )
            cmd = [sys.executable, __file__, "--worker", "--dir", f"{tmp}/ckpt"]
            cmd += ["--out", f"{tmp}/rows.json", "--rounds", str(args.rounds)]
            cmd += ["--stage", str(args.stage), "--after", str(args.after)]
            cmd += ["--tiny"] if args.tiny else []
            procs.append(subprocess.Popen(cmd, env=env))
        for p in procs:
            if p.wait(timeout=1800):
                raise SystemExit(f"a rank exited with {p.returncode}")
        rows = json.loads(Path(f"{tmp}/rows.json").read_text())
    summary = {
        mode: {k: statistics.median(r[k] for r in rs) for k in ("step", "save_call", "stall")}
        for mode, rs in rows.items()
    }
    print(
        f"{args.world_size} ranks, stage {args.stage}, {args.rounds} rounds, {args.after} steps "
        "after each save (medians, seconds)"
    )
    print(f"{'':8}{'step':>10}{'save call':>12}{'stall':>10}")
    for mode, s in summary.items():
        print(f"{mode:8}{s['step']:>10.3f}{s['save_call']:>12.3f}{s['stall']:>10.3f}")
    ratio = summary["async"]["stall"] / summary["sync"]["stall"] if summary["sync"]["stall"] else 0
    print(f"async stall / sync stall: {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
