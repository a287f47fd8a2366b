"""runtime.zero.estimator and `zlaunch estimate`: docs/memory-model.md's formulas, buffers, no torch needed."""

import json
import os
import struct
import subprocess
import sys

import pytest

from runtime.zero.estimator import (
    MAX_BUCKET,
)

# --- the command ------------------------------------------------------------------------------

BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv = ['zlaunch'] + sys.argv[1:]; "
    "from zlaunch.cli import main; main()"
)


def zlaunch(*args, block_torch=True):
    argv = (
        [sys.executable, "-c", BLOCK_TORCH, *args]
        if block_torch
        else [sys.executable, "-m", "zlaunch", *args]
    )
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=root)


def test_command_shows_24_gb_for_stage_0_without_torch():
    out = zlaunch("estimate", "--params", "1.5e9", "--nodes", "1", "--gpus-per-node", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "GB = 10^9 bytes" in lines[0] and "1,500,000,000" in lines[0]
    stage0 = next(line.split() for line in lines if line.startswith("0 "))
    assert stage0[:4] == ["0", "none", "24.00", "GB"]
    stage3 = next(line.split() for line in lines if line.startswith("3 ") and " none " in line)
    assert stage3[2] == "24.00"  # 16 bytes/param / 1 rank


def test_command_json_matches_formulas_without_torch():
    out = zlaunch(
        "estimate",
        "--params",
        "2B",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--precision",
        "fp32",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["params"] == 2 * 10**9 and payload["precision"] == "fp32"
    rows = {(r["stage"], r["offload"]): r for r in payload["rows"]}
    n = 8
    assert rows[1, "none"]["gpu_model_states_bytes"] == pytest.approx(2e9 * (8 + 8 / n))
    assert rows[2, "none"]["gpu_model_states_bytes"] == pytest.approx(2e9 * (4 + 12 / n))
    assert rows[3, "none"]["gpu_model_states_bytes"] == pytest.approx(2e9 * 16 / n)
    assert rows[0, "none"]["gpu_buffers_bytes"] == MAX_BUCKET * 4


def test_command_reads_config_and_safetensors_without_torch(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                "bf16": {"enabled": True},
                "zero_optimization": {
                    "stage": 2,
                    "reduce_bucket_size": 1000,
                    "allgather_bucket_size": 1000,
                },
            }
        )
    )
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [1000, 1000], "data_offsets": [0, 2_000_000]}}
    ).encode()
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(struct.pack("<Q", len(header)) + header)
    out = zlaunch("estimate", "--model-file", str(weights), "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["params"] == 10**6 and payload["precision"] == "bf16"
    rows = {(r["stage"], r["offload"]): r for r in payload["rows"]}
    assert rows[2, "none"]["gpu_buffers_bytes"] == 1000 * 2 + 1000 * 2


def test_command_usage_errors():
    out = zlaunch("estimate", "--nodes", "2")
    assert out.returncode == 2 and "exactly one of --params" in out.stderr
    out = zlaunch("estimate", "--params", "lots")
    assert out.returncode == 2 and "--params 'lots' is not a number" in out.stderr


def test_command_counts_a_model_factory(tmp_path):
    factory = tmp_path / "factory.py"
    factory.write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))\n"
    )
    out = zlaunch("estimate", "--model", f"{factory}:make", "--json", block_torch=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["params"] == 10 * 20 + 20 + 20 * 3 + 3
    out = zlaunch("estimate", "--model", "examples.gpt:bench_model", "--json", block_torch=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["params"] == 23_175_168
    out = zlaunch("estimate", "--model", "examples/gpt.py:GPT", block_torch=False)
    assert out.returncode == 2
    assert "--model 'examples/gpt.py:GPT' failed: TypeError" in out.stderr
    assert "called with no arguments" in out.stderr


def test_estimate_module_imports_no_torch():
    code = "import sys, runtime.zero.estimator, zlaunch.commands.estimate; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, check=True
    )
    assert out.stdout.strip() == "False"
