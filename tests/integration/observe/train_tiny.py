"""A tiny runtime training script for visibility tests.

Usage: ``python train_tiny.py OUT_DIR [--steps N] [--print-every K] [--sleep S] [--lines]
[--tensorboard DIR] [--slow-rank R --slow-sleep S --slow-factor F]``. It calls ``engine.log_metrics({"custom_value": 1.5})`` at step 3.
Each rank writes ``OUT_DIR/losses-<rank>.json``: the loss it computed at every optimizer step,
so a test can compare the controller's metrics.jsonl with what the script itself saw.
With ``--lines`` every rank prints a line per step (``rank R step S``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import runtime


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(ids[:, :-1]))
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--print-every", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --slow-sleep more")
    p.add_argument("--slow-sleep", type=float, default=0.0)
    # a slow rank in proportion to its own step: it stays slow by the same factor however
    # loaded the machine is (a fixed sleep is lost in a step that load made 10x longer)
    p.add_argument("--slow-factor", type=float, default=0.0, help="and F x its step more")
    p.add_argument("--lines", action="store_true")
    p.add_argument("--tensorboard", metavar="DIR", help="enable the tensorboard block, into DIR")
    args = p.parse_args()
    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "steps_per_print": args.print_every,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"warmup_num_steps": 3, "total_num_steps": args.steps, "warmup_max_lr": 0.01},
        },
    }
    if args.tensorboard:
        config["tensorboard"] = {
            "enabled": True,
            "output_path": args.tensorboard,
            "job_name": "tiny",
        }
    engine, _, _, _ = runtime.initialize(model=TinyLM(), config=config)
    rank = engine.global_rank
    gen = torch.Generator().manual_seed(100 + rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        step_losses = []
        for _ in range(engine.gradient_accumulation_steps()):
            ids = torch.randint(0, 32, (4, 9), generator=gen)
            loss = engine(ids)
            step_losses.append(loss.item())
            engine.backward(loss)
            engine.step()
        losses[step] = sum(step_losses) / len(step_losses)
        if args.lines:
            print(f"rank {rank} step {step} loss {losses[step]:.4f}", flush=True)
        if step == 3:
            engine.log_metrics({"custom_value": 1.5})
        slow = args.slow_sleep + args.slow_factor * (time.perf_counter() - started)
        time.sleep(args.sleep + (slow if rank == args.slow_rank else 0.0))
    with open(os.path.join(args.out_dir, f"losses-{rank}.json"), "w") as handle:
        json.dump(losses, handle)


if __name__ == "__main__":
    main()
