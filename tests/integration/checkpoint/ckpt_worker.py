"""A tiny deterministic training job for checkpoint tests, run by zlaunch or by mp_utils.

The global batch of step ``s`` depends only on ``s`` (each rank takes its slice), so runs at
different world sizes train on the same data and a resumed run sees exactly what an
uninterrupted one saw. As a script (under zlaunch) it trains to ``--steps``, saves every
``--save-interval`` steps into $ZLAUNCH_CHECKPOINT_DIR, can SIGKILL itself on attempt 0, and
records rank 0's per-step losses and the final parameters in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

import runtime  # noqa: E402
from examples.gpt import GPT, GPTConfig  # noqa: E402

VOCAB, SEQ, GLOBAL_BATCH = 48, 8, 8


def make_model(dropout: float = 0.0) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=16, seq_len=SEQ, dropout=dropout)
    )


def make_config(stage: int, world_size: int, extra: dict | None = None) -> dict:
    config = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {
            "type": "Adam",
            # eps 1e-4: Adam with a tiny eps turns float noise in near-zero gradients into
            # full-size steps, which makes runs at different world sizes differ by ~1e-4
            # whatever the checkpoint does; with 1e-4 that floor is ~3e-7.
            "params": {"lr": 0.01, "weight_decay": 0.01, "eps": 1e-4},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_num_steps": 8, "warmup_max_lr": 0.01, "warmup_type": "linear"},
        },
        # Small buckets: several flat groups, parameters cut across shard boundaries.
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 600,
            "allgather_bucket_size": 600,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": 600,
        },
    }
    for key, value in (extra or {}).items():
        if key == "zero_optimization":
            config["zero_optimization"].update(value)
        else:
            config[key] = value
    return config


def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=g)
    per = GLOBAL_BATCH // world_size
    mine = data[rank * per : (rank + 1) * per]
    return mine[:, :-1], mine[:, 1:]


def train_step(engine) -> float:
    x, y = batch(engine.global_steps, engine.global_rank, engine.world_size)
    _, loss = engine(x, y)
    engine.backward(loss)
    engine.step()
    return loss.item()


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered under stage 3: a collective, call on every rank)."""
    from runtime.zero import GatheredParameters

    with GatheredParameters(list(module.parameters())):
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


def build(stage: int, dropout: float = 0.0, extra: dict | None = None):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = make_config(stage, world, extra)
    engine, *_ = runtime.initialize(model=make_model(dropout), config=config)
    return engine


def scaler_state(engine) -> dict:
    return {"loss_scale": float(engine.loss_scale), "skipped_steps": engine.skipped_steps}


# ---------------------------------------------------------------------------- mp_utils targets
def save_then_continue(
    stage: int, save_dir: str, save_at: int, total: int, extra: dict | None = None
) -> dict:
    """Train to ``save_at``, save, train to ``total``; the live state at both points."""
    engine = build(stage, extra=extra)
    while engine.global_steps < save_at:
        train_step(engine)
    engine.save_checkpoint(save_dir)
    at_save = full_state(engine.module)
    scaler_at_save = scaler_state(engine)
    losses = [train_step(engine) for _ in range(total - save_at)]
    return {
        "at_save": at_save,
        "scaler_at_save": scaler_at_save,
        "final": full_state(engine.module),
        "losses": losses,
    }


