"""Run a client script under zlaunch or torchrun, as a user would, and read what it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without thread or accelerate settings, plus ``extra``."""
    drop = {"OMP_NUM_THREADS", "ACCELERATE_USE_CPU"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def zlaunch(tmp_path: Path, ranks: int, script: str, *args: str, env=None, options=()):
    """``zlaunch --nproc_per_node RANKS script args``; (completed process, run.json)."""
    runs = tmp_path / "runs"
    argv = [
        sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--nproc_per_node", str(ranks),
        *options, str(HERE / script), *args,
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp_path, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )
    run_dir = runs / os.readlink(runs / "latest")
    return done, json.loads((run_dir / "run.json").read_text())


def torchrun(tmp_path: Path, ranks: int, script: str, *args: str, env=None):
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
        "--standalone", str(HERE / script), *args,
    ]  # fmt: skip
    return subprocess.run(
        argv, cwd=tmp_path, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )


def loss_lines(output: str) -> list[str]:
    """The ``step N loss HEX`` lines of rank 0, without any launcher's rank tag."""
    return [line[line.index("step ") :] for line in output.splitlines() if " loss 0x" in line]
