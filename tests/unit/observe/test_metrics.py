"""Pure pieces of the metrics path: the event sink, token counting, plain rendering."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re

import pytest
import torch

from runtime.observe.metrics import EventSink, _token_count
from zlaunch.agent.events import parse_event
from zlaunch.console.live_view import PlainView, format_metrics
from zlaunch.console.terminal import Console
from zlaunch.wire import events

EVENT = {
    "kind": "metrics", "source": "engine", "step": 20, "samples": 640, "total_steps": 100,
    "loss": 2.345678, "lr": 0.0003, "loss_scale": 65536.0, "grad_norm": None,
    "skipped_steps": 1, "step_time": 0.125, "samples_per_s": 256.0, "tokens_per_s": 32768.0,
    "memory_kind": "cuda", "memory_bytes": 3 * 2**30, "memory_peak_bytes": 4 * 2**30,
    "comm_bytes": 5 * 2**20, "world_size": 8,
}  # fmt: skip


def test_sink_writes_one_json_line_per_event_to_the_events_fd():
    read_fd, write_fd = os.pipe()
    try:
        sink = EventSink({"ZLAUNCH_EVENTS_FD": str(write_fd)})
        sink.emit(events.Metrics.of_row(EVENT))
        sink.emit(events.Metrics(3, "user", {"acc": torch.tensor(0.5)}))
        os.close(write_fd)
        lines = os.read(read_fd, 1 << 16).decode().splitlines()
    finally:
        os.close(read_fd)
    assert [json.loads(line) for line in lines] == [
        EVENT,
        {"kind": "metrics", "source": "user", "step": 3, "acc": 0.5},
    ]


def test_a_script_s_diverged_value_reaches_the_controller_and_does_not_stop_training():
    # a NaN validation loss or an infinite perplexity from log_metrics is written as JSON's
    # NaN/Infinity, read back by the agent and kept by the controller's check
    read_fd, write_fd = os.pipe()
    try:
        sink = EventSink({"ZLAUNCH_EVENTS_FD": str(write_fd)})
        sink.emit(events.Metrics(4, "user", {"val_loss": float("nan"),
                                             "ppl": torch.tensor(float("inf"))}))  # fmt: skip
        os.close(write_fd)
        (line,) = os.read(read_fd, 1 << 16).splitlines()
    finally:
        os.close(read_fd)
    (event,) = parse_event(line)  # kept whole: no Invalid event beside it
    assert isinstance(event, events.Metrics) and event.step == 4, event
    assert set(event.values) == {"val_loss", "ppl"}
    assert math.isnan(event.values["val_loss"]) and event.values["ppl"] == float("inf")


def test_sink_with_a_closed_fd_warns_and_logs_instead(caplog):
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    os.close(write_fd)
    with pytest.warns(UserWarning, match=f"ZLAUNCH_EVENTS_FD={write_fd} is not an open file"):
        sink = EventSink({"ZLAUNCH_EVENTS_FD": str(write_fd)})
    assert sink.fd is None
    with caplog.at_level(logging.INFO, logger="runtime.observe.metrics"):
        sink.emit(events.Metrics.of_row(EVENT))
    assert caplog.messages == [
        "step 20/100 | loss 2.346 | lr 0.0003 | grad norm - | loss scale 65536 | skipped 1 | "
        "step time 125.0 ms | samples/s 256.0 | tokens/s 32.8k | cuda 3.0 GiB | comm 5.0 MiB"
    ]


def test_tokens_are_counted_only_for_integer_batches():
    ids = torch.zeros(4, 9, dtype=torch.long)
    assert _token_count((ids,), {}) == 36
    assert _token_count((), {"input_ids": ids}) == 36
    assert _token_count(({"input_ids": ids, "labels": ids},), {}) == 36
    assert _token_count(((ids, ids),), {}) == 36
    assert _token_count((torch.zeros(4, 9),), {}) is None
    assert _token_count((torch.zeros(4, dtype=torch.bool),), {}) is None
    assert _token_count((), {}) is None


def test_plain_view_prints_one_escape_free_line_per_event():
    err = io.StringIO()
    view = PlainView(Console(color=False, out=io.BytesIO(), err=err))
    view.start("run-1", {"node1": 2})
    view.metrics(0, "node1", EVENT)
    line = err.getvalue()
    assert line == (
        "zlaunch: step 20/100  loss 2.346  lr 0.0003  grad norm -  loss scale 65536  skipped 1"
        "  step time 125.0 ms  samples/s 256.0  tokens/s 32.8k  cuda 3.0 GiB  comm 5.0 MiB\n"
    )
    assert view.latest is EVENT
    assert format_metrics({"source": "user", "step": 3, "acc": 0.5, "kind": "metrics"}) == (
        "step 3  acc 0.5"
    )


def test_last_engine_row_reads_the_tail_of_a_long_metrics_file(tmp_path):
    from zlaunch.commands.runs_common import last_engine_row
    from zlaunch.rundir.layout import RunDir

    rows = [dict(EVENT, step=s) for s in range(1, 3001)]  # ~1 MB: many tail blocks
    rows.append({"kind": "metrics", "source": "user", "step": 3000, "acc": 1.0})
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "metrics", "st'  # half-written
    (tmp_path / "metrics.jsonl").write_text(text)
    assert last_engine_row(RunDir(str(tmp_path), "r"))["step"] == 3000
    (tmp_path / "metrics.jsonl").write_text(json.dumps(dict(EVENT, step=7)) + "\n" + "x" * 300_000)
    assert last_engine_row(RunDir(str(tmp_path), "r"))["step"] == 7
    (tmp_path / "metrics.jsonl").write_text("")
    assert last_engine_row(RunDir(str(tmp_path), "r")) is None


def test_panel_shows_progress_metrics_and_a_host_summary_when_there_are_many():
    from rich.console import Console as RichConsole

    from zlaunch.console.live_view import JobView, LiveView

    view = JobView(Console(color=False, out=io.BytesIO(), err=io.StringIO()))
    view.start("run-9", {f"node{i}": 2 for i in range(1, 13)})
    for rank in range(24):
        if rank != 7:
            view.rank_started(rank, f"node{rank // 2 + 1}")
    view.metrics(0, "node1", EVENT)
    screen = RichConsole(record=True, width=120, file=io.StringIO())
    screen.print(LiveView._panel(view))
    text = screen.export_text()
    assert "zlaunch run-9" in text
    assert re.search(r"step 20/100 +20% +ETA 0:(09|10) +elapsed", text), text
    assert "loss 2.346" in text and "tokens/s 32.8k" in text and "mem 3.0 GiB" in text
    assert "ranks alive: 23/24 on 12 hosts, 11 complete  node4 1/2" in text, text
