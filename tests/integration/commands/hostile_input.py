"""Running the real ``zlaunch`` command on hostile input, in a scratch directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["zlaunch", "write_script", "assert_usage_error"]


def zlaunch(
    tmp_path: Path,
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess:
    """``zlaunch ARGS`` started in ``tmp_path``, with HOME there too (no user env files)."""
    full_env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args],
        cwd=tmp_path,
        env=full_env,
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )


def write_script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def assert_usage_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one ``error:`` message holding every needle, no traceback; the message."""
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, (result.returncode, err[-2000:])
    assert "Traceback" not in err, err[-4000:]
    assert err.startswith("error: "), err[:2000]
    for needle in needles:
        assert needle in err, (needle, err[:2000])
    return err
