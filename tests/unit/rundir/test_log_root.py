"""A log root another user can write is refused, and every file of a run
directory is opened relative to the directory's descriptor, never through a planted link."""

from __future__ import annotations

import json
import os
import secrets

import pytest

from zlaunch.rundir.layout import RUN_FILE, RunDir
from zlaunch.rundir.root import LogRootError


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_log_root_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o755)
    os.chown(root, 4321, 4321)
    with pytest.raises(LogRootError, match=r"is owned by another user \(uid 4321\)"):
        RunDir.create(str(root), "20260101-000000-aaaaaa", {})


def test_a_missing_log_root_is_created_private(tmp_path):
    run = RunDir.create(str(tmp_path / "new" / "runs"), "20260101-000000-aaaaaa", {})
    assert (os.stat(tmp_path / "new" / "runs").st_mode & 0o777) == 0o700
    assert run.record()["run_id"] == "20260101-000000-aaaaaa"


def test_planted_links_in_the_run_directory_never_redirect_a_write(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    victim.chmod(0o600)
    run = RunDir.create(str(tmp_path / "runs"), "20260101-000000-aaaaaa", {})
    # Temporary names are random; here the first is known, as if someone guessed it.
    names = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(names))
    for guessed in (f"{RUN_FILE}.tmp.{'0' * 16}", f"{RUN_FILE}.tmp.{os.getpid()}"):
        os.symlink(victim, os.path.join(run.path, guessed))
    run.update(status="running")
    assert victim.read_text() == "the user's own file\n"
    assert (
        json.loads((tmp_path / "runs" / run.run_id / RUN_FILE).read_text())["status"] == "running"
    )
    os.symlink(victim, os.path.join(run.path, "metrics.jsonl"))
    with pytest.raises(OSError):
        run.open_metrics()
    os.makedirs(os.path.join(run.path, "attempt-0", "h"))
    os.symlink(victim, os.path.join(run.path, "attempt-0", "h", "rank-0.log"))
    with pytest.raises(OSError):
        run.open_rank_log(0, "h", 0)
    assert victim.read_text() == "the user's own file\n"


def test_a_run_directory_swapped_for_a_link_is_not_written_through(tmp_path):
    run = RunDir.create(str(tmp_path / "runs"), "20260101-000000-aaaaaa", {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(run.path, tmp_path / "moved")
    os.symlink(elsewhere, run.path)
    run.update(status="running")  # through the descriptor: the directory it created
    assert os.listdir(elsewhere) == []
    assert json.loads((tmp_path / "moved" / RUN_FILE).read_text())["status"] == "running"
