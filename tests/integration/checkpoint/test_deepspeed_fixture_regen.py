"""The committed DeepSpeed fixture is what real DeepSpeed writes: regenerate one case with the
installed DeepSpeed (the bench extra) and compare. Skipped where DeepSpeed is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from tests.integration.engine.mp_utils import run_ranks

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed (pip install -e .[bench] to regenerate the fixture)",
    ),
]

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "checkpoints"
SCRIPT = "tests/fixtures/deepspeed/make_deepspeed_checkpoints.py"


def test_deepspeed_writes_what_the_fixture_holds(tmp_path, monkeypatch):
    import deepspeed

    expected = json.loads((FIXTURE / "expected.json").read_text())
    if deepspeed.__version__ != expected["deepspeed"]:
        pytest.skip(
            f"fixture written by DeepSpeed {expected['deepspeed']}, {deepspeed.__version__} installed"
        )
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    case = "zero2_bf16"
    got = run_ranks(2, f"{SCRIPT}:train_and_save", {"case": case, "out": str(tmp_path)}, 600)[0]
    want = expected["cases"][case]
    assert got["before"] == want["before"] and got["after"] == want["after"]
    with DeepSpeedReader(str(tmp_path / "global_step3")) as reader:
        for name, (total, _) in want["fp32_fingerprint"].items():
            # Real DeepSpeed's fp32 masters of the same run have come out ~2e-8 apart (relative,
            # over a tensor's sum) from the committed ones with the same losses: compare to fp32
            # rounding, not bit for bit.
            assert math.isclose(float(reader.read_full(name).double().sum()), total, rel_tol=1e-6)


def test_deepspeeds_dynamic_loss_scaler_becomes_the_runtimes(tmp_path):
    """fp16 checkpoints cannot be written on CPU (DeepSpeed refuses fp16 there): put a real
    DynamicLossScaler, mid-run, into a copy of the fixture and read it back."""
    import shutil

    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    from runtime.optim.loss_scaler import DynamicLossScaler as Ours

    d = tmp_path / "ck"
    shutil.copytree(FIXTURE / "zero2_fp32" / "global_step3", d)
    scaler = DynamicLossScaler(
        init_scale=2.0**12, scale_window=100, min_scale=1.0, delayed_shift=2,
        consecutive_hysteresis=False, dtype=torch.float16,
    )  # fmt: skip
    # As after one overflow (hysteresis 2 -> 1, the scale kept) and three good steps
    # (update_scale itself needs DeepSpeed's process group).
    scaler.cur_iter, scaler.last_overflow_iter, scaler.cur_hysteresis = 4, 0, 1
    for rank in (0, 1):
        f = d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        state = torch.load(f, weights_only=False)  # DeepSpeed's own types, to save them again
        state["optimizer_state_dict"]["loss_scaler"] = scaler
        torch.save(state, f.with_suffix(".new"))
        f.with_suffix(".new").replace(f)
    with DeepSpeedReader(str(d)) as reader:
        saved = reader.state("loss_scaler")
    assert saved == {
        "dynamic": True,
        "scale": scaler.cur_scale,
        "iteration": scaler.cur_iter,
        "last_overflow_iteration": scaler.last_overflow_iter,
        "hysteresis_left": scaler.cur_hysteresis,
    }
    ours = Ours(init_scale=1.0, scale_window=100, hysteresis=2, min_scale=1.0)
    ours.load_state_dict(saved)
    assert (ours.scale, ours.iteration, ours.hysteresis_left) == (2.0**12, 4, 1)
