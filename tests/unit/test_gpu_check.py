"""The device check's pieces that need no GPU and no process: its catalog and its items agree,
the carried wheels are exactly the ones its requirements pin (by hash), the loss-scale rule it
expects is DeepSpeed's own, and its summary names what could not run.

The dry run end to end (install, item runner, output) is tests/integration/test_gpu_check.py.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
        import gpu_check_items

        gpu_check_items._load_items()
        yield gpu_check, gpu_check_items
    finally:
        sys.path.remove(str(BENCH))


def test_every_catalog_item_has_an_implementation_and_no_other(check):
    gpu_check, items = check
    assert [i.id for i in gpu_check.ITEMS] == list(dict.fromkeys(i.id for i in gpu_check.ITEMS))
    assert {i.id for i in gpu_check.ITEMS} == set(items.REGISTRY)
    assert gpu_check.ITEMS[0].id == "torch_api" and not gpu_check.ITEMS[0].cuda


def test_the_carried_wheels_are_the_pinned_ones_by_hash(check):
    gpu_check, _ = check
    blocks = gpu_check.requirement_blocks()
    hashes = {
        h.split("sha256:")[1].rstrip(" \\")
        for _, _, text in blocks
        for h in text.splitlines()
        if "--hash=sha256:" in h
    }
    wheels = sorted(gpu_check.WHEELS.glob("*.whl"))
    assert {hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels} == hashes
    names = {n.lower() for n, _, _ in blocks}
    assert {"fabric", "hjson", "paramiko", "invoke", "cryptography"} <= names
    for wheel in wheels:  # every wheel belongs to a pinned name and version
        dist, version = wheel.name.split("-")[:2]
        assert (dist.lower(), version) in {(n.lower(), v) for n, v, _ in blocks}, wheel.name
    assert sum(w.stat().st_size for w in wheels) < 16 * 2**20


def _deepspeed_scales(monkeypatch, overflows, init, window, hysteresis, min_scale, consecutive):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.fp16 import loss_scaler
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    # Its overflow message asks for the rank; there is no process group here.
    monkeypatch.setattr(loss_scaler.dist, "get_rank", lambda *a, **k: 0)

    scaler = DynamicLossScaler(
        init_scale=init,
        scale_window=window,
        min_scale=min_scale,
        delayed_shift=hysteresis,
        consecutive_hysteresis=consecutive,
        raise_error_at_min_scale=False,
    )
    out = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        out.append((float(scaler.cur_scale), overflow))
    return out


@pytest.mark.parametrize(
    "overflows, window, hysteresis, consecutive",
    [
        ([i in {2, 3, 7, 8, 9} for i in range(14)], 3, 2, False),  # the check's own schedule
        ([i in {0, 1, 2, 3, 10} for i in range(16)], 2, 1, False),
        ([i in {1, 3, 4, 5, 9} for i in range(15)], 3, 3, True),
        ([True] * 12, 4, 2, False),  # down to the minimum and held there
    ],
)
def test_the_expected_loss_scales_are_deepspeeds(
    check, monkeypatch, overflows, window, hysteresis, consecutive
):
    from gpu_check_train import ds_loss_scale_rule

    got = ds_loss_scale_rule(
        overflows,
        init=256.0,
        window=window,
        hysteresis=hysteresis,
        min_scale=1.0,
        consecutive=consecutive,
    )
    want = _deepspeed_scales(monkeypatch, overflows, 256.0, window, hysteresis, 1.0, consecutive)
    assert got == want


def test_the_summary_names_what_did_not_run_and_why(check):
    gpu_check, _ = check
    rows = [
        {"id": "install", "status": "ok", "figure": "x"},
        {"id": "stages", "status": "skipped", "figure": "skipped: no CUDA", "reason": "no CUDA"},
        {"id": "memory", "status": "skipped", "figure": "skipped: no CUDA", "reason": "no CUDA"},
        {"id": "compile", "status": "error", "figure": "timed out after 200 s", "reason": "tb"},
        {"id": "two_ranks", "status": "skipped", "figure": "", "reason": "NCCL refuses it"},
    ]
    row = gpu_check.summary_row(rows)
    assert row["figure"].startswith(
        "stages, memory: no CUDA; compile: timed out after 200 s; two_ranks: NCCL refuses it; "
        "multi-rank paths unproven on one GPU: "
    )
    assert row["details"]["unproven_multi_rank"] == list(gpu_check.UNPROVEN_MULTI_RANK)


def test_without_pip_the_wheels_that_fit_are_unpacked_after_their_hash_is_checked(check, tmp_path):
    gpu_check, _ = check
    build = tmp_path / "build"
    for package in ("zlaunch", "runtime"):
        (build / package).mkdir(parents=True)
        (build / package / "__init__.py").write_text("")
    blocks = [b for b in gpu_check.requirement_blocks() if b[0] in ("hjson", "cffi")]
    gpu_check._unpack_install(tmp_path / "site", build, blocks)
    found = sorted(p.name for p in (tmp_path / "site").iterdir())
    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    assert any(n.startswith("_cffi_backend") and tag in n for n in found), found
    assert {"hjson", "cffi", "zlaunch", "runtime"} <= set(found)
    forged = [("hjson", "3.1.0", "hjson==3.1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")]
    with pytest.raises(RuntimeError, match="sha256 differs"):
        gpu_check._unpack_install(tmp_path / "site2", build, forged)
