"""The device check's speed and memory items: activation checkpointing, torch.compile at every
stage, and step time / MFU against plain torch (see gpu_check.py)."""

from __future__ import annotations

import time

import torch
from gpu_check_items import (
    Ctx,
    engine_config,
    gpt,
    item,
    max_rel_dev,
    small_gpt,
    token_batches,
)

__all__: list[str] = []


# ---------------------------------------------------------------------------- checkpointing
class _Checkpointed(torch.nn.Module):
    def __init__(self, block, checkpoint):
        super().__init__()
        self.block = block
        self.checkpoint = checkpoint

    def forward(self, x):
        return self.checkpoint(self.block, x)


def _fwd_bwd(ctx: Ctx, mode: str, batch: int, seq: int):
    """Peak memory above the model of one forward + backward, and the gradients."""
    import runtime.activation_checkpointing as ac

    model = small_gpt(ctx.repo, seed=3, n_layer=6, d_model=256, n_head=8, seq_len=seq, dropout=0.1)
    model.to(ctx.device)
    if mode != "none":
        ac.configure(None, partition_activations=True, checkpoint_in_cpu=(mode == "cpu"))
        model.blocks = torch.nn.ModuleList(_Checkpointed(b, ac.checkpoint) for b in model.blocks)
    x, y = (t.to(ctx.device) for t in token_batches(1, batch, seq, 256, seed=9)[0])
    cuda = ctx.cuda
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(42)  # dropout: the same masks in every mode
    if cuda:
        torch.cuda.manual_seed(42)
    began = time.perf_counter()
    _, loss = model(x, y)
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return peak, seconds, grads, float(loss)


@item("activation_ckpt")
def activation_ckpt(ctx: Ctx) -> dict:
    batch, seq = (8, 1024) if ctx.cuda else (2, 128)
    results = {}
    for mode in ("none", "gpu", "cpu"):
        _fwd_bwd(ctx, mode, batch, seq)  # warm-up (kernels, allocator)
        peak, seconds, grads, loss = _fwd_bwd(ctx, mode, batch, seq)
        results[mode] = (peak, seconds, grads)
        ctx.progress.add(mode=mode, peak=peak, seconds=seconds, loss=loss)
    ref = results["none"][2]
    worst = 0.0
    for mode in ("gpu", "cpu"):
        for a, b in zip(results[mode][2], ref, strict=True):
            scale = float(b.abs().max()) or 1.0
            worst = max(worst, float((a - b).abs().max()) / scale)
    same = worst <= 1e-5
    if not ctx.cuda:
        return {"status": "ok" if same else "fail",
                "figure": f"CPU: recomputed gradients within {worst:.1e} of plain (dropout 0.1)"}  # fmt: skip
    none, gpu, cpu = (results[m][0] for m in ("none", "gpu", "cpu"))
    t0 = results["none"][1]
    figure = (
        f"peak above weights {none / 2**20:.0f} MiB -> {gpu / 2**20:.0f} MiB checkpointed "
        f"({1 - gpu / none:.0%} saved), {cpu / 2**20:.0f} MiB with CPU checkpointing "
        f"({1 - cpu / none:.0%}); time x{results['gpu'][1] / t0:.2f} / x{results['cpu'][1] / t0:.2f}; "
        f"gradients within {worst:.1e} of plain (dropout 0.1, the RNG replayed)"
    )
    ok = same and gpu < none and cpu <= gpu
    return {"status": "ok" if ok else "fail", "figure": figure}


