"""Checkpoints of mixed-precision and offloaded engines resume exactly.

Same world size and stage on both sides, so the continuation must be bitwise identical to the
uninterrupted run: fp32 master weights, optimizer moments (on the CPU under offload) and, for
fp16, the dynamic loss scaler's state (scale, hysteresis, skipped steps) all come back.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks

WORKER = "tests/integration/checkpoint/ckpt_worker.py"
SAVE_AT, TOTAL = 4, 8

CASES = {
    "fp16-dynamic-stage2-offload": (
        2,
        {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 12,
                # a short window: the scale moves before the save, so restoring it matters
                "loss_scale_window": 2,
            },
            "zero_optimization": {"offload_optimizer": {"device": "cpu"}},
        },
    ),
    "bf16-stage1": (1, {"bf16": {"enabled": True}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_precision_resume_is_bitwise_exact(tmp_path, case):
    stage, extra = CASES[case]
    save_dir = str(tmp_path / "ckpt")
    ref = run_ranks(
        2,
        f"{WORKER}:save_then_continue",
        {"stage": stage, "save_dir": save_dir, "save_at": SAVE_AT, "total": TOTAL, "extra": extra},
    )
    resumed = run_ranks(
        2,
        f"{WORKER}:load_then_continue",
        {"stage": stage, "load_dir": save_dir, "total": TOTAL, "extra": extra},
    )
    for before, after in zip(ref, resumed, strict=True):
        assert after["start"] == SAVE_AT
        assert after["scaler_at_load"] == before["scaler_at_save"]
        if "fp16" in case:  # the scale really moved away from its initial 2**12
            assert before["scaler_at_save"]["loss_scale"] != 2.0**12
        assert after["losses"] == before["losses"]
        assert after["final"].keys() == before["final"].keys()
        for name, tensor in before["final"].items():
            assert torch.equal(after["final"][name], tensor), name
