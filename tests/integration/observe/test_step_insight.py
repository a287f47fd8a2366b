"""Seeing inside a step: each block's output against an independent measurement.

FLOPs of a Linear stack computed by hand; comms bytes against the ring formula and bandwidths
against nccl-tests' definitions; the wall-clock split and the straggler on 2 gloo ranks; CSV
rows against the metrics events; MFU against the peak it names; the config blocks' errors.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import runtime
from runtime.observe.profiling.comms import bus_factor
from tests.integration.config.cli_utils import dry_run
from tests.integration.engine.mp_utils import REPO, run_ranks
from tests.unit.observe.test_step_insight import (  # shared with the unit half
    Recorder,
    config,
    single_process_group,  # noqa: F401 - fixtures, shared with the unit half
    stack,
    train,
)

HERE = "tests/integration/observe/test_step_insight.py"
IN, HID, OUT, MICRO, GAS = 32, 64, 16, 4, 2


def hand_flops(micro: int = MICRO, gas: int = GAS) -> dict[str, int]:
    """Per optimizer step: a Linear(i, o) on b rows costs 2bio forward, 2bio for the weight
    gradient, and 2bio for the input gradient unless its input needs none (the first layer)."""
    first = 2 * micro * IN * HID * 2  # forward + weight gradient
    second = 2 * micro * HID * OUT * 3  # forward + weight + input gradient
    return {"0": first * gas, "2": second * gas, "2.0": second * gas, "": (first + second) * gas}


# --- config ---------------------------------------------------------------------------------


def test_unknown_key_in_a_block_exits_2_before_launch(tmp_path):
    done = dry_run(tmp_path, '{"train_batch_size": 1, "flops_profiler": {"detaild": 1}}')
    assert done.returncode == 2, done.stderr
    assert "flops_profiler.detaild is not a valid key; did you mean 'detailed'?" in done.stderr


# --- FLOPs, the profiler table, MFU ---------------------------------------------------------


def test_flops_per_step_match_the_hand_count_and_mfu_uses_the_given_peak(monkeypatch):
    monkeypatch.setenv("ZLAUNCH_PEAK_TFLOPS", "0.5")
    engine, *_ = runtime.initialize(model=stack(), config=config())
    engine.step_metrics.sink = recorder = Recorder()
    train(engine, 2)
    assert engine.insight.flops_per_step == hand_flops()[""]
    first, second = recorder.events
    assert first["flops_per_step"] == hand_flops()[""]  # counted at step 1 (the default)
    assert second["peak_tflops"] == 0.5 and second["peak_source"] == "--peak-tflops"
    assert second["tflops"] == pytest.approx(hand_flops()[""] / second["step_time"] / 1e12)
    assert second["mfu"] == pytest.approx(second["tflops"] / 0.5)


def modes() -> list:
    """The dispatch modes on now (torch's FLOP counters are dispatch modes)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def test_nothing_is_counted_where_nobody_asked_for_flops():
    """Without flops_profiler or --mfu/--peak-tflops step 1 runs no op through a counter:
    the FLOP fields stay None, and no dispatch mode is on inside the model's forward."""
    from runtime.observe.profiling.insight import mfu_asked

    assert not mfu_asked({}) and mfu_asked({"ZLAUNCH_MFU": "1"})
    assert mfu_asked({"ZLAUNCH_PEAK_TFLOPS": "2"}) and not mfu_asked({"ZLAUNCH_MFU": "0"})
    before, seen = modes(), []
    model = stack()
    model.register_forward_hook(lambda *_: seen.append(modes()))
    engine, *_ = runtime.initialize(model=model, config=config())
    engine.step_metrics.sink = recorder = Recorder()
    train(engine, 2)
    assert seen == [before] * (2 * GAS)
    assert engine.insight.flops_per_step is None
    assert all(e["flops_per_step"] is None and e["mfu"] is None for e in recorder.events)


def test_the_mfu_count_is_on_inside_forward_and_backward_only(monkeypatch):
    """The light count (--mfu) is entered by the engine's forward and backward and left as
    each returns or raises: between them, and after a script drops an engine in the middle of
    the counted step, the process runs no counter."""
    from runtime.observe.profiling.flops import StepFlops

    monkeypatch.setenv("ZLAUNCH_MFU", "1")
    before, inside = modes(), []
    model = stack()
    model.register_forward_hook(lambda *_: inside.append(modes()))
    engine, *_ = runtime.initialize(model=model, config=config())
    loss = engine(torch.randn(MICRO, IN)).pow(2).mean()
    assert len(inside[-1]) == len(before) + 1 and isinstance(inside[-1][-1], StepFlops)
    assert modes() == before  # between forward and backward
    engine.backward(loss)
    engine.step()
    assert modes() == before
    with pytest.raises(RuntimeError):  # a forward that raises (wrong width)
        engine(torch.randn(MICRO, IN + 1))
    assert modes() == before
    del engine, loss  # dropped in the middle of the counted step
    assert modes() == before
    engine, *_ = runtime.initialize(model=stack(), config=config())
    train(engine, 1)
    assert engine.insight.flops_per_step == hand_flops()[""]  # every micro-batch, no more
    assert modes() == before


def test_an_evaluation_forward_before_training_leaves_no_flop_counter_on(monkeypatch):
    """A no-grad forward before step 1 neither starts the count (no backward would end it:
    its dispatch mode would stay on for the process) nor adds to step 1's FLOPs."""
    monkeypatch.setenv("ZLAUNCH_MFU", "1")
    # Compared with the stack before, not with an empty one: this process ran other tests.
    before = modes()
    engine, *_ = runtime.initialize(model=stack(), config=config())
    with torch.no_grad():
        engine(torch.randn(MICRO, IN))
    assert not engine.insight.counting
    assert modes() == before
    train(engine, 1)
    assert modes() == before
    assert engine.insight.flops_per_step == hand_flops()[""]


def test_flops_profiler_table_per_module(tmp_path):
    out = tmp_path / "flops.txt"
    cfg = config(flops_profiler={"enabled": True, "profile_step": 2, "output_file": str(out)})
    engine, *_ = runtime.initialize(model=stack(), config=cfg)
    train(engine, 1)
    assert not out.exists()  # step 2 is profiled
    train(engine, 1)
    text = out.read_text()
    hand = hand_flops()
    forward = 2 * MICRO * (IN * HID + HID * OUT) * GAS  # 2 x batch x in x out per Linear
    summary = dict(
        (k.strip(), v.strip())
        for k, v in (x.split(": ", 1) for x in text.splitlines() if ": " in x)
    )
    assert summary["fwd flops per GPU"] == f"{forward / 1e3:.2f} K"
    assert summary["fwd MACs per GPU"] == f"{forward / 2 / 1e3:.2f} KMACs"
    assert summary["bwd flops per GPU"] == f"{(hand[''] - forward) / 1e3:.2f} K"
    assert summary["fwd+bwd flops per GPU"] == f"{hand[''] / 1e3:.2f} K"
    assert "%" in summary["MFU"]
    assert "Sequential(" in text and "  (0): Linear(" in text and "  (1): ReLU(" in text
    # Per-module rows straight from the profile object, against the hand count.
    from runtime.observe.profiling.flops import ModuleProfile

    profile = ModuleProfile(stack())
    with profile:
        model = profile.root
        for _ in range(GAS):
            model(torch.randn(MICRO, IN)).pow(2).mean().backward()
    by_name = {r.name: r for r in profile.rows()}
    assert by_name["0"].flops == hand["0"] and by_name["2.0"].flops == hand["2.0"]
    assert by_name["2"].flops == hand["2"] and by_name["(model)"].flops == hand[""]
    assert by_name["0"].params == IN * HID + HID and by_name["1"].flops == 0
    assert all(r.forward_s > 0 for r in by_name.values())


# --- monitors -------------------------------------------------------------------------------


def test_csv_rows_match_the_metrics_events(tmp_path):
    cfg = config(
        wall_clock_breakdown=True,
        csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "job"},
    )
    engine, *_ = runtime.initialize(model=stack(), config=cfg)
    engine.step_metrics.sink = recorder = Recorder()
    train(engine, 4)
    engine.log_metrics({"accuracy": 0.75})
    events = [e for e in recorder.events if e["source"] == "engine"]
    assert [e["step"] for e in events] == [1, 2, 4]
    folder = tmp_path / "job"

    def rows(name):
        with open(folder / f"{name}.csv", newline="") as handle:
            return list(csv.reader(handle))

    loss = rows("Train_Samples_train_loss")
    assert loss[0] == ["step", "train_loss"]
    assert [(int(s), float(v)) for s, v in loss[1:]] == [(e["samples"], e["loss"]) for e in events]
    forward = rows("Train_Samples_elapsed_time_ms_forward")
    assert [float(v) for _, v in forward[1:]] == pytest.approx(
        [e["time_forward"] * 1e3 for e in events]
    )
    assert [float(v) for _, v in rows("Train_Samples_lr")[1:]] == [e["lr"] for e in events]
    assert rows("Train_Samples_accuracy") == [
        ["step", "accuracy"],
        [str(events[-1]["samples"]), "0.75"],
    ]


