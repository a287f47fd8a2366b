"""The device check's training items: stages 0-3 against torch, fp16 loss scaling, the two
seed configs of examples/configs, and CUDA memory against the ledger (see gpu_check.py)."""

from __future__ import annotations

import json
import time

import torch
from gpu_check_items import (
    Ctx,
    engine_config,
    engine_losses,
    item,
    max_rel_dev,
    reference_losses,
    small_gpt,
    token_batches,
)

__all__ = ["ds_loss_scale_rule"]

# Largest relative deviation of a step's loss from plain torch allowed "to rounding": fp32
# runs the same kernels (only the order of a few sums differs); 16-bit weights round the
# masters, so one ulp of bf16 (2^-8) or fp16 (2^-11) in a weight moves the loss by about that.
BOUNDS = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 5e-3}
STEPS, MICRO, SEQ = 6, 8, 64


@item("stages")
def stages(ctx: Ctx) -> dict:
    dev = ctx.device
    batches = token_batches(STEPS, MICRO, SEQ, 256)
    precisions = ["fp32", "bf16", "fp16"] if ctx.cuda else ["fp32", "bf16"]
    worst: dict[str, float] = {}
    failed = []
    for precision in precisions:
        ref = reference_losses(lambda: small_gpt(ctx.repo), precision, batches, dev)
        for stage in range(4):
            cfg = engine_config(stage, precision, MICRO)
            got, _ = engine_losses(lambda: small_gpt(ctx.repo), cfg, batches, dev)
            d = max_rel_dev(got, ref)
            ctx.progress.add(precision=precision, stage=stage, max_rel_dev=d, losses=got, ref=ref)
            worst[precision] = max(worst.get(precision, 0.0), d)
            if not d <= BOUNDS[precision]:
                failed.append(f"{precision} stage {stage}: {d:.1e}")
    figure = ", ".join(f"{p} {worst[p]:.1e} (bound {BOUNDS[p]:.0e})" for p in precisions)
    figure = f"max rel. loss deviation over stages 0-3: {figure}"
    if not ctx.cuda:
        figure += "; fp16 not on CPU"
    if failed:
        figure += "; over the bound: " + ", ".join(failed)
    return {"status": "fail" if failed else "ok", "figure": figure, "details": {"bounds": BOUNDS}}


# ---------------------------------------------------------------------------- fp16 scaling
def ds_loss_scale_rule(overflows: list[bool], *, init: float, window: int, hysteresis: int,
                       min_scale: float, consecutive: bool = False) -> list[tuple[float, bool]]:  # fmt: skip
    """DeepSpeed's DynamicLossScaler, step by step: (scale after the step, step skipped).

    On overflow: halve (not below the minimum) when the hysteresis counter is at 1, else
    count it down; the step is skipped. Without overflow: with consecutive hysteresis the
    counter resets at once; once a multiple of ``window`` clean steps have passed since the
    last overflow (not counting the step right after it), the scale doubles (and, without
    consecutive hysteresis, the counter resets then). tests/unit/test_gpu_check.py holds this
    against DeepSpeed's own DynamicLossScaler."""
    scale, counter, last_overflow, out = init, hysteresis, -1, []
    for it, overflow in enumerate(overflows):
        if overflow:
            if hysteresis == 1 or counter == 1:
                scale = max(scale / 2, min_scale)
            else:
                counter -= 1
            last_overflow = it
        else:
            if consecutive:
                counter = hysteresis
            stable = it - last_overflow - 1  # clean steps before this one since the overflow
            if stable > 0 and stable % window == 0:
                if not consecutive:
                    counter = hysteresis
                scale *= 2
        out.append((scale, overflow))
    return out


