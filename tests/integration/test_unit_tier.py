"""The unit tier's promises, checked from outside: the launcher's unit tests run where torch is
not installed, and a unit test that starts a process fails with the tier's own error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)


def _pytest(tmp_path, *args):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_launchers_unit_tests_run_without_torch(tmp_path):
    done = _pytest(tmp_path, "tests/unit/launcher")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "error" not in done.stdout.splitlines()[-1]


def test_a_unit_test_that_starts_a_process_fails_with_the_tiers_error(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "conftest.py").write_text((REPO / "tests" / "unit" / "conftest.py").read_text())
    (tier / "test_probe.py").write_text(
        "import subprocess\n\n\ndef test_probe():\n    subprocess.run(['true'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tier),
         str(tier)],
        cwd=tier, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:]
    assert "UnitTierViolation" in done.stdout and "move it to tests/integration/" in done.stdout
