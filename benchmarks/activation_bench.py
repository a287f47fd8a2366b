"""Activation memory and recomputation cost: runtime.activation_checkpointing beside deepspeed.checkpointing.

The model is examples/gpt.py at a long sequence (default 1024 tokens). Each configuration runs
in fresh processes (peak RSS is per process) with one compute thread per process; the training
step is forward + backward of the language-model loss (no optimizer: its cost is the same in
every row). Per configuration:

* ``held``: bytes of the distinct tensor storages autograd holds between forward and backward,
  parameters excluded, found by walking the graph from the loss (every node's saved tensors,
  and every tensor a Python autograd Function keeps on its context, which is where DeepSpeed's
  CheckpointFunction keeps its inputs). Nothing is taken from either library's counters.
* ``blocks``: the part of ``held`` that the transformer blocks account for (``held`` minus the
  same measurement of the model with zero blocks: embeddings, final norm, head and loss).
* ``peak RSS`` of the process, and its growth over the RSS before the first step.
* ``step``: seconds of forward + backward, the fastest of ``--steps`` after one warm-up step
  (the least disturbed by other work on a shared host; the JSON has the median too).

Configurations: no checkpointing; every block checkpointed; + ``partition_activations`` over
a model-parallel group of 2 (two processes computing the same replicated model, as
tensor-parallel ranks compute identical block inputs); + ``cpu_checkpointing``. The last three
run with this runtime and with DeepSpeed (``DS_ACCELERATOR=cpu``).

    python benchmarks/activation_bench.py [--seq 1024] [--layers 4] [--d-model 256]
        [--batch 2] [--steps 3] [--frameworks zlaunch,deepspeed] [--json out.json]
        [--markdown out.md] [--device cpu|cuda]

``--device cuda`` (one GPU, one process) adds ``torch.cuda.memory_stats`` columns (peak
allocated, reserved-minus-allocated bytes: fragmentation, allocation retries) and runs every
block checkpointed to pinned host memory (the copies overlap compute only there) and into the
contiguous buffer (``contiguous_memory_optimization``) instead of the partitioned rows.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_utils import (  # noqa: E402
    current_rss_bytes,
    format_bytes,
    peak_rss_bytes,
    pin_threads,
)

# name -> (framework, world size, options)
CONFIGS = {
    "none": ("torch", 1, {}),
    "every block": ("{fw}", 1, {}),
    "every block + partition (MP 2)": ("{fw}", 2, {"partition": True}),
    "every block + partition + CPU": ("{fw}", 2, {"partition": True, "cpu": True}),
}
# One GPU: two ranks cannot share it under NCCL, so the GPU run keeps to one process. DeepSpeed
# asserts partition_activations with its contiguous buffer, so that row is this runtime's only.
CUDA_CONFIGS = {
    "none": ("torch", 1, {}),
    "every block": ("{fw}", 1, {}),
    "every block + CPU (pinned, async)": ("{fw}", 1, {"cpu": True}),
    "every block + contiguous": ("zlaunch", 1, {"contiguous": True}),
}


# --------------------------------------------------------------------------- measurement
def held_bytes(loss, params) -> int:
    """Distinct storages reachable from the autograd graph of ``loss``, parameters excluded."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def collect(value, depth=0):
        if depth > 4:
            return
        if torch.is_tensor(value):
            for t in (value, getattr(value, "saved_data", None)):  # DeepSpeed moves data here
                if torch.is_tensor(t) and t.untyped_storage().nbytes():
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in skip:
                        storages[ptr] = t.untyped_storage().nbytes()
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v, depth + 1)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v, depth + 1)

    nodes, stack = {}, [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node  # kept alive: ids stay unique during the walk
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    collect(getattr(node, name))
                except RuntimeError:
                    pass
        if hasattr(node, "saved_tensors"):
            try:
                collect(node.saved_tensors)
            except RuntimeError:
                pass
        collect(list(getattr(node, "__dict__", {}).values()))
        stack.extend(n for n, _ in node.next_functions)
    return sum(storages.values())


class Checkpointed:
    """Wraps a block's forward in a checkpoint function (keeps the block's parameter names)."""

    def __init__(self, forward, checkpoint):
        self.forward = forward
        self.checkpoint = checkpoint

    def __call__(self, x):
        return self.checkpoint(self.forward, x)


def worker(args) -> dict:
    pin_threads()
    import torch
    import torch.distributed as dist

    from examples.gpt import GPT, GPTConfig

    framework, world, opts = args.framework, args.world, json.loads(args.options)
    device = torch.device(args.device)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=world
    )
    from runtime.parallel_groups import ModelParallelGroups

    mpu = ModelParallelGroups(world)  # everything model-parallel: world 2 = one MP group of 2
    if framework == "zlaunch":
        import runtime.activation_checkpointing as ck

        ck.configure(
            mpu,
            partition_activations=opts.get("partition", False),
            checkpoint_in_cpu=opts.get("cpu", False),
            contiguous_checkpointing=opts.get("contiguous", False),
            num_checkpoints=args.layers,
        )
        checkpoint = ck.checkpoint
    elif framework == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if device.type == "cpu" else "cuda")
        import deepspeed

        deepspeed.init_distributed("gloo")  # DeepSpeed's comm layer over the group above
        deepspeed.checkpointing.configure(
            mpu,
            partition_activations=opts.get("partition", False),
            checkpoint_in_cpu=opts.get("cpu", False),
            contiguous_checkpointing=opts.get("contiguous", False),
            num_checkpoints=args.layers,
        )
        checkpoint = deepspeed.checkpointing.checkpoint
    else:
        checkpoint = None

    def build(layers):
        torch.manual_seed(0)
        cfg = GPTConfig(
            vocab_size=args.vocab,
            n_layer=max(layers, 1),
            n_head=args.heads,
            d_model=args.d_model,
            seq_len=args.seq,
        )
        model = GPT(cfg).to(device)
        if layers == 0:
            model.blocks = torch.nn.ModuleList()
        if checkpoint is not None:
            for block in model.blocks:
                block.forward = Checkpointed(block.forward, checkpoint)
        return model

    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    tgt = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)

    base = build(0)
    _, base_loss = base(idx, tgt)
    outside = held_bytes(base_loss, list(base.parameters()))
    del base, base_loss

    model = build(args.layers)
    params = list(model.parameters())
    rss_before = current_rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, held = [], None
    for step in range(args.steps + 1):
        start = time.perf_counter()
        _, loss = model(idx, tgt)
        if step == args.steps:
            held = held_bytes(loss, params)
        loss.backward()
        for p in params:
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - start)
    out = {
        "held": held,
        "blocks": held - outside,
        "step_s": min(times),  # the least disturbed step: the host is shared
        "step_median_s": statistics.median(times),
        "peak_rss": peak_rss_bytes(),
        "rss_growth": peak_rss_bytes() - rss_before,
    }
    if device.type == "cuda":
        stats = torch.cuda.memory_stats()
        out["cuda_peak_allocated"] = stats["allocated_bytes.all.peak"]
        out["cuda_reserved_minus_allocated"] = (
            stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
        )
        out["cuda_alloc_retries"] = stats["num_alloc_retries"]
    dist.destroy_process_group()
    return out


