"""The training benchmark harness end to end, tiny: DDP and this runtime, 2 ranks, 3 steps.

DeepSpeed is left out on purpose (an optional extra that CI may not have). The run checks the
harness itself: every field is present, and the measurements that are exact by construction
are exact (DDP's all-reduce volume, DDP's model states, the runtime's own byte counter agreeing
with the intercepted collectives, identical losses for identical work).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "train_bench.py"

ROW_FIELDS = {
    "framework",
    "stage",
    "precision",
    "world_size",
    "num_params",
    "step_time_s",
    "step_times_s",
    "min_step_time_s",
    "phase_s",
    "cpu_time_s",
    "step_time_ratio",
    "peak_rss_bytes",
    "baseline_rss_bytes",
    "model_state_bytes",
    "formula_bytes",
    "sent_bytes_per_step",
    "comm_by_kind",
    "runtime_counter_bytes_per_step",
    "losses",
    "loss_max_rel_diff",
    "loss_matches",
    "init_s",
    "save_s",
    "load_s",
    "load_avg_1min_after",
}
TABLE_COLUMNS = [
    "framework",
    "step ms (median)",
    "x ddp",
    "x alone",
    "CPU ms/step",
    "peak RSS/rank",
    "model states/rank",
    "formula",
    "sent/rank/step",
    "losses (first .. last)",
    "max rel diff vs ddp",
]


@pytest.mark.multirank
def test_tiny_run_reports_every_field(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--stage",
            "2",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--frameworks",
            "ddp,zlaunch,zlaunch_alone",
            "--json",
            str(out),
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| framework"))
    for column in TABLE_COLUMNS:
        assert column in header
    assert "| ddp |" in proc.stdout and "| zlaunch |" in proc.stdout

    result = json.loads(out.read_text())
    assert result["reference"] == "ddp"
    assert result["threads_per_rank"] == 1
    assert result["command"].startswith("python benchmarks/train_bench.py --stage 2 --steps 3")
    assert result["environment"]["torch"]
    ddp, ours, alone = result["rows"]
    # The comm-free bound: one rank, the same micro-batch, nothing on the wire.
    assert (alone["world_size"], alone["sent_bytes_per_step"], alone["bound_ratio"]) == (1, 0, 1)
    assert alone["loss_matches"] is None and alone["num_params"] == ours["num_params"]
    assert ours["bound_ratio"] == ours["step_time_s"] / alone["step_time_s"]
    assert "| zlaunch_alone |" in proc.stdout and "rank 0's data alone" in proc.stdout
    for row in (ddp, ours):
        assert ROW_FIELDS <= row.keys(), ROW_FIELDS - row.keys()
        assert len(row["losses"]) == 3 and len(row["step_times_s"]) == 3
        assert row["step_time_s"] > 0 and row["cpu_time_s"] > 0
        assert row["peak_rss_bytes"] >= row["baseline_rss_bytes"] > 0
        assert row["world_size"] == 2
        assert set(row["phase_s"]) == {"forward", "backward", "step"}
        assert sum(row["phase_s"].values()) <= max(row["step_times_s"]) * 1.001
    assert (ddp["framework"], ddp["stage"]) == ("ddp", 0)
    assert (ours["framework"], ours["stage"]) == ("zlaunch", 2)
    assert ddp["step_time_ratio"] == 1.0
    assert ddp["num_params"] == ours["num_params"]
    params = ddp["num_params"]

    # DDP all-reduces every gradient once per step: 2 (N-1)/N x 4 bytes x params = 4 x params.
    assert ddp["sent_bytes_per_step"] == pytest.approx(4 * params, rel=1e-9)
    assert set(ddp["comm_by_kind"]) == {"all_reduce"}
    # fp32 DDP + AdamW holds params, grads (bucket views) and two moments: 16 bytes each (plus
    # AdamW's scalar step counters).
    assert ddp["model_state_bytes"] == pytest.approx(16 * params, rel=0.02)
    assert ddp["formula_bytes"] == 16 * params
    # Stage 2 moves 2 (N-1)/N x 4 bytes per parameter too (plus alignment padding and the one
    # tiny norm/overflow all-reduce), and the runtime's own counter agrees with the interceptor.
    assert ours["sent_bytes_per_step"] == pytest.approx(4 * params, rel=0.01)
    assert ours["runtime_counter_bytes_per_step"] == pytest.approx(
        ours["sent_bytes_per_step"], rel=1e-6
    )
    # Same model, data and hyperparameters: the same losses up to summation order.
    assert ours["loss_matches"] and ours["loss_max_rel_diff"] < 1e-5
    assert ddp["losses"][0] == pytest.approx(ours["losses"][0], rel=1e-6)


def test_bad_arguments_fail_with_a_message():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--frameworks", "ddp,horovod", "--tiny"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "--frameworks" in proc.stderr and "horovod" in proc.stderr


def _bench_utils():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_utils
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return bench_utils


def test_collective_counter_counts_ring_volume(tmp_path):
    import torch
    import torch.distributed as dist

    bench_utils = _bench_utils()
    original = dist.all_reduce
    counter = bench_utils.CollectiveCounter().install()
    assert dist.all_reduce is not original
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )
        dist.all_reduce(torch.zeros(10))
        out = torch.zeros(6, dtype=torch.float64)
        dist.all_gather_single(out, torch.zeros(6, dtype=torch.float64))
        counter.enabled = False
        dist.all_reduce(torch.zeros(1000))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        counter.uninstall()
    snap = counter.snapshot()
    assert snap["all_reduce"] == {"calls": 1, "payload_bytes": 40, "sent_bytes": 0.0}
    assert snap["all_gather"] == {"calls": 1, "payload_bytes": 48, "sent_bytes": 0.0}
    assert dist.all_reduce is original
