"""What seeing inside a step costs: step time with every step-insight block on, against none.

Engines over the same process group train the same model side by side: two with no
profiling block, two with ``wall_clock_breakdown``, ``comms_logger``, ``flops_profiler``
(its profile step is during warm-up), ``csv_monitor`` and, when wandb is installed,
``wandb`` in offline mode. They alternate in rounds of ``--steps-per-round`` optimizer steps
(order swapped every round) so that the machine's load falls on both alike; the figures are
the ratio of the median step times and the median of the rounds' ratios, per rank, and the
overhead is reported for rank 0 and the worst rank. The CPU time this process spent per step
(``time.process_time``, gloo's threads included, waiting excluded) is reported beside it: on a
shared machine it moves far less with other jobs' load than wall time does. `--blocks none` measures the two
engines' difference with nothing enabled (the noise floor of the method). Reports run at the default ``steps_per_print`` (10) so their gathers are counted.

    python benchmarks/insight_overhead.py [--world 2] [--rounds 300] [--steps-per-round 2]
        [--hidden 512] [--layers 4] [--batch 16] [--stage 2] [--json out.json]

On CUDA (``--device cuda``, one process per GPU) ``wall_clock_breakdown`` and
``comms_logger`` synchronize the device at phase edges and collectives, as DeepSpeed's do;
expect more there than on CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from interleaved import QuietSink, free_port, mlp, rank_env, run_interleaved  # noqa: E402


def configs(args, out: str) -> tuple[dict, dict]:
    base = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": args.stage},
    }
    blocks = {
        "wall_clock_breakdown": True,
        "comms_logger": {"enabled": True},
        "flops_profiler": {"enabled": True, "profile_step": 2, "output_file": f"{out}/flops.txt"},
        "csv_monitor": {"enabled": True, "output_path": out, "job_name": "bench"},
    }
    chosen = set(args.blocks.split(",")) if args.blocks != "all" else set(blocks) | {"wandb"}
    full = dict(base, **{k: v for k, v in blocks.items() if k in chosen})
    if "wandb" in chosen and importlib.util.find_spec("wandb") is not None:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", out)
        os.environ.setdefault("WANDB_SILENT", "true")
        full["wandb"] = {"enabled": True, "project": "insight-overhead"}
    return base, full


def worker(rank: int, args, port: int, out: str, results) -> None:
    rank_env(rank, args.world, port)
    torch.set_num_threads(args.threads)
    import runtime

    base, full = configs(args, out)
    # Four engines created none, all, all, none: an engine created later can run a little
    # slower or faster (stage 3 measured 3-4% for the second of two identical engines), and
    # this order cancels that to first order.
    engines: dict[str, list] = {"none": [], "all": []}
    for name, cfg in (("none", base), ("all", full), ("all", full), ("none", base)):
        engine, *_ = runtime.initialize(model=mlp(args.hidden, args.layers), config=cfg)
        engine.step_metrics.sink = QuietSink()
        engines[name].append(engine)
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(rank))

    def step(engine) -> None:
        engine.backward(engine(x).pow(2).mean())
        engine.step()

    rounds = run_interleaved(engines, step, args.rounds, args.steps_per_round)
    results[rank] = rounds.summary("none", "all")
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--steps-per-round", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--blocks",
        default="all",
        help="comma list of the blocks to enable (wall_clock_breakdown, comms_logger, "
        "flops_profiler, csv_monitor, wandb), or all",
    )
    p.add_argument("--json")
    args = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="insight-") as out:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(worker, args=(args, port, out, results), nprocs=args.world, join=True)
        results = dict(results)
    rows = []
    for rank in sorted(results):
        r = results[rank]
        overhead = 100.0 * (r["all"] / r["none"] - 1.0)
        rows.append({"rank": rank, **r, "overhead_pct": overhead})
        print(
            f"rank {rank}: median step {r['none'] * 1e3:.2f} ms without, {r['all'] * 1e3:.2f} ms "
            f"with every block ({overhead:+.2f}%); means {r['mean_none'] * 1e3:.2f} / "
            f"{r['mean_all'] * 1e3:.2f} ms over {r['steps']} steps each; median of the rounds' "
            f"ratios {100 * (r['median_round_ratio'] - 1):+.2f}%; CPU time per step (median) "
            f"{r['cpu_none'] * 1e3:.2f} / {r['cpu_all'] * 1e3:.2f} ms "
            f"({100 * (r['cpu_all'] / r['cpu_none'] - 1):+.2f}%)"
        )
    print(
        f"overhead: rank 0 {rows[0]['overhead_pct']:+.2f}%, worst rank "
        f"{max(r['overhead_pct'] for r in rows):+.2f}%; rounds' median ratio: worst rank "
        f"{100 * (max(r['median_round_ratio'] for r in rows) - 1):+.2f}% ({args.world} ranks, "
        f"stage {args.stage}, {args.layers}x{args.hidden} MLP, batch {args.batch}, blocks "
        f"{args.blocks})"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "ranks": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
