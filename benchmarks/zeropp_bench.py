"""ZeRO++ beside plain stage 3: step time and bytes per collective kind, side by side.

    python benchmarks/zeropp_bench.py [--world-size 4] [--hpz 2] [--steps 12] [--warmup 2]
        [--precision fp32|bf16] [--d-model 256] [--layers 4] [--json out.json]

Every rank builds one engine per variant (plain stage 3, hpZ, qwZ, qgZ, all three) over the
same model (a stack of torch's TransformerEncoderLayer) and then steps them in turn, variant
after variant within each step, so machine noise falls on all of them alike. Reported per
variant: the median step time of rank 0 after warm-up, the median of its step-by-step ratio to
plain's step on the same data (the order of the variants rotates every step), and the bytes
per step by collective kind (the communicator's counters, the comms logger's numbers), those
sent inside the hpZ groups shown apart. Gloo on CPU, one compute thread per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

VARIANTS = ("plain", "hpz", "qwz", "qgz", "zeropp")


def zero_of(variant: str, hpz: int) -> dict:
    return {
        "plain": {},
        "hpz": {"zero_hpz_partition_size": hpz},
        "qwz": {"zero_quantized_weights": True},
        "qgz": {"zero_quantized_gradients": True},
        "zeropp": {
            "zero_hpz_partition_size": hpz,
            "zero_quantized_weights": True,
            "zero_quantized_gradients": True,
        },
    }[variant]


def _rank_main(rank: int, args, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(args.world_size),
        LOCAL_WORLD_SIZE=str(args.world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO))
    import runtime

    def model():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            args.d_model, 4, 2 * args.d_model, dropout=0.0, batch_first=True
        )
        return torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)

    engines = {}
    for v in VARIANTS:
        cfg = {
            "train_micro_batch_size_per_gpu": 4,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "stage3_max_reuse_distance": 0,
                **zero_of(v, args.hpz),
            },
        }
        if args.precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        engines[v], *_ = runtime.initialize(model=model(), config=cfg)
    times = {v: [] for v in VARIANTS}
    losses = {v: [] for v in VARIANTS}
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(4, 32, args.d_model, generator=g)
        # A different variant goes first each step (the machine's noise drifts).
        order = VARIANTS[step % len(VARIANTS) :] + VARIANTS[: step % len(VARIANTS)]
        for v in order:
            engine = engines[v]
            if step == args.warmup:
                engine.comm.stats.reset()
            engine.comm.barrier()
            t0 = time.perf_counter()
            loss = engine(x).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
            times[v].append(time.perf_counter() - t0)
            losses[v].append(loss.item())
    measured = args.steps - args.warmup
    result = {
        v: {
            "median_s": statistics.median(times[v][args.warmup :]),
            # Paired: this variant's step over plain's step of the same data, then the median.
            "median_ratio": statistics.median(
                t / p
                for t, p in zip(times[v][args.warmup :], times["plain"][args.warmup :], strict=True)
            ),
            "bytes": {k: b / measured for k, b in e.comm.stats.snapshot().items()},
            "hpz_group_bytes": {
                k: b / measured for (s, k), b in e.comm.stats.scoped.items() if s == "hpz"
            },
            "losses": losses[v],
        }
        for v, e in engines.items()
    }
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--hpz", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json")
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = args.json or "/tmp/zeropp_bench.json"
    mp.spawn(_rank_main, args=(args, port, out), nprocs=args.world_size)
    result = json.loads(Path(out).read_text())
    print(
        f"{args.world_size} ranks, hpZ groups of {args.hpz}, {args.precision}, "
        f"d_model {args.d_model} x {args.layers} layers, median of {args.steps - args.warmup}"
    )
    print(f"{'variant':8} {'step s':>8} {'x plain':>8}  bytes/step by kind (hpZ group apart)")
    for v, r in result.items():
        kinds = ", ".join(
            f"{k} {b / 1e6:.2f} MB"
            + (
                f" (hpZ group {r['hpz_group_bytes'][k] / 1e6:.2f})"
                if k in r["hpz_group_bytes"]
                else ""
            )
            for k, b in sorted(r["bytes"].items())
            if b >= 1000
        )
        print(f"{v:8} {r['median_s']:8.3f} {r['median_ratio']:8.2f}  {kinds}")


if __name__ == "__main__":
    main()
