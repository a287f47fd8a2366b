"""The CLI must start fast: importing it must not pull in torch, fabric, rich or the runtime."""

import subprocess
import sys

HEAVY = ("torch", "fabric", "rich", "runtime", "paramiko", "invoke")


def test_cli_import_is_light():
    code = f"import sys, zlaunch.cli\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import zlaunch.cli pulled in: {out.stdout.strip()}"


def test_help_runs():
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "Usage: zlaunch" in out.stdout
    assert "run" in out.stdout


def test_version_runs():
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "zlaunch" in out.stdout
