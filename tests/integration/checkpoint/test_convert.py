"""`zlaunch convert` of the DeepSpeed fixture to every target, read back by the libraries
that own each format: transformers' ``from_pretrained``, torch DCP (``dcp.load`` and
``format_utils.dcp_to_torch_save``), safetensors, and this runtime's own reader. No process
group; the expected tensors are the fp32 masters DeepSpeed's partitions hold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

from runtime.checkpoint.export import convert
from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from tests.unit.checkpoint.test_convert import (  # shared with the unit half
    CASE,
    FIXTURE,
    config_dir,  # noqa: F401 - fixtures, shared with the unit half
)


def test_the_command_line_and_a_clean_failure(tmp_path, config_dir):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "zlaunch", "convert", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = run(
        str(FIXTURE / CASE),
        "-o",
        str(tmp_path / "hf"),
        "--to",
        "hf",
        "--hf-config",
        str(config_dir),
    )
    assert ok.returncode == 0, ok.stderr
    assert "(deepspeed checkpoint)" in ok.stdout and (tmp_path / "hf" / "config.json").is_file()
    bad = run(str(FIXTURE / CASE), "-o", str(tmp_path / "hf2"), "--to", "hf")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "pass --hf-config" in bad.stderr


def _masters(case: str) -> dict[str, torch.Tensor]:
    with DeepSpeedReader(str(FIXTURE / case / "global_step3")) as reader:
        return {n: reader.read_full(n).clone() for n in reader.shapes}


def test_a_reexport_killed_half_way_leaves_the_old_model_whole(tmp_path, config_dir):
    """A re-export into a folder holding a model, SIGKILLed with half its shards written: the
    folder still loads as the old model, every tensor (never some new and the rest old), the
    user's other files are there; the next export replaces it whole and keeps them."""
    from transformers import AutoModelForCausalLM

    old, new = _masters("zero2_fp32"), _masters(CASE)
    assert all(not torch.equal(old[n], new[n]) for n in old)
    out = tmp_path / "hf"
    convert(
        str(FIXTURE / "zero2_fp32"), str(out), "hf", hf_config=str(config_dir), max_shard_bytes=1
    )
    (out / "tokenizer.json").write_text('{"version": "1.0"}')
    ready = tmp_path / "ready"
    argv = [sys.executable, "-m", "tests.integration.checkpoint.export_until_killed",
            str(FIXTURE / CASE), str(out), str(config_dir), str(ready)]  # fmt: skip
    child = subprocess.Popen(argv, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), child.communicate()[1].decode()[-2000:]
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)

    def loaded() -> dict[str, torch.Tensor]:
        return AutoModelForCausalLM.from_pretrained(str(out)).state_dict()

    state = loaded()
    assert all(torch.equal(state[n], old[n]) for n in old)  # every tensor the old one's
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".hf.partial-")]  # killed
    convert(str(FIXTURE / CASE), str(out), "hf", hf_config=str(config_dir), force=True)
    state = loaded()
    assert all(torch.equal(state[n], new[n]) for n in new)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]  # the 21 old shards gone, the tokenizer carried over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "ready"]  # nothing left over