@item("fp16_scaling")
def fp16_scaling(ctx: Ctx) -> dict:
    if not ctx.cuda:
        return {
            "status": "skipped",
            "figure": "skipped: fp16 needs CUDA",
            "reason": "fp16 needs CUDA",
        }
    import runtime

    overflow_at = {2, 3, 7, 8, 9}
    steps = 14
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 3,
            "hysteresis": 2, "min_loss_scale": 1}  # fmt: skip
    want = ds_loss_scale_rule([i in overflow_at for i in range(steps)], init=2.0**8, window=3,
                              hysteresis=2, min_scale=1.0)  # fmt: skip
    batches = token_batches(steps, MICRO, SEQ, 256)
    results = {}
    for stage in (2, 3):
        cfg = engine_config(stage, "fp32", MICRO, fp16=fp16)
        engine, *_ = runtime.initialize(model=small_gpt(ctx.repo), config=cfg)
        got, frozen_ok = [], True
        for i, (x, y) in enumerate(batches):
            before = _first_shard(engine)
            _, loss = engine(x.to(ctx.device), y.to(ctx.device))
            if i in overflow_at:
                loss = loss * float("inf")  # every gradient becomes inf/nan: an overflow
            skipped_before = engine.skipped_steps
            engine.backward(loss)
            engine.step()
            skipped = engine.skipped_steps > skipped_before
            if skipped and not torch.equal(before, _first_shard(engine)):
                frozen_ok = False  # a skipped step changed the weights
            got.append((float(engine.loss_scale), skipped))
        results[stage] = got
        ctx.progress.add(stage=stage, got=got, want=want, weights_kept_on_skip=frozen_ok)
        if got != want or not frozen_ok:
            return {"status": "fail", "figure": f"stage {stage}: scales/skips {got} != DeepSpeed's {want}",
                    "details": {"got": results, "want": want}}  # fmt: skip
    scales = [s for s, _ in want]
    skipped = [i for i, (_, k) in enumerate(want) if k]
    return {
        "status": "ok",
        "figure": f"stages 2 and 3: skipped steps {skipped}, scale {scales[0]:g} .. "
        f"{min(scales):g} .. {scales[-1]:g} ({len(want)} steps) exactly as DeepSpeed's rules; "
        "weights unchanged on every skipped step",
        "details": {"want": want},
    }


def _first_shard(engine) -> torch.Tensor:
    """A copy of the first optimizer master (changes exactly when a step is applied)."""
    return engine.optimizer.master[0].detach().clone()


# ---------------------------------------------------------------------------- seed configs
def _seed_config(ctx: Ctx, name: str, drop_offload: bool) -> dict:
    cfg = json.loads((ctx.repo / "examples" / "configs" / name).read_text())
    cfg["steps_per_print"] = 10_000
    if drop_offload:
        zero = cfg["zero_optimization"]
        zero.pop("offload_optimizer", None)
        zero.pop("offload_param", None)
    if not ctx.cuda and "fp16" in cfg:
        cfg.pop("fp16")
        cfg["bf16"] = {"enabled": True}
    return cfg


