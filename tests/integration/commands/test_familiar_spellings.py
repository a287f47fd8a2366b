"""Torchrun's and DeepSpeed's spellings through the real `zlaunch` command.

`--nnodes`, `--nproc-per-node`, `--num_gpus` work on every subcommand that selects hosts or
counts GPUs; where torchrun's meaning differs (an elastic MIN:MAX range outside `run`, `--node-rank`, nodes
without a hostfile) the command exits 2 with one message and a hint; a config file given as
the script is refused instead of being run as Python.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def zlaunch(cwd, *args):
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    return out.returncode, out.stdout, out.stderr


@pytest.fixture
def project(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 1}')
    (tmp_path / "hosts").write_text("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n")
    yield tmp_path
    assert not marker.exists(), "the script ran"


def test_torchrun_spellings_select_hosts_and_slots(project):
    code, out, err = zlaunch(
        project, "--dry-run", "-H", "hosts", "--nnodes", "2", "--nproc_per_node", "1", "train.py"
    )
    assert code == 0, err
    assert "world size 2  nodes 2" in out


def test_estimate_and_check_take_the_same_spellings(project):
    code, out, err = zlaunch(
        project, "estimate", "--params", "1B", "--nnodes", "2", "--num_gpus", "8", "--no-color"
    )
    assert code == 0, err
    assert "2 node(s) x 8 GPU(s)" in out
    code, out, err = zlaunch(project, "check", "--help")
    assert code == 0, err
    for flag in ("--num_gpus", "--nproc-per-node", "--nnodes", "--num_nodes"):
        assert flag in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--nnodes", "1:4", "train.py"], ["--min-nodes only matters", "--max-restarts"]),
        (["--nodes", "2:3", "train.py"], ["not a range", "--nnodes 2:3"]),
        (["--nnodes", "2", "train.py"], ["without --hostfile", "once per node"]),
        (["-H", "hosts", "--node_rank", "1", "train.py"], ["one command", "--hostfile"]),
        (["-H", "hosts", "--nnodes", "2", "--num-nodes", "2", "train.py"], ["give one"]),
        (["ds.json"], ["looks like a training config", "--config ds.json"]),
        (["--num-gpus", "2", "conf/ds.YAML"], ["looks like a training config"]),
        (["check", "--nnodes", "0:2"], ["MIN:MAX range of hosts is for zlaunch run"]),
    ],
)
def test_torchrun_only_usage_is_refused_with_a_hint(project, args, words):
    code, out, err = zlaunch(project, *args)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert err.startswith("error: ") and "hint: " in err
    for word in words:
        assert word in err