# --- comms logger and wall clock on 2 gloo ranks --------------------------------------------


@pytest.mark.multirank
def test_comms_logger_bytes_follow_the_ring_formula_and_bandwidth_nccl_tests():
    results = run_ranks(2, f"{HERE}:_ranked", {"stage": 2, "slow_rank": None}, timeout=300)
    for result in results:
        rows = result["summary"]
        n = result["world"]
        assert {r["kind"] for r in rows} >= {"reduce_scatter", "all_gather", "all_reduce"}
        for r in rows:
            factor = 2 * (n - 1) / n if r["kind"] == "all_reduce" else (n - 1) / n
            # bytes sent: the ring formula on the message size, per call
            assert r["bytes"] == pytest.approx(r["count"] * r["size"] * factor, abs=r["count"])
            assert r["algbw_gbps"] == pytest.approx(r["size"] / r["mean_latency_s"] / 1e9)
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["kind"], n))
            assert 0 < r["min_latency_s"] <= r["mean_latency_s"] <= r["max_latency_s"]
        # every logged byte is a byte runtime.distributed.comm counted, and the other way round
        logged = {}
        for r in rows:
            logged[r["kind"]] = logged.get(r["kind"], 0) + r["bytes"]
        for kind, counted in result["bytes"].items():
            assert logged.get(kind, 0) == pytest.approx(counted, abs=64), kind


