"""What the visibility tests share: running the `zlaunch` CLI, waiting, reading ranks.json."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def zlaunch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args], capture_output=True, text=True, timeout=timeout
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def ranks_state(runs: Path) -> list[dict]:
    try:
        return json.loads((runs / "latest" / "ranks.json").read_text())["ranks"]
    except (OSError, ValueError, KeyError):
        return []
