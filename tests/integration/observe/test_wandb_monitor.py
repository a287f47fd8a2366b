"""The wandb monitor, for real: wandb (from the test extra) in offline mode records every value
the runtime's step metrics log. Integration tier: wandb's service is a process of its own, and
the engine forms its world-of-one process group."""

from __future__ import annotations

import json
import time

import runtime
from tests.unit.observe.test_step_insight import (
    Recorder,
    config,
    single_process_group,  # noqa: F401 (autouse)
    stack,
    train,
)


def test_wandb_offline_run_records_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("ZLAUNCH_MFU", "1")  # TFLOP/s among the logged values
    cfg = config(wandb={"enabled": True, "project": "p", "group": "g", "team": None})
    engine, *_ = runtime.initialize(model=stack(), config=cfg)
    engine.step_metrics.sink = recorder = Recorder()
    train(engine, 2)
    (monitor,) = engine.step_metrics._monitors
    run = monitor.run
    assert run is not None and run.project == "p" and run.group == "g"
    monitor.close()
    (record,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # The offline record holds each logged value as its JSON text (protobuf strings). wandb's
    # service writes it on its own thread: give it a moment after finish().
    for _ in range(100):
        data = record.read_bytes()
        if b"Train/Samples/train_loss" in data:
            break
        time.sleep(0.1)
    assert b"Train/Samples/train_loss" in data and b"Train/Samples/tflops" in data
    for event in recorder.events:
        assert json.dumps(event["loss"]).encode() in data
