"""What the straggler scores cost: step time with each rank's busy clock and step_busy event on,
against off, side by side; and the controller's scoring per sample at 1,024 ranks.

Rank side: engines over the same process group train the same model, two with the busy clock
(runtime/observe/profiling/busy.py: a clock read per collective and the threads' run delays
read once a step, one event line per ten steps
written to a pipe that another process drains, as the agent does) and two without. They alternate in
rounds of ``--steps-per-round`` optimizer steps (order swapped every round) so that the
machine's load falls on both alike; the figures are the ratio of the median step times and the
median of the rounds' ratios, per rank. Controller side: `StragglerWatch.add` timed over
``--ranks`` ranks x 100 steps (one slow host among them), microseconds per sample. ``--floor``
leaves both pairs off: the difference the method reports between identical engines.

    python benchmarks/stragglers_cost.py [--world 2] [--rounds 200] [--steps-per-round 2]
        [--hidden 256] [--layers 4] [--batch 16] [--ranks 1024] [--floor] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from interleaved import QuietSink, free_port, mlp, rank_env, run_interleaved  # noqa: E402


def _drained_pipe() -> tuple[int, subprocess.Popen]:
    """A pipe's write end whose read end another process empties, as the agent does."""
    read, write = os.pipe()
    reader = subprocess.Popen(["cat"], stdin=read, stdout=subprocess.DEVNULL)
    os.close(read)
    return write, reader


def worker(rank: int, args, port: int, results) -> None:
    rank_env(rank, args.world, port)
    torch.set_num_threads(1)
    import runtime
    from runtime.observe.metrics import EventSink
    from runtime.observe.profiling.busy import BusyClock
    from zlaunch.wire import EVENTS_FD_ENV

    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2},
    }
    fd, reader = _drained_pipe()
    engines: dict[str, list] = {"off": [], "on": []}
    for name in ("off", "on", "on", "off"):  # creation order cancels a later engine's drift
        engine, *_ = runtime.initialize(model=mlp(args.hidden, args.layers), config=config)
        engine.step_metrics.sink = QuietSink()
        engine.step_metrics.busy_sink = None
        if name == "on" and not args.floor:  # what the engine does under zlaunch on CPU
            engine.insight.busy = BusyClock()
            engine.comm.stats.observer = engine.insight.busy
            engine.step_metrics.busy_sink = EventSink({EVENTS_FD_ENV: str(fd)})
        engines[name].append(engine)
    assert all(e.comm.stats.observer is None for e in engines["off"]), "engines share a counter"
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(rank))

    def step(engine) -> None:
        engine.backward(engine(x).pow(2).mean())
        engine.step()

    rounds = run_interleaved(engines, step, args.rounds, args.steps_per_round)
    results[rank] = rounds.summary("off", "on")
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    os.close(fd)
    reader.wait()


def controller_cost(ranks: int, steps: int = 100) -> float:
    """Microseconds per `StragglerWatch.add` over ``ranks`` ranks, 8 per host, one host slow."""
    from zlaunch.launcher.stragglers import StragglerWatch

    watch = StragglerWatch({r: f"node{r // 8:04d}" for r in range(ranks)})
    values = [0.1 * (1.5 if r < 8 else 1.0) * (1 + (r % 7) / 100) for r in range(ranks)]
    waits = [0.0 if r < 8 else 0.05 for r in range(ranks)]  # its peers wait for the slow host
    start = time.perf_counter()
    for step in range(steps):
        for rank in range(ranks):
            watch.add(rank, step, values[rank], waits[rank])
    elapsed = time.perf_counter() - start
    assert watch.slow and watch.slow[0].host == "node0000", "the benchmark's slow host unnamed"
    return elapsed / (ranks * steps) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--steps-per-round", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--floor", action="store_true", help="both pairs off: the method's noise floor")
    p.add_argument("--json")
    args = p.parse_args()
    per_sample = controller_cost(args.ranks)
    print(f"controller: {per_sample:.2f} us per sample at {args.ranks} ranks "
          f"({per_sample * args.ranks / 1e3:.2f} ms of controller time per step)")  # fmt: skip
    port = free_port()
    results = mp.Manager().dict()
    mp.spawn(worker, args=(args, port, results), nprocs=args.world, join=True)
    rows = []
    for rank in sorted(results):
        r = dict(results[rank])
        r["overhead_pct"] = 100.0 * (r["on"] / r["off"] - 1.0)
        rows.append({"rank": rank, **r})
        print(
            f"rank {rank}: median step {r['off'] * 1e3:.3f} ms off, {r['on'] * 1e3:.3f} ms on "
            f"({r['overhead_pct']:+.2f}%); median of the rounds' ratios "
            f"{100 * (r['median_round_ratio'] - 1):+.2f}% over {r['steps']} steps each"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "controller_us_per_sample": per_sample, "ranks": rows},
                      handle, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
