"""Running the zlaunch CLI from runtime tests: a config checked the way users' configs are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def dry_run(directory: Path, config_text: str) -> subprocess.CompletedProcess:
    """``zlaunch --dry-run train.py --config ds.json`` in ``directory`` with this config (the
    script only prints), without the caller's ZLAUNCH_* settings."""
    (directory / "ds.json").write_text(config_text)
    (directory / "train.py").write_text("print('never runs')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZLAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", "--dry-run", "train.py", "--config", "ds.json"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