# ---------------------------------------------------------------------------- compile
def _run_compiled(ctx: Ctx, stage: int, compiled: dict | None, steps: int):
    import runtime
    from runtime.engine.torch_compile import CompileCounts

    cfg = engine_config(stage, "bf16", 8)
    if compiled is not None:
        cfg["compile"] = {"enabled": True, **compiled}
    before = CompileCounts.now()
    engine, *_ = runtime.initialize(model=small_gpt(ctx.repo, seed=4), config=cfg)
    losses, times = [], []
    for x, y in token_batches(steps, 8, 64, 256, seed=6):
        began = time.perf_counter()
        _, loss = engine(x.to(ctx.device), y.to(ctx.device))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - began)
    after = CompileCounts.now()
    steady = sorted(times[2:])[len(times[2:]) // 2]
    return (
        losses,
        times[0],
        steady,
        after.graphs - before.graphs,
        after.graph_breaks - before.graph_breaks,
    )


@item("compile")
def compile_(ctx: Ctx) -> dict:
    steps = 8
    cases = [(s, {}) for s in range(4)]
    if ctx.cuda:
        cases.append((0, {"kwargs": {"mode": "reduce-overhead"}}))  # CUDA graphs
    bad, parts = [], []
    for stage, extra in cases:
        eager, _, eager_s, _, _ = _run_compiled(ctx, stage, None, steps)
        got, first_s, steady_s, graphs, breaks = _run_compiled(ctx, stage, extra, steps)
        d = max_rel_dev(got, eager)
        label = f"s{stage}" + ("+cudagraphs" if extra else "")
        ctx.progress.add(case=label, max_rel_dev=d, first_step_s=first_s, steady_s=steady_s,
                         eager_s=eager_s, graphs=graphs, graph_breaks=breaks)  # fmt: skip
        parts.append(f"{label} {graphs}g/{breaks}b dev {d:.0e} x{steady_s / eager_s:.2f}")
        if d > 2e-2 or graphs == 0:
            bad.append(label)
    figure = "graphs/breaks, loss dev vs eager, steady step vs eager: " + "; ".join(parts)
    if bad:
        figure += "; not compiled or off: " + ", ".join(bad)
    return {"status": "fail" if bad else "ok", "figure": figure}


# ---------------------------------------------------------------------------- step time
def _flops_per_step(config, tokens: int) -> float:
    """Training FLOPs: 6 x (matmul parameters, the tied head counted) per token, plus the
    attention scores and values (12 x layers x d_model x sequence per token)."""
    L, d, V, T = config.n_layer, config.d_model, config.vocab_size, config.seq_len
    return tokens * (6 * (12 * L * d * d + V * d) + 12 * L * d * T)


def _time_steps(step, warmup: int, steps: int, cuda: bool) -> float:
    """Median seconds of a step; on CUDA from events (no host sync inside the timed steps)."""
    for _ in range(warmup):
        step()
    if not cuda:
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        return sorted(times)[len(times) // 2]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    times = sorted(events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps))
    return times[len(times) // 2]


def _torch_step(model, x, y):
    """Plain torch: autocast bf16 over fp32 weights, fused AdamW on CUDA, clipping."""
    cuda = x.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if cuda else None)

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _engine_step(engine, x, y):
    def step():
        _, loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    return step


@item("step_time")
def step_time(ctx: Ctx) -> dict:
    import runtime
    from runtime.observe.profiling.peak import resolve_peak

    g = gpt(ctx.repo)
    batch = 32 if ctx.cuda else 2
    x, y = (t.to(ctx.device) for t in token_batches(1, batch, 128, 8192, seed=2)[0])
    warmup, steps = (5, 20) if ctx.cuda else (1, 3)

    torch.manual_seed(0)
    plain = _time_steps(_torch_step(g.bench_model().to(ctx.device), x, y), warmup, steps, ctx.cuda)
    results = {"torch (autocast bf16)": plain}
    ctx.progress.add(run="torch", step_s=plain)
    for stage in (0, 3):
        engine, *_ = runtime.initialize(
            model=g.bench_model(), config=engine_config(stage, "bf16", batch)
        )
        seconds = _time_steps(_engine_step(engine, x, y), warmup, steps, ctx.cuda)
        results[f"stage {stage}"] = seconds
        ctx.progress.add(run=f"stage {stage}", step_s=seconds)
        del engine
    flops = _flops_per_step(g.bench_model().config, batch * 128)
    peak = resolve_peak(ctx.device, torch.bfloat16)
    parts = []
    for name, seconds in results.items():
        mfu = flops / seconds / 1e12 / peak.tflops if peak.tflops else None
        parts.append(
            f"{name} {seconds * 1e3:.1f} ms" + (f" (MFU {mfu:.0%})" if mfu is not None else "")
        )
    ratios = ", ".join(
        f"{k} x{v / plain:.2f}" for k, v in results.items() if k != "torch (autocast bf16)"
    )
    figure = f"GPT 23.2M, {batch}x128 tokens: " + ", ".join(parts) + f"; vs torch: {ratios}"
    figure += f"; peak {peak.tflops:g} TFLOP/s ({peak.source})" if peak.tflops else ""
    return {"status": "ok", "figure": figure, "details": {"seconds": results, "flops": flops}}
