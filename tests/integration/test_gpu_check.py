"""The device check's dry run, as CI runs it on every commit: `benchmarks/gpu_check.py --dry`
installs the project and every carried wheel offline against the torch already installed,
runs the torch-version item through the item runner with the installed copy (never this
tree's), reports every CUDA item as "skipped: no CUDA", and writes its JSON and table.

One run serves every assertion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(out),
    )
    report = json.loads((out / "gpu_check.json").read_text())
    return done, report, (out / "gpu_check.md").read_text(), out


def _catalog():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check.ITEMS


def test_the_dry_run_succeeds_and_prints_one_line_per_item(dry):
    done, report, _, _ = dry
    assert done.returncode == 0, done.stdout + done.stderr
    items = _catalog()
    ids = ["install", *(i.id for i in items), "not_run"]
    assert [r["id"] for r in report["items"]] == ids
    printed = [line.split()[0] for line in done.stdout.splitlines()[: len(ids)]]
    assert printed == ids


def test_the_install_is_offline_against_the_torch_already_there(dry):
    _, report, _, _ = dry
    install = report["items"][0]
    assert install["status"] == "ok"
    assert install["details"]["torch"] == torch.__version__  # kept, not replaced
    wheels = {w.split("==")[0].lower() for w in install["details"]["wheels_installed"]}
    assert {"fabric", "hjson", "paramiko", "invoke", "cryptography", "pynacl"} <= wheels


def test_the_items_run_the_installed_copy_with_the_carried_packages(dry):
    _, report, _, _ = dry
    api = next(r for r in report["items"] if r["id"] == "torch_api")
    assert api["status"] == "ok", api
    site = report["items"][0]["details"]["site"]
    assert api["details"]["runtime_from"] == site and api["details"]["zlaunch_from"] == site
    assert set(api["details"]["carried"]) == {"fabric", "hjson"}
    assert all(api["details"]["carried"].values())
    assert api["details"]["torch"] == torch.__version__ and api["details"]["cuda"] is False


def test_every_cuda_item_is_skipped_for_want_of_cuda(dry):
    _, report, table, _ = dry
    by_id = {r["id"]: r for r in report["items"]}
    cuda_items = [i for i in _catalog() if i.cuda]
    assert len(cuda_items) >= 10
    for i in cuda_items:
        row = by_id[i.id]
        assert (row["status"], row["figure"], row["reason"]) == (
            "skipped",
            "skipped: no CUDA",
            "no CUDA",
        ), row
        assert f"| {i.id} | skipped | skipped: no CUDA |" in table
    summary = by_id["not_run"]
    assert summary["figure"].startswith(", ".join(i.id for i in cuda_items) + ": no CUDA;")
    assert report["mode"] == "dry"


def test_the_output_is_one_small_folder(dry):
    _, _, table, out = dry
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]
    assert all(p.stat().st_size < 64 * 1024 for p in out.iterdir())
    assert table.startswith("# Device check, ")
    assert "Multi-rank paths one GPU cannot prove:" in table
