"""Config files DeepSpeed reads are read here (hjson: comments, trailing commas), hostile files
end in one ConfigError (exit 2 from zlaunch, no traceback), and what DeepSpeed would silently
ignore (unknown keys, enabled features this runtime lacks, optimizers it cannot build) is
refused before launch.

Where DeepSpeed is installed, its own config reader (DeepSpeedConfig) reads the same files.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.config.cli_utils import dry_run
from tests.integration.engine.mp_utils import REPO
from tests.unit.config.test_fidelity_config import (  # shared with the unit half
    HJSON_TEXT,
    _alias_bomb,
)

# --- hjson ---------------------------------------------------------------------------------------


# --- hostile files: one ConfigError, bounded ------------------------------------------------------


# --- refused before launch --------------------------------------------------------------------------


# --- through the real zlaunch command -----------------------------------------------------------


CLI_CASES = [
    ("bomb.yaml", _alias_bomb()),
    ("listkey.yaml", "? [a, b]\n: 1\n"),
    ("recursive.yaml", "a: &a [1, *a]\n"),
    ("deep.json", '{"a": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("bigint.json", '{"train_batch_size": ' + "7" * 5000 + "}"),
    ("optauto.json", '{"train_batch_size": 1, "optimizer": {"type": "auto"}}'),
    ("schedlist.json", '{"train_batch_size": 1, "scheduler": {"type": ["WarmupLR"]}}'),
    ("unknown.json", '{"train_batch_size": 1, "gradient_clipings": 1}'),
    ("lamb.json", '{"train_batch_size": 1, "optimizer": {"type": "Lamb"}}'),
    (
        "betas.json",
        '{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"betas": 0.9}}}',
    ),
    ("comet.json", '{"train_batch_size": 1, "comet": {"enabled": true}}'),
]


@pytest.mark.parametrize(("name", "text"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_zlaunch_exits_2_with_one_message_and_no_traceback(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    (tmp_path / "train.py").write_text("print('never runs')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZLAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--dry-run", "train.py", "--config", name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "never runs" not in done.stdout
    assert name in done.stderr
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert 1 <= len(lines) <= 3 and all(len(x) < 500 for x in lines), done.stderr


def test_valid_hjson_config_passes_the_cli(tmp_path):
    done = dry_run(tmp_path, HJSON_TEXT)
    assert done.returncode == 0, done.stderr