def load_then_continue(
    stage: int,
    load_dir: str,
    total: int,
    resave_dir: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Load the latest checkpoint (optionally save it again at once), train to ``total``."""
    engine = build(stage, extra=extra)
    path, client = engine.load_checkpoint(load_dir)
    start = engine.global_steps
    scaler_at_load = scaler_state(engine)
    if resave_dir:
        engine.save_checkpoint(resave_dir)
    losses = [train_step(engine) for _ in range(total - start)]
    return {
        "path": path,
        "start": start,
        "scaler_at_load": scaler_at_load,
        "final": full_state(engine.module),
        "losses": losses,
    }


def error_cases(tmp: str) -> dict:
    """Loads that must fail cleanly, leaving the engine exactly as it was."""
    import json as _json
    import warnings

    from runtime.checkpoint import CheckpointError

    out: dict = {}
    engine = build(2)
    for _ in range(2):
        train_step(engine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["no_latest"] = engine.load_checkpoint(os.path.join(tmp, "empty"))
    out["no_latest_warning"] = [str(w.message) for w in caught]
    try:
        engine.save_checkpoint(os.path.join(tmp, "bad_client"), client_state={"f": open})
    except CheckpointError as err:
        out["client_error"] = str(err)
    out["bad_client_dir"] = sorted(os.listdir(tmp))

    good = os.path.join(tmp, "good")
    engine.save_checkpoint(good, client_state={"epoch": 1, "pos": (3, 4)})
    for _ in range(2):
        train_step(engine)
    before = full_state(engine.module)
    before_opt = {
        i: {k: v.clone() for k, v in s.items()}
        for i, s in enumerate(engine.optimizer.optimizer.state.values())
    }
    before_steps = engine.global_steps

    def unchanged() -> bool:
        now = full_state(engine.module)
        opt = list(engine.optimizer.optimizer.state.values())
        return (
            all(torch.equal(now[k], before[k]) for k in before)
            and all(torch.equal(opt[i][k], v) for i, s in before_opt.items() for k, v in s.items())
            and engine.global_steps == before_steps
        )

    tag_dir = os.path.join(good, "global_step2")
    manifest_path = os.path.join(tag_dir, "manifest.json")
    manifest = _json.load(open(manifest_path))
    name = next(iter(manifest["params"]))
    # 1. The shard's tensor header disagrees with the manifest (shape edited in both places
    #    consistently would be a different model): corrupt header, same size.
    shard = os.path.join(tag_dir, manifest["shards"][0]["file"])
    data = bytearray(open(shard, "rb").read())
    original = bytes(data)
    data[20:28] = b"\x00" * 8
    open(shard, "wb").write(bytes(data))
    try:
        engine.load_checkpoint(good)
    except CheckpointError as err:
        out["corrupt_error"] = str(err)
    out["corrupt_unchanged"] = unchanged()
    open(shard, "wb").write(original)
    # 2. A manifest whose parameter shape differs from the model's.
    edited = _json.loads(_json.dumps(manifest))
    edited["params"][name]["shape"] = list(reversed(edited["params"][name]["shape"])) + [1]
    _json.dump(edited, open(manifest_path, "w"))
    try:
        engine.load_checkpoint(good)
    except CheckpointError as err:
        out["shape_error"] = str(err)
    out["shape_unchanged"] = unchanged()
    _json.dump(manifest, open(manifest_path, "w"))
    # 3. A model with other parameter names.
    renamed = _json.loads(_json.dumps(manifest))
    renamed["params"]["extra.weight"] = renamed["params"].pop(name)
    for shard_rec in renamed["shards"]:
        shard_rec["pieces"] = [
            ["extra.weight" if p[0] == name else p[0], p[1], p[2]] for p in shard_rec["pieces"]
        ]
    _json.dump(renamed, open(manifest_path, "w"))
    try:
        engine.load_checkpoint(good)
    except CheckpointError as err:
        out["names_error"] = str(err)
    out["names_unchanged"] = unchanged()
    _json.dump(manifest, open(manifest_path, "w"))
    # 4. The intact checkpoint loads, client state and all.
    out["good"] = engine.load_checkpoint(good)
    out["good_steps"] = engine.global_steps
    out["name"] = name
    return out


# ---------------------------------------------------------------------------- script
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-interval", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-after-step", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("ZLAUNCH_ATTEMPT", "0"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pid-{rank}-attempt-{attempt}"), "w") as f:
        f.write(str(os.getpid()))
    engine = build(args.stage, args.dropout)
    if rank == 0:
        print(f"attempt {attempt} starts at step {engine.global_steps}", flush=True)
    log = open(os.path.join(args.out, "losses.jsonl"), "a") if rank == 0 else None
    while engine.global_steps < args.steps:
        loss = train_step(engine)
        step = engine.global_steps
        if log:
            log.write(json.dumps({"attempt": attempt, "step": step, "loss": loss}) + "\n")
            log.flush()
        if rank == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
        if args.save_interval and step % args.save_interval == 0:
            engine.save_checkpoint()
        if attempt == 0 and rank == args.kill_rank and step == args.kill_after_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    final = full_state(engine.module)
    if rank == 0:
        from safetensors.torch import save_file

        save_file(final, os.path.join(args.out, "final.safetensors"))
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
