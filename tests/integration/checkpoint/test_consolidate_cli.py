"""`zlaunch consolidate`: the full state dict on success; one clear line and exit 1 otherwise."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

from runtime.checkpoint.storage import MANIFEST, shard_file_name
from tests.unit.checkpoint.test_storage import SHAPES, save_threads


def consolidate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", "consolidate", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_writes_every_parameter_whole(tmp_path):
    ref, _ = save_threads(tmp_path / "ck", "global_step3")
    out = tmp_path / "model.safetensors"
    result = consolidate(str(tmp_path / "ck"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "from " + str(tmp_path / "ck" / "global_step3") in result.stdout
    state = load_file(out)
    assert set(state) == set(SHAPES) | {"buf"}
    for name, shape in SHAPES.items():
        assert torch.equal(state[name], ref[name]["param"].view(shape))
    assert torch.equal(state["buf"], torch.arange(4))
    # --dtype bf16 casts floating tensors only; --tag and the tag directory itself both work
    # (--force: each replaces the file the one before wrote).
    result = consolidate(
        str(tmp_path / "ck" / "global_step3"), "-o", str(out), "--dtype", "bf16", "--force"
    )
    assert result.returncode == 0, result.stderr
    state = load_file(out)
    assert state["a.weight"].dtype == torch.bfloat16 and state["buf"].dtype == torch.int64
    result = consolidate(str(tmp_path / "ck"), "--tag", "global_step3", "-o", str(out), "--force")
    assert result.returncode == 0, result.stderr


def assert_clean_failure(result, *words):
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_a_shard_cut_by_one_byte(tmp_path):
    save_threads(tmp_path, "t")
    shard = tmp_path / "t" / shard_file_name(1, 3)
    shard.write_bytes(shard.read_bytes()[:-1])
    out = tmp_path / "m.safetensors"
    assert_clean_failure(consolidate(str(tmp_path), "-o", str(out)), str(shard), "truncated")
    assert not out.exists()


def test_a_manifest_with_a_wrong_shape(tmp_path):
    save_threads(tmp_path, "t")
    path = tmp_path / "t" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["params"]["b.bias"]["shape"] = [8]
    path.write_text(json.dumps(manifest))
    result = consolidate(str(tmp_path), "-o", str(tmp_path / "m.safetensors"))
    assert_clean_failure(result, str(path), "b.bias has shape [8]")


def test_latest_naming_a_missing_tag(tmp_path):
    save_threads(tmp_path, "t")
    (tmp_path / "latest").write_text("global_step7\n")
    result = consolidate(str(tmp_path), "-o", str(tmp_path / "m.safetensors"))
    assert_clean_failure(result, str(tmp_path / "latest"), "global_step7", "does not exist")


def test_a_corrupt_byte_is_caught_by_verify(tmp_path):
    save_threads(tmp_path, "t")
    shard = tmp_path / "t" / shard_file_name(0, 3)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x10
    shard.write_bytes(bytes(data))
    result = consolidate(str(tmp_path), "-o", str(tmp_path / "m.safetensors"), "--verify")
    assert_clean_failure(result, str(shard), "checksum")


def test_not_a_checkpoint_directory(tmp_path):
    result = consolidate(str(tmp_path), "-o", str(tmp_path / "m.safetensors"))
    assert_clean_failure(result, "no 'latest' file")
    result = consolidate(str(tmp_path / "nope"), "-o", str(tmp_path / "m.safetensors"))
    assert result.returncode == 2 and "no such directory" in result.stderr
