"""`zlaunch convert` of the DeepSpeed fixture to every target, read back by the libraries
that own each format: transformers' ``from_pretrained``, torch DCP (``dcp.load`` and
``format_utils.dcp_to_torch_save``), safetensors, and this runtime's own reader. No process
group; the expected tensors are the fp32 masters DeepSpeed's partitions hold."""

from __future__ import annotations

import subprocess
import sys

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
