"""Issue 13 item 7: secrets never reach the run directory or the dry-run plan, and the run
directory is private. Through the real ``zlaunch`` command."""

from __future__ import annotations

import os
import stat

from tests.integration.hardening.helpers import write_script, zlaunch
from zlaunch.redact import (
    NOT_RECORDED,
)

SECRET = "hunter2x"
# Names that the old TOKEN|SECRET|PASSWORD|KEY pattern missed, and a value-borne secret.
ENV = {
    "DB_PASSWD": SECRET,
    "DATABASE_URL": f"postgres://app:{SECRET}@db.internal:5432/prod",
    "GH_PAT": f"ghp_{SECRET}",  # hidden by its name (the value is not a token's shape)
    "AUTH_BEARER": SECRET,
    "INNOCENT_LOOKING": SECRET,
}
ARGS = (f"--api-token={SECRET}", "--password", SECRET, "--lr", "0.1")


def _env_args() -> list[str]:
    args = []
    for name in ENV:
        args += ["--env", name]  # value from the environment: not visible in `ps`
    return args


def test_run_directory_holds_no_secret_and_is_private(tmp_path):
    script = write_script(tmp_path, "w.py", "print('hello')\n")
    result = zlaunch(
        tmp_path, "--log-dir", "runs", "--num-gpus", "2", *_env_args(), script, *ARGS, env=ENV
    )
    assert result.returncode == 0, result.stderr.decode()
    runs = tmp_path / "runs"
    seen = []
    for root, dirs, files in os.walk(runs):
        for name in dirs:
            mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
            assert mode == 0o700, (os.path.join(root, name), oct(mode))
        for name in files:
            path = os.path.join(root, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
            with open(path, "rb") as f:
                assert SECRET.encode() not in f.read(), path
            seen.append(name)
    assert stat.S_IMODE(os.stat(runs).st_mode) == 0o700
    assert "run.json" in seen and "rank-1.log" in seen
    record = (next(runs.glob("*/run.json"))).read_text()
    assert "DB_PASSWD" in record and NOT_RECORDED in record  # names stay, values do not


def test_dry_run_shows_no_secret(tmp_path):
    script = write_script(tmp_path, "w.py", "pass\n")
    result = zlaunch(tmp_path, "--dry-run", "--num-gpus", "2", *_env_args(), script, *ARGS, env=ENV)
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    for name in ("DB_PASSWD", "GH_PAT", "AUTH_BEARER", "DATABASE_URL"):
        assert name in out
    assert "postgres://app:<redacted>@db.internal:5432/prod" in out
    # INNOCENT_LOOKING cannot be told from a harmless name: the user sees it in their own plan.
    assert out.count(SECRET) == out.count(f"INNOCENT_LOOKING={SECRET}") == 1