@pytest.mark.multirank
def test_wall_clock_split_and_the_straggler_by_name():
    results = run_ranks(2, f"{HERE}:_ranked", {"stage": 3, "slow_rank": 1}, timeout=300)
    events = results[0]["events"]
    assert [e["step"] for e in events] == [1, 2]
    for e in events:
        for prefix in ("", "slowest_"):
            fwd, bwd = e[f"{prefix}time_forward"], e[f"{prefix}time_backward"]
            assert 0 <= e[f"{prefix}time_reduce_wait"] <= bwd
            assert 0 <= e[f"{prefix}time_allgather_wait"] <= fwd + bwd
            assert e[f"{prefix}time_step"] > 0
        assert e["slowest_rank"] == 1
        assert e["straggler"].endswith("(rank 1)") and e["straggler"].split()[0]
        # the straggler's sleep is in its forward; rank 0 waits for it in collectives instead
        assert e["slowest_time_forward"] > e["time_forward"]
        assert e["time_reduce_wait"] + e["time_allgather_wait"] > 0
    assert results[1]["events"] == []  # only rank 0 reports


# --- through zlaunch: metrics.jsonl, the CSV files, --peak-tflops, zlaunch plot -------------

SCRIPT = """
import torch, runtime
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
engine, *_ = runtime.initialize(model=model)
g = torch.Generator().manual_seed(engine.global_rank)
for _ in range(8):
    loss = engine(torch.randn(4, 32, generator=g)).pow(2).mean()
    engine.backward(loss)
    engine.step()
"""


@pytest.mark.multirank
def test_through_zlaunch_csv_rows_match_metrics_jsonl_and_plot_draws_the_split(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "train.py").write_text(SCRIPT)
    ds = config(
        gradient_accumulation_steps=1,
        wall_clock_breakdown=True,
        comms_logger={"enabled": True},
        flops_profiler={"enabled": True, "profile_step": 2, "output_file": "flops.txt"},
        csv_monitor={"enabled": True, "output_path": "csv", "job_name": "job"},
    )
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZLAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"

    def zl(*args):
        return subprocess.run(
            [sys.executable, "-m", "zlaunch", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip

    done = zl("--num-gpus", "2", "--log-dir", "runs", "--peak-tflops", "0.01", "train.py",
              "--config", "ds.json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = tmp_path / "runs/latest/metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    # Report steps (the first, every steps_per_print-th): those go to the CSV files too.
    rows = [r for r in rows if r.get("source") == "engine" and r.get("report", True)]
    assert [r["step"] for r in rows] == [1, 2, 4, 6, 8]
    with open(tmp_path / "csv/job/Train_Samples_train_loss.csv", newline="") as handle:
        loss = list(csv.reader(handle))
    assert [(int(s), float(v)) for s, v in loss[1:]] == [(r["samples"], r["loss"]) for r in rows]
    with open(tmp_path / "csv/job/Train_Samples_mfu.csv", newline="") as handle:
        mfu = [float(v) for _, v in list(csv.reader(handle))[1:]]
    assert mfu == pytest.approx([r["mfu"] for r in rows if r["mfu"] is not None])
    for r in rows[1:]:
        assert r["peak_source"] == "--peak-tflops" and r["peak_tflops"] == 0.01
        assert r["mfu"] == pytest.approx(r["tflops"] / 0.01)
        assert r["straggler"].endswith(("(rank 0)", "(rank 1)"))
    assert "Profile Summary at step 2:" in (tmp_path / "flops.txt").read_text()
    assert "comms summary (rank 0" in done.stdout + done.stderr
    plotted = zl("plot", "--log-dir", "runs", "-o", "plot.png")
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "plot.png").stat().st_size > 0


# --- live view ------------------------------------------------------------------------------


def _ranked(stage: int, slow_rank: int | None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, 256), torch.nn.Linear(256, OUT))
    cfg = config(
        zero_optimization={"stage": stage},
        wall_clock_breakdown=True,
        comms_logger={"enabled": True},
    )
    engine, *_ = runtime.initialize(model=model, config=cfg)
    engine.step_metrics.sink = recorder = Recorder()
    if slow_rank is not None and engine.global_rank == slow_rank:
        inner = engine.module.forward

        def slow_forward(*args):
            time.sleep(0.25)  # far more than a step of this model takes
            return inner(*args)

        engine.module.forward = slow_forward
    before = dict(engine.comm.stats.bytes)
    train(engine, 2)
    return {
        "summary": engine.comms_summary(show=False),
        "bytes": {k: v - before.get(k, 0) for k, v in engine.comm.stats.bytes.items()},
        "events": recorder.events,
        "numel": sum(p.numel() for p in model.parameters()),
        "world": engine.comm.world_size,
    }
