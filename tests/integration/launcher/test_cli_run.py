"""`zlaunch [OPTIONS] SCRIPT [ARGS]`: option parsing, checks before launch, --dry-run.

Everything here stops before any host is contacted: either at a usage/config error (exit 2)
or at the plan (--dry-run). The hand-off to the launcher is checked with a stand-in module
that records the options it receives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from zlaunch.cli import main

GOOD_CONFIG = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1},
}


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A project directory with a script that would leave a marker if it ever ran."""
    project = tmp_path / "project"
    project.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "ran"
    (project / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (project / "ds.json").write_text(json.dumps(GOOD_CONFIG))
    (project / "hosts").write_text("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU machine, whatever runs the tests
    monkeypatch.delitem(sys.modules, "zlaunch.launcher", raising=False)
    job = types.SimpleNamespace(dir=project, home=home, marker=marker)
    yield job
    assert not marker.exists(), "the script ran"


def zlaunch(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return info.value.code, out, err


# ---- --dry-run --------------------------------------------------------------------------------


# ---- --config ---------------------------------------------------------------------------------


# ---- usage errors: exit 2, clear message, nothing started ------------------------------------


# ---- hand-off to the launcher -----------------------------------------------------------------


def test_real_entry_point_dry_run_and_error(job):
    env = {**os.environ, "HOME": str(job.home)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlaunch",
            "--dry-run",
            "-H",
            "hosts",
            "train.py",
            "--config",
            "ds.json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    # 6 workers do not fit a 4-sample batch of micro 1 x accumulation 2: caught before launch.
    assert out.returncode == 2, out
    assert "world size 6" in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlaunch",
            "--dry-run",
            "-H",
            "hosts",
            "-i",
            "node2",
            "train.py",
            "--config",
            "ds.json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "node 0: node2  ranks 0-1  slots 0,1" in out.stdout