def _train_seed(ctx: Ctx, name: str, drop_offload: bool, steps: int) -> dict:
    import runtime

    cfg = _seed_config(ctx, name, drop_offload)
    micro = cfg["train_micro_batch_size_per_gpu"]
    gas = cfg.get("gradient_accumulation_steps", 1)
    engine, *_ = runtime.initialize(model=small_gpt(ctx.repo), config=cfg)
    batches = token_batches(steps * gas, micro, SEQ, 256, seed=5)
    losses, times = [], []
    for s in range(steps):
        began = time.perf_counter()
        total = 0.0
        for x, y in batches[s * gas : (s + 1) * gas]:
            _, loss = engine(x.to(ctx.device), y.to(ctx.device))
            engine.backward(loss)
            engine.step()
            total += float(loss.detach())
        times.append(time.perf_counter() - began)
        losses.append(total / gas)
    sharding = engine.sharding
    masters = engine.optimizer.master
    store = getattr(sharding, "store", None)
    return {
        "losses": losses,
        "step_s": sorted(times[2:])[len(times[2:]) // 2] if len(times) > 2 else times[-1],
        "skipped": engine.skipped_steps,
        "loss_scale": float(engine.loss_scale),
        "master_device": str(masters[0].device),
        "masters_pinned": all(m.is_pinned() for m in masters) if masters[0].device.type == "cpu" else None,
        "store_device": str(store.data.device) if store is not None else None,
        "store_pinned": store.data.is_pinned() if store is not None and store.data.device.type == "cpu" else None,
        "resolved": {k: getattr(engine.config.zero_optimization, k) for k in (
            "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")},
    }  # fmt: skip


def _seed_item(ctx: Ctx, name: str, what: str, pinned_keys: tuple[str, ...]) -> dict:
    steps = 25
    off = _train_seed(ctx, name, drop_offload=False, steps=steps)
    ctx.progress.add(run="offload", **off)
    on_gpu = _train_seed(ctx, name, drop_offload=True, steps=steps)
    ctx.progress.add(run="no offload", **on_gpu)
    d = max_rel_dev(off["losses"], on_gpu["losses"])
    falls = off["losses"][-1] < 0.8 * off["losses"][0]
    pinned = all(off[k] for k in pinned_keys) if ctx.cuda else True
    ok = falls and pinned and d <= 2e-2
    figure = (
        f"{what}: loss {off['losses'][0]:.3f} -> {off['losses'][-1]:.3f} in {steps} steps "
        f"({off['skipped']} skipped, scale {off['loss_scale']:g}); vs no offload max rel. dev "
        f"{d:.1e}; step {off['step_s'] * 1e3:.0f} ms vs {on_gpu['step_s'] * 1e3:.0f} ms without offload"
    )
    if ctx.cuda:
        figure += f"; pinned: {', '.join(f'{k}={off[k]}' for k in pinned_keys)}"
    if not falls:
        figure += "; the loss did not fall"
    return {"status": "ok" if ok else "fail", "figure": figure, "details": {"max_rel_dev": d}}


@item("seed_stage2")
def seed_stage2(ctx: Ctx) -> dict:
    return _seed_item(ctx, "zero2_fp16.json", "stage 2 fp16, CPU optimizer", ("masters_pinned",))


@item("seed_stage3")
def seed_stage3(ctx: Ctx) -> dict:
    out = _seed_item(
        ctx, "zero3_offload.json", "stage 3, CPU optimizer + parameters",
        ("masters_pinned", "store_pinned"),
    )  # fmt: skip
    resolved = ctx.progress.parts[0]["resolved"]
    out["figure"] += "; auto -> " + ", ".join(f"{k} {v:,}" for k, v in resolved.items())
    return out


# ---------------------------------------------------------------------------- memory
@item("memory")
def memory(ctx: Ctx) -> dict:
    if not ctx.cuda:
        return {"status": "skipped", "figure": "skipped: CUDA memory counters", "reason": "no CUDA"}
    import gc

    from gpu_check_items import gpt

    import runtime
    from runtime.zero.estimator import model_state_bytes

    g = gpt(ctx.repo)
    psi = g.count_parameters(g.bench_model().config)
    rows, over = [], []
    for stage, offload in ((0, "none"), (1, "none"), (2, "none"), (3, "none"),
                           (2, "optimizer"), (3, "all")):  # fmt: skip
        zero = {"stage": stage}
        if offload != "none":
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if offload == "all":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        cfg = engine_config(stage, "bf16", 8, zero_optimization=zero)
        gc.collect()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        engine, *_ = runtime.initialize(model=g.bench_model(), config=cfg)
        x, y = token_batches(1, 8, 128, 8192)[0]
        for _ in range(2):
            _, loss = engine(x.cuda(), y.cuda())
            engine.backward(loss)
            engine.step()
        del loss
        torch.cuda.synchronize()
        states = torch.cuda.memory_allocated() - base
        peak = torch.cuda.max_memory_allocated() - base
        ledger, _ = model_state_bytes(psi, 1, stage, "bf16", offload)
        row = {"stage": stage, "offload": offload, "measured": states, "peak": peak,
               "ledger": ledger, "ratio": states / ledger if ledger else None}  # fmt: skip
        rows.append(ctx.progress.add(**row))
        # The ledger plus the static buckets (at most one bucket of each kind: 2 bytes x the
        # model here) is the bound; offloaded stage 3 keeps the live units and persistent ones.
        bound = (ledger or 0) + 2 * 2 * psi + 64 * 2**20
        if states > bound:
            over.append(f"stage {stage} {offload}")
        del engine
    parts = ", ".join(
        f"s{r['stage']}{'+' + r['offload'] if r['offload'] != 'none' else ''} "
        f"{r['measured'] / psi:.1f}B/psi" + (f" ({r['ratio']:.2f}x)" if r["ratio"] else "")
        for r in rows
    )
    figure = f"psi {psi / 1e6:.1f}M, bf16 Adam, N=1, ledger 16 B/psi: {parts}"
    if over:
        figure += "; over the ledger + buckets: " + ", ".join(over)
    return {"status": "fail" if over else "ok", "figure": figure, "details": {"psi": psi}}
