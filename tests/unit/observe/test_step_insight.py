"""Seeing inside a step: each block's output against an independent measurement.

FLOPs of a Linear stack computed by hand; comms bytes against the ring formula and bandwidths
against nccl-tests' definitions; the wall-clock split and the straggler on 2 gloo ranks; CSV
rows against the metrics events; MFU against the peak it names; the config blocks' errors.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist

from runtime.config import ConfigError, load_config
from runtime.observe.profiling.comms import bus_factor
from runtime.observe.profiling.peak import resolve_peak
from zlaunch.wire import events

IN, HID, OUT, MICRO, GAS = 32, 64, 16, 4, 2


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


def stack() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HID), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(HID, OUT))
    )


def config(**extra) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "steps_per_print": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    }
    cfg.update(extra)
    return cfg


class Recorder:
    """Stands in for the log sink: the report steps' events, as metrics.jsonl has them."""

    fd = None

    def __init__(self):
        self.events: list[dict] = []

    def emit(self, event: events.WorkerEvent) -> None:
        self.events.append(events.encode(event))


def train(engine, steps: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps * engine.gradient_accumulation_steps()):
        loss = engine(torch.randn(MICRO, IN, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()


# --- config ---------------------------------------------------------------------------------


def test_blocks_are_read_with_deepspeed_keys_and_defaults():
    c = load_config(
        config(
            wall_clock_breakdown=True,
            comms_logger={"enabled": True, "prof_all": False, "prof_ops": ["all_reduce"]},
            flops_profiler={"enabled": True, "profile_step": 3, "module_depth": 2},
            csv_monitor={"enabled": True, "output_path": "out", "job_name": "j"},
        )
    )
    assert c.wall_clock_breakdown is True
    assert c.comms_logger.kinds == frozenset({"all_reduce"})
    assert (c.flops_profiler.profile_step, c.flops_profiler.module_depth) == (3, 2)
    assert c.flops_profiler.top_modules == 1 and c.flops_profiler.detailed is True
    assert (c.csv_monitor.output_path, c.csv_monitor.job_name) == ("out", "j")
    assert load_config(config()).csv_monitor.job_name == "DeepSpeedJobName"
    assert load_config(config()).wandb.project == "deepspeed"


@pytest.mark.parametrize(
    "block, message",
    [
        ({"comms_logger": {"enabld": True}}, "comms_logger.enabld is not a valid key; did you mean 'enabled'?"),
        ({"comms_logger": {"prof_ops": ["allreduce"]}}, "did you mean 'all_reduce'?"),
        ({"flops_profiler": {"top_module": 2}}, "did you mean 'top_modules'?"),
        ({"flops_profiler": {"profile_step": 0}}, "flops_profiler.profile_step must be >= 1"),
        ({"csv_monitor": {"output_pth": "x"}}, "did you mean 'output_path'?"),
        ({"wandb": {"projet": "x"}}, "did you mean 'project'?"),
        ({"wall_clock_breakdown": "yes"}, "wall_clock_breakdown must be true or false"),
        ({"comet": {"enabled": True}}, "comet is enabled but not supported"),
    ],
)  # fmt: skip
def test_bad_blocks_name_the_key(block, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?").replace(".", r"\.")):
        load_config(config(**block))


def test_wandb_without_the_package_is_refused_before_launch(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="wandb.enabled = true but the wandb package is not"):
        load_config(config(wandb={"enabled": True}))


# --- FLOPs, the profiler table, MFU ---------------------------------------------------------


def test_module_depth_and_top_modules_shape_the_table():
    from runtime.observe.profiling.flops import ModuleRow, StepTimes, format_table

    rows = [  # name, depth, kind, params, fwd+bwd flops, fwd seconds, fwd flops
        ModuleRow("(model)", 0, "M", 10, 300, 0.01, 100),
        ModuleRow("a", 1, "L", 4, 180, 0.004, 60),
        ModuleRow("b", 1, "L", 6, 120, 0.003, 40),
        ModuleRow("b.x", 2, "L", 6, 120, 0.003, 40),
    ]
    times = StepTimes(0.01, 0.02, 0.005, samples=4)
    text = format_table(rows, step=1, times=times, module_depth=1, top_modules=1)
    assert "    MACs        - {'a': '30 MACs'}" in text  # the top module at depth 1 by MACs
    assert "depth 2" not in text and "(x): L" not in text
    # a's share of the forward MACs and of the forward latency (4 of 10 ms)
    assert "(a): L(4 = 40.00% Params, 30 MACs = 60.00% MACs, 4.00 ms = 40.00% latency" in text
    brief = format_table(rows, step=1, times=times, detailed=False, top_modules=2)
    assert "{'a': '30 MACs', 'b': '20 MACs'}" in brief and "Detailed Profile" not in brief


def test_peak_from_the_table_by_device_name_and_the_cpu_probe(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    peak = resolve_peak(torch.device("cuda", 0), torch.bfloat16, environ={})
    assert peak.tflops == 989.5 and "H100 datasheet (SXM)" in peak.source
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 PCIe")
    assert resolve_peak(torch.device("cuda", 0), torch.float32, environ={}).tflops == 51.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Some GPU")
    unknown = resolve_peak(torch.device("cuda", 0), torch.bfloat16, environ={})
    assert unknown.tflops is None and "--peak-tflops" in unknown.source
    cpu = resolve_peak(torch.device("cpu"), torch.float32, environ={})
    assert cpu.tflops > 0 and "CPU matmul probe" in cpu.source and "measured" in cpu.source
    given = resolve_peak(torch.device("cpu"), torch.float32, environ={"ZLAUNCH_PEAK_TFLOPS": "2"})
    assert (given.tflops, given.source) == (2.0, "--peak-tflops")


# --- monitors -------------------------------------------------------------------------------


# --- comms logger and wall clock on 2 gloo ranks --------------------------------------------


# --- through zlaunch: metrics.jsonl, the CSV files, --peak-tflops, zlaunch plot -------------


def test_plot_split_series_adds_up_to_the_measured_total():
    from zlaunch.commands.plot import split_series

    row = {
        "step": 5, "time_forward": 0.010, "time_backward": 0.020, "time_reduce_wait": 0.004,
        "time_allgather_wait": 0.003, "time_step": 0.005,
    }  # fmt: skip
    steps, parts = split_series([row, {"step": 6, "loss": 1.0}])
    assert steps == [5]
    total = sum(values[0] for values in parts.values())
    assert total == pytest.approx((0.010 + 0.020 + 0.005) * 1000)
    assert parts["time_reduce_wait"] == [pytest.approx(4.0)]
    assert parts["time_backward"] == [pytest.approx(13.0)]  # 20 - 4 (reduce) - 3 (gather)


# --- live view ------------------------------------------------------------------------------

BREAKDOWN_EVENT = {
    "step": 10, "time_forward": 0.010, "time_backward": 0.024, "time_reduce_wait": 0.004,
    "time_allgather_wait": 0.0, "time_step": 0.006, "slowest_time_forward": 0.030,
    "slowest_time_backward": 0.024, "slowest_time_reduce_wait": 0.0,
    "slowest_time_allgather_wait": 0.0, "slowest_time_step": 0.006,
    "straggler": "node7 (rank 5)", "slowest_rank": 5, "tflops": 123.4, "mfu": 0.3952,
    "peak_source": "NVIDIA A100: datasheet",
}  # fmt: skip


def test_live_breakdown_bar_is_proportional_and_names_the_straggler():
    from rich.console import Console

    from zlaunch.console.live_breakdown import BAR_WIDTH, breakdown_text, renderables

    items = renderables(BREAKDOWN_EVENT)
    # 10 + 20 + 4 + 0 + 6 = 40 ms over 40 cells: one cell per ms, coloured per part
    runs = [
        (str(span.style), span.end - span.start)
        for span in items[0].spans
        if set(items[0].plain[span.start : span.end]) == {"█"}
    ]
    assert runs == [("blue", 10), ("dark_orange", 20), ("red", 4), ("green", 6)]
    assert sum(n for _, n in runs) == BAR_WIDTH
    console = Console(width=200, record=True)
    for item in items:
        console.print(item)
    text = console.export_text()
    bar_line = text.splitlines()[0]
    assert "fwd 10.0ms bwd 20.0ms reduce wait 4.0ms gather wait 0.0ms step 6.0ms" in bar_line
    assert "slowest rank: node7 (rank 5)  60.0 ms per step vs rank 0 40.0" in text
    assert "MFU 39.5%  123 TFLOP/s per device  (peak: NVIDIA A100: datasheet)" in text
    plain = breakdown_text(BREAKDOWN_EVENT)
    assert "fwd 10.0ms" in plain and "slowest node7 (rank 5)" in plain and "MFU 39.5%" in plain
    assert breakdown_text({"step": 1}) is None and renderables({"step": 1}) == []


def test_live_panel_keeps_the_split_between_report_steps_and_plain_lines_carry_it():
    import io

    from rich.console import Console as RichConsole

    from zlaunch.console.live_view import LiveView, format_metrics
    from zlaunch.console.terminal import Console

    view = LiveView(Console(color=False, out=io.BytesIO(), err=io.StringIO()), io.StringIO())
    try:
        view.start("run-x", {"node7": 1})
        view.metrics(0, "node7", {"kind": "metrics", "source": "engine", **BREAKDOWN_EVENT})
        # a step between reports: no breakdown, a newer rate
        view.metrics(0, "node7", {"kind": "metrics", "source": "engine", "step": 11,
                                  "tflops": 100.0, "mfu": 0.32, "report": False})  # fmt: skip
        out = io.StringIO()
        RichConsole(file=out, width=160, color_system=None).print(view._panel())
        text = out.getvalue()
    finally:
        view.close()
    assert "█" in text and "fwd 10.0ms" in text, text
    assert "slowest rank: node7 (rank 5)" in text and "MFU 32%  100 TFLOP/s" in text, text
    line = format_metrics({"kind": "metrics", "source": "engine", **BREAKDOWN_EVENT})
    assert "slowest node7 (rank 5)" in line and "MFU 39.5%" in line


def test_comms_logger_verbose_lines_prof_ops_and_summary_table(caplog):
    import logging

    from runtime.observe.profiling.comms import CommsLogger, format_summary

    logger = CommsLogger(
        kinds=frozenset({"all_reduce"}), verbose=True, debug=True, summary_at_exit=False
    )
    with caplog.at_level(logging.INFO, logger="runtime.comms"):
        logger.on_done("all_reduce", 1 << 20, 1 << 20, 0.002, 0.001, 2)
        logger.on_done("all_reduce", 1 << 20, 1 << 20, 0.004, 0.0, 2)
        logger.on_done("all_gather", 4096, 2048, 0.001, 0.0, 2)  # not in prof_ops
    (row,) = logger.summary()
    assert (row["kind"], row["size"], row["count"], row["bytes"]) == (
        "all_reduce",
        1 << 20,
        2,
        2 << 20,
    )
    assert row["mean_latency_s"] == pytest.approx(0.003)
    assert row["algbw_gbps"] == pytest.approx((1 << 20) / 0.003 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.0)  # 2(n-1)/n at n = 2
    assert (
        len(caplog.messages) == 2 and "comm op: all_reduce | time (ms): 2.000" in caplog.messages[0]
    )
    assert "caller test_comms_logger_verbose_lines" in caplog.messages[0]
    table = format_summary(logger.summary())
    assert "all_reduce" in table and "1.00 MiB" in table and "busbw GB/s" in table
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("all_gather", 4) == 0.75


def test_the_detailed_profile_is_the_model_tree_with_each_modules_numbers():
    from runtime.observe.profiling.flops import ModuleRow, StepTimes, format_table

    rows = [  # name, depth, kind, params, fwd+bwd flops, fwd seconds, fwd flops, extra
        ModuleRow("(model)", 0, "M", 10, 300, 0.01, 100),
        ModuleRow("a", 1, "L", 4, 180, 0.004, 60, "in=2"),
        ModuleRow("a.x", 2, "L", 4, 180, 0.004, 60),
        ModuleRow("b", 1, "R", 0, 0, 0.001, 0),
    ]
    text = format_table(rows, step=3, times=StepTimes(0.01, 0.02, 0.001, samples=2))
    tree = text.split("\n\n")[-1].splitlines()[:-1]  # the last block, less the closing rule
    assert tree == [
        "M(",
        "  10 = 100.00% Params, 50 MACs = 100.00% MACs, 10.00 ms = 100.00% latency, "
        "10.00 KFLOPS, fwd 100, bwd 200,",
        "  (a): L(",
        "    4 = 40.00% Params, 30 MACs = 60.00% MACs, 4.00 ms = 40.00% latency, "
        "15.00 KFLOPS, fwd 60, bwd 120, in=2,",
        "    (x): L(4 = 40.00% Params, 30 MACs = 60.00% MACs, 4.00 ms = 40.00% latency, "
        "15.00 KFLOPS, fwd 60, bwd 120)",
        "  )",
        "  (b): R(0 = 0.00% Params, 0 MACs = 0.00% MACs, 1.00 ms = 10.00% latency, 0 FLOPS, "
        "fwd 0, bwd 0)",
        ")",
    ]
