"""A job run in a working directory that other users write to: modules planted there (and in
the script's own folder, beyond what ``python SCRIPT`` reads) are never imported, by the
agent, the workers' boot or the probes, on every Python the project supports."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The interpreters of this machine the project supports (the agent side is stdlib only).
PYTHONS = sorted(
    {sys.executable, *glob.glob("/root/.pyenv/versions/3.1[02].*/bin/python")},
)

PLANT = "open({marker!r}, 'a').write({name!r} + ' from ' + __file__ + '\\n')\n"


def _plant(folder: Path, marker: Path) -> None:
    """A module for every standard module's name (and zlaunch's, runtime's, torch's and the
    site hooks'), each of which records that it was imported and then fails."""
    names = set(sys.stdlib_module_names) - {"sys", "builtins"}
    names |= {"sitecustomize", "usercustomize", "__future__", "torch", "numpy"}
    for name in names:
        body = PLANT.format(marker=str(marker), name=name) + "raise ImportError('planted')\n"
        (folder / f"{name}.py").write_text(body)
    for package in ("zlaunch", "runtime"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text(
            PLANT.format(marker=str(marker), name=package)
        )


@pytest.mark.parametrize(
    "python", PYTHONS, ids=lambda p: Path(p).parts[-3] if "pyenv" in p else "this"
)
def test_modules_planted_in_the_working_directory_are_never_imported(tmp_path, python):
    marker = tmp_path / "imported"
    shared, private, start = tmp_path / "shared", tmp_path / "private", tmp_path / "start"
    for folder in (shared, private, start):
        folder.mkdir()
    _plant(shared, marker)
    _plant(private, marker)  # `python train.py` imports none of them: the boot must not either
    (private / "train.py").write_text("import os\nprint('rank', os.environ['RANK'], 'trained')\n")
    startup = shared / "startup.py"
    startup.write_text(PLANT.format(marker=str(marker), name="PYTHONSTARTUP"))
    env = {
        **os.environ,
        "HOME": str(start),
        "NO_COLOR": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONSTARTUP": str(startup),  # forwarded to the ranks (PYTHON*): never read by them
    }
    result = subprocess.run(
        [sys.executable, "-m", "zlaunch", "run", "--num-gpus", "2", "--python", python,
         "--chdir", str(shared), "--log-dir", str(start / "runs"),
         "--env", f"PYTHONPATH={REPO}:",  # an empty entry: the working directory at start-up
         str(private / "train.py")],
        cwd=start, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 trained" in result.stdout and "rank 1 trained" in result.stdout
    assert "PYTHONPATH has an empty entry" in result.stderr
    assert not marker.exists(), marker.read_text()
