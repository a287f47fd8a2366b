"""Train a small character-level GPT on the Python standard library's source.

    zlaunch --num-gpus 2 examples/train_gpt.py --config examples/configs/zero2.json

Written as a DeepSpeed script is (only the import differs): `runtime.initialize` wraps the model,
builds the optimizer, scheduler and distributed DataLoader from the config, and the loop is
forward / engine.backward(loss) / engine.step() for every micro batch. The config comes from
--config (or --deepspeed_config), else from ZLAUNCH_CONFIG, which `zlaunch --config` sets.
Rank 0 prints the loss (mean over the last optimizer steps' micro batches on rank 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

# The repository root, so that `examples` imports when this file is run as a script.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import runtime  # noqa: E402
from examples.data import VOCAB, CharDataset  # noqa: E402
from examples.gpt import GPT, GPTConfig  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        "--deepspeed_config",
        "--deepspeed-config",
        dest="config",
        help="DeepSpeed-style JSON/YAML config. Default: $ZLAUNCH_CONFIG.",
    )
    parser.add_argument(
        "--local_rank",
        "--local-rank",
        type=int,
        default=None,
        help="Accepted for DeepSpeed launchers; LOCAL_RANK is read from the env.",
    )
    parser.add_argument("--steps", type=int, default=300, help="Optimizer steps to train.")
    parser.add_argument("--print-every", type=int, default=10, help="Optimizer steps per line.")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--max-chars", type=int, default=1_000_000, help="Corpus size.")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per rank on CPU (default: cores / local ranks).",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = args.config or os.environ.get("ZLAUNCH_CONFIG")
    if not config:
        print(
            "train_gpt.py: give --config FILE (or run under zlaunch --config FILE)", file=sys.stderr
        )
        return 2
    if not torch.cuda.is_available():
        # Ranks sharing a CPU oversubscribe it with torch's default of one thread per core.
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_ranks))

    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = GPT(
        GPTConfig(
            vocab_size=len(VOCAB),
            n_layer=args.n_layer,
            n_head=args.n_head,
            d_model=args.d_model,
            seq_len=args.seq_len,
        )
    )
    dataset = CharDataset(args.seq_len, max_chars=args.max_chars)
    engine, _, loader, _ = runtime.initialize(
        model=model, model_parameters=model.parameters(), training_data=dataset, config=config
    )
    rank0 = engine.global_rank == 0
    if rank0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"GPT {params:,} parameters, {len(dataset):,} windows of {args.seq_len} chars, "
            f"world size {engine.world_size}, train batch {engine.train_batch_size()}, "
            f"device {engine.device}",
            flush=True,
        )

    losses: list[float] = []
    start = time.perf_counter()
    epoch = 0
    while engine.global_steps < args.steps:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # a new shuffle per pass over the data
        for x, y in loader:
            x, y = x.to(engine.device), y.to(engine.device)
            _, loss = engine(x, y)
            engine.backward(loss)
            before = engine.global_steps
            engine.step()
            losses.append(loss.item())
            stepped = engine.global_steps > before
            if rank0 and stepped and engine.global_steps % args.print_every == 0:
                elapsed = time.perf_counter() - start
                mean = sum(losses) / len(losses)
                print(
                    f"step {engine.global_steps:5d}  loss {mean:.4f}  lr {engine.get_lr()[0]:.2e}"
                    f"  {elapsed:6.1f}s",
                    flush=True,
                )
                losses.clear()
            elif stepped and engine.global_steps % args.print_every == 0:
                losses.clear()
            if engine.global_steps >= args.steps:
                break
        epoch += 1
    if rank0:
        print(
            f"done: {engine.global_steps} steps in {time.perf_counter() - start:.1f}s", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
