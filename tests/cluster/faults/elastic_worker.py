"""A training job whose data do not depend on the world size, for restarts on fewer hosts.

Step ``s`` trains on the same 6 rows at any world size: micro-step ``m`` of rank ``r`` takes row
``m * world + r`` (micro batch 1), so 3 ranks x 2 micro-steps and 2 ranks x 3 micro-steps see
the same global batch. The batch triple comes from the config (micro 1, accumulation 2 at 3
ranks) or, after zlaunch restarted the job on fewer hosts, from ZLAUNCH_BATCH. Every rank
appends each micro-step's loss to ``OUT/losses-<rank>.jsonl``; saves every ``--save-interval``
steps into $ZLAUNCH_CHECKPOINT_DIR (resumed from by zlaunch on a restart). ``--slow-rank R
--slow-sleep S --slow-factor F``: rank R spends S seconds and F times its own step more in
every step (a slow host; the factor keeps it slow by as much however loaded the machine is).
``--matmuls K``: every rank also multiplies two 256 x 256 matrices K times per step (a step
whose compute, not its collectives, takes most of the CPU, as a real model's does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

import runtime  # noqa: E402
from tests.integration.checkpoint.ckpt_worker import SEQ, VOCAB, make_model  # noqa: E402

ROWS = 6


def row(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, VOCAB, (ROWS, SEQ + 1), generator=g)[index : index + 1]
    return data[:, :-1], data[:, 1:]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-interval", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--slow-rank", type=int, default=-1, help="sleeps --slow-sleep more")
    parser.add_argument("--slow-sleep", type=float, default=0.0)
    parser.add_argument("--slow-factor", type=float, default=0.0, help="and F x its step more")
    parser.add_argument("--matmuls", type=int, default=0, help="256x256 products per step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine, *_ = runtime.initialize(model=make_model())
    rank, world = engine.global_rank, engine.world_size
    attempt = int(os.environ.get("ZLAUNCH_ATTEMPT", "0"))
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, f"losses-{rank}.jsonl"), "a")
    gas = engine.gradient_accumulation_steps()
    assert engine.train_batch_size() == ROWS, engine.train_batch_size()
    work = torch.randn(256, 256)
    while engine.global_steps < args.steps:
        started = time.perf_counter()
        step = engine.global_steps
        for m in range(gas):
            x, y = row(step, m * world + rank)
            _, loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            record = {"attempt": attempt, "world": world, "step": step + 1, "loss": loss.item()}
            log.write(json.dumps(record) + "\n")
            log.flush()
        for _ in range(args.matmuls):
            work = torch.tanh(work @ work)
        if args.save_interval and engine.global_steps % args.save_interval == 0:
            engine.save_checkpoint()
        slow = args.slow_sleep + args.slow_factor * (time.perf_counter() - started)
        time.sleep(args.step_sleep + (slow if rank == args.slow_rank else 0.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