def timing_worker(args) -> dict:
    """Step times of no checkpointing, this runtime's and DeepSpeed's, interleaved round by
    round in one process, so that load from other work on the host hits all three alike."""
    pin_threads()
    import torch
    import torch.distributed as dist

    from examples.gpt import GPT, GPTConfig

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=0, world_size=1
    )
    import runtime.activation_checkpointing as ck

    variants = {"none": None, "zlaunch": ck.checkpoint}
    if "deepspeed" in args.frameworks:
        import deepspeed

        deepspeed.init_distributed("gloo")
        deepspeed.checkpointing.configure(None)
        variants["deepspeed"] = deepspeed.checkpointing.checkpoint
    torch.manual_seed(0)
    cfg = GPTConfig(args.vocab, args.layers, args.heads, args.d_model, args.seq)
    model = GPT(cfg)
    forwards = [block.forward for block in model.blocks]
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    tgt = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds + 1):
        for name, checkpoint in variants.items():
            for block, forward in zip(model.blocks, forwards, strict=True):
                block.forward = forward if checkpoint is None else Checkpointed(forward, checkpoint)
            start = time.perf_counter()
            _, loss = model(idx, tgt)
            loss.backward()
            model.zero_grad(set_to_none=True)
            if round_ > 0:
                times[name].append(time.perf_counter() - start)
    dist.destroy_process_group()
    return {name: {"min": min(t), "median": statistics.median(t)} for name, t in times.items()}


