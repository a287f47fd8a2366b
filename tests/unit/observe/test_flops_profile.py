"""The flops profile in DeepSpeed's terms: forward FLOPs and MACs per module, backward FLOPs,
against the formula and against DeepSpeed's own profiler (no process group, no engine)."""

from __future__ import annotations

import pytest
import torch

from runtime.observe.profiling.flops import ModuleProfile, StepTimes, format_table

BATCH, WIDTHS = 8, (32, 64, 48, 16)
LAYERS = list(zip(WIDTHS[:-1], WIDTHS[1:], strict=True))  # (in, out) of each Linear


def linear_stack() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(i, o) for i, o in LAYERS))


def profiled(model: torch.nn.Module, micro_batches: int = 1) -> ModuleProfile:
    profile = ModuleProfile(model)
    with profile:
        for _ in range(micro_batches):
            model(torch.randn(BATCH, WIDTHS[0])).sum().backward()
    return profile


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_forward_flops_of_a_linear_stack_are_2_batch_in_out_per_layer(micro_batches):
    rows = {r.name: r for r in profiled(linear_stack(), micro_batches).rows()}
    total_fwd = 0
    for index, (i, o) in enumerate(LAYERS):
        row = rows[str(index)]
        forward = 2 * BATCH * i * o * micro_batches
        assert (row.fwd_flops, row.fwd_macs) == (forward, forward // 2)
        # backward: the weight gradient, and the input gradient except for the first layer
        assert row.bwd_flops == forward * (1 if index == 0 else 2)
        total_fwd += forward
    root = rows["(model)"]
    assert root.fwd_flops == total_fwd and root.fwd_macs == total_fwd // 2
    assert root.flops == sum(r.flops for n, r in rows.items() if n != "(model)")


def test_forward_flops_and_macs_match_deepspeeds_profiler():
    profiler = pytest.importorskip("deepspeed.profiling.flops_profiler")
    flops, macs, params = profiler.get_model_profile(
        linear_stack(),
        input_shape=(BATCH, WIDTHS[0]),
        print_profile=False,
        as_string=False,
    )
    root = profiled(linear_stack()).rows()[0]
    assert (root.fwd_flops, root.fwd_macs, root.params) == (flops, macs, params)


def test_the_layout_reads_like_deepspeeds():
    profile = profiled(linear_stack())
    times = StepTimes(forward_s=0.002, backward_s=0.004, step_s=0.001, samples=BATCH)
    text = format_table(profile.rows(), step=3, times=times, mfu="1.5% (test peak)")
    summary = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            summary[key.strip()] = value.strip()
    fwd = 2 * BATCH * sum(i * o for i, o in LAYERS)
    assert "Profile Summary at step 3:" in text
    assert summary["fwd flops per GPU"] == f"{fwd / 1e3:.2f} K"
    assert summary["fwd MACs per GPU"] == f"{fwd / 2 / 1e3:.2f} KMACs"
    assert summary["fwd latency"] == "2.00 ms" and summary["bwd latency"] == "4.00 ms"
    assert summary["iter latency"] == "7.00 ms" and summary["MFU"] == "1.5% (test peak)"
    for heading in ("Aggregated Profile per GPU", "Detailed Profile per GPU"):
        assert heading in text
    assert "    MACs        - {'1': " in text  # the layer with the most MACs at depth 1
    assert "  (1): Linear(3.12 K = " in text and "in_features=64, out_features=48" in text
