"""Train a small character-level GPT on the Python standard library's source.

    zlaunch --num-gpus 2 examples/train_gpt.py --config examples/configs/zero2.json

Written as a DeepSpeed script is (only the import differs): `runtime.initialize` wraps the model,
builds the optimizer, scheduler and distributed DataLoader from the config, and the loop is
forward / engine.backward(loss) / engine.step() for every micro batch. The config comes from
--config (or --deepspeed_config), else from ZLAUNCH_CONFIG, which `zlaunch --config` sets.
Rank 0 prints the loss (mean over the last optimizer steps' micro batches on rank 0).

Checkpoints: --save-dir (default $ZLAUNCH_CHECKPOINT_DIR) with --save-interval N saves every N
optimizer steps and at the end; --resume loads the latest checkpoint there first (zlaunch
--resume does the same through the runtime). A resumed run continues the data where the saved
one stopped, so it reproduces the uninterrupted run's losses.
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
    add = parser.add_argument
    add(
        "--config",
        "--deepspeed_config",
        "--deepspeed-config",
        dest="config",
        help="DeepSpeed-style JSON/YAML config. Default: $ZLAUNCH_CONFIG.",
    )
    add(
        "--local_rank",
        "--local-rank",
        type=int,
        default=None,
        help="Accepted for DeepSpeed launchers; LOCAL_RANK is read from the env.",
    )
    add("--steps", type=int, default=300, help="Optimizer steps to train.")
    add("--print-every", type=int, default=10, help="Optimizer steps per loss line.")
    add("--n-layer", type=int, default=2)
    add("--n-head", type=int, default=4)
    add("--d-model", type=int, default=128)
    add("--seq-len", type=int, default=64)
    add("--max-chars", type=int, default=1_000_000, help="Corpus size in characters.")
    add("--seed", type=int, default=1234)
    add(
        "--threads",
        type=int,
        default=None,
        help="torch threads per rank on CPU (default: cores / local ranks).",
    )
    add(
        "--save-dir",
        default=os.environ.get("ZLAUNCH_CHECKPOINT_DIR"),
        help="Checkpoint directory. Default: $ZLAUNCH_CHECKPOINT_DIR.",
    )
    add(
        "--save-interval",
        type=int,
        default=0,
        help="Save every N optimizer steps (0: only at the end, when there is a --save-dir).",
    )
    add(
        "--resume",
        action="store_true",
        help="Load the latest checkpoint in --save-dir before training.",
    )
    args = parser.parse_args(argv)
    if (args.save_interval or args.resume) and not args.save_dir:
        parser.error("--save-interval and --resume need --save-dir (or $ZLAUNCH_CHECKPOINT_DIR)")
    return args


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
    params = sum(p.numel() for p in model.parameters())  # before stage 3 partitions them
    dataset = CharDataset(args.seq_len, max_chars=args.max_chars)
    engine, _, loader, _ = runtime.initialize(
        model=model, model_parameters=model.parameters(), training_data=dataset, config=config
    )
    rank0 = engine.global_rank == 0
    if rank0:
        print(
            f"GPT {params:,} parameters, {len(dataset):,} windows of {args.seq_len} chars, "
            f"world size {engine.world_size}, train batch {engine.train_batch_size()}, "
            f"device {engine.device}",
            flush=True,
        )
    if args.resume and engine.global_steps == 0:  # zlaunch --resume may have loaded it already
        path, _ = engine.load_checkpoint(args.save_dir)
        if rank0 and path is not None:
            print(f"resumed from {path} at step {engine.global_steps}", flush=True)
    if hasattr(engine, "set_total_steps"):
        engine.set_total_steps(args.steps)

    losses: list[float] = []
    start = time.perf_counter()
    # Where the data stands after the steps already taken (non-zero on resume): the sampler's
    # order depends only on the epoch, so skipping the consumed micro batches continues it.
    consumed = engine.global_steps * engine.gradient_accumulation_steps()
    epoch, skip = divmod(consumed, len(loader))
    while engine.global_steps < args.steps:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # a new shuffle per pass over the data
        for index, (x, y) in enumerate(loader):
            if index < skip:
                continue
            x, y = x.to(engine.device), y.to(engine.device)
            _, loss = engine(x, y)
            engine.backward(loss)
            before = engine.global_steps
            engine.step()
            losses.append(loss.item())
            if engine.global_steps == before:
                continue  # inside an accumulation window
            if engine.global_steps % args.print_every == 0:
                if rank0:
                    elapsed = time.perf_counter() - start
                    print(
                        f"step {engine.global_steps:5d}  loss {sum(losses) / len(losses):.4f}"
                        f"  lr {engine.get_lr()[0]:.2e}  {elapsed:6.1f}s",
                        flush=True,
                    )
                losses.clear()
            done = engine.global_steps >= args.steps
            if args.save_dir and (
                done or (args.save_interval and engine.global_steps % args.save_interval == 0)
            ):
                path = engine.save_checkpoint(args.save_dir)
                if rank0:
                    print(f"saved {path}", flush=True)
            if done:
                break
        epoch, skip = epoch + 1, 0
    if rank0:
        print(
            f"done: {engine.global_steps} steps in {time.perf_counter() - start:.1f}s", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