# --------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(args, framework: str, world: int, opts: dict) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world):
            mode = "--timing-worker" if framework == "timing" else "--worker"
            cmd = [sys.executable, __file__, mode, "--framework", framework]
            cmd += ["--rank", str(rank), "--world", str(world), "--port", str(port)]
            cmd += ["--options", json.dumps(opts), "--out", f"{tmp}/{rank}.json"]
            cmd += _shape_args(args)
            env = dict(os.environ, PYTHONPATH=str(REPO), DS_ACCELERATOR=args.ds_accelerator)
            # Large blocks from mmap, returned at free: RSS then follows live tensors instead
            # of glibc's high-water mark (its dynamic threshold keeps freed heap resident).
            env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=1200)
            if p.returncode:
                raise SystemExit(f"{framework} {opts} failed:\n{err[-3000:]}")
        return json.loads(Path(f"{tmp}/0.json").read_text())


def _shape_args(args) -> list[str]:
    return [
        "--seq", str(args.seq), "--layers", str(args.layers), "--d-model", str(args.d_model),
        "--heads", str(args.heads), "--vocab", str(args.vocab), "--batch", str(args.batch),
        "--steps", str(args.steps), "--device", args.device, "--rounds", str(args.rounds),
        "--frameworks", args.frameworks,
    ]  # fmt: skip


def markdown(args, rows: list[dict]) -> str:
    cuda = args.device == "cuda"
    head = (
        "| configuration | framework | held | in blocks | peak RSS | RSS growth | step | vs none |"
    )
    sep = "|---|---|---|---|---|---|---|---|"
    if cuda:
        head += " CUDA peak | reserved-allocated | retries |"
        sep += "---|---|---|"
    lines = [
        f"GPT (examples/gpt.py): {args.layers} layers, d_model {args.d_model}, {args.heads} "
        f"heads, vocab {args.vocab}, sequence {args.seq}, micro-batch {args.batch}; "
        f"device {args.device}; step = forward + backward, fastest of {args.steps} after 1 "
        "warm-up; one compute thread per process; large allocations mmap'd (RSS follows live "
        "memory).",
        "",
        head,
        sep,
    ]
    none = next(r for r in rows if r["config"] == "none")["step_s"]
    for r in rows:
        line = (
            f"| {r['config']} | {r['framework']} | {format_bytes(r['held'])} | "
            f"{format_bytes(r['blocks'])} | {format_bytes(r['peak_rss'])} | "
            f"{format_bytes(r['rss_growth'])} | {r['step_s']:.2f} s | "
            f"{r['step_s'] / none:.2f}x |"
        )
        if cuda:
            line += (
                f" {format_bytes(r['cuda_peak_allocated'])} | "
                f"{format_bytes(r['cuda_reserved_minus_allocated'])} | {r['cuda_alloc_retries']} |"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def timing_table(args, timing: dict | None) -> str:
    if not timing:
        return ""
    none = timing["none"]["min"]
    lines = [
        "",
        f"Step time, every block checkpointed, interleaved in one process ({args.rounds} rounds "
        "after 1 warm-up; fastest and median):",
        "",
        "| | fastest | median | recompute cost (fastest vs none) |",
        "|---|---|---|---|",
    ]
    for name, t in timing.items():
        lines.append(
            f"| {name} | {t['min']:.2f} s | {t['median']:.2f} s | {t['min'] / none - 1:+.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--frameworks", default="zlaunch,deepspeed")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved step-time rounds")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    # worker side
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timing-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.ds_accelerator = "cpu" if args.device == "cpu" else "cuda"
    if args.worker or args.timing_worker:
        result = timing_worker(args) if args.timing_worker else worker(args)
        if args.rank == 0:
            Path(args.out).write_text(json.dumps(result))
        return
    configs = CUDA_CONFIGS if args.device == "cuda" else CONFIGS
    rows = []
    for name, (framework, world, opts) in configs.items():
        for fw in [framework] if framework != "{fw}" else args.frameworks.split(","):
            result = run_config(args, fw, world, opts)
            rows.append({"config": name, "framework": fw, **result})
            print(f"{name:40s} {fw:10s} held {format_bytes(result['held']):>10s} "
                  f"step {result['step_s']:.2f} s", flush=True)  # fmt: skip
    timing = run_config(args, "timing", 1, {}) if args.device == "cpu" and args.rounds else None
    table = markdown(args, rows) + timing_table(args, timing)
    print(table)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "rows": rows, "interleaved": timing}, indent=1)
        )
    if args.markdown:
        Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
