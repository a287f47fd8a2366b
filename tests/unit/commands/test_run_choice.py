"""Which running job `zlaunch status`/`stacks`/`stop` mean without a run id (pure, and through
open_run over real run directories whose controllers are alive: this test's own process)."""

from __future__ import annotations

import json
import os

import pytest

from zlaunch.commands.run_choice import started_here
from zlaunch.commands.runs_common import open_run
from zlaunch.errors import UsageError
from zlaunch.rundir.layout import process_identity


def _runs(*cwds: str | None) -> list[tuple[str, dict]]:
    return [(f"run{i}", {"cwd": cwd} if cwd is not None else {}) for i, cwd in enumerate(cwds)]


@pytest.mark.parametrize(
    "cwds,here,expected",
    [
        (("/p/a", "/p/b"), "/p/a", ["run0"]),
        (("/p/a", "/p/b"), "/p/a/out/logs", ["run0"]),  # below the job's directory
        (("/p/a", "/p/ab"), "/p/ab", ["run1"]),  # a prefix of a name is not a parent
        (("/p", "/p/a"), "/p/a/x", ["run1"]),  # the closest parent wins
        (("/p", "/p/a"), "/p", ["run0"]),
        (("/p/a", "/p/a"), "/p/a", ["run0", "run1"]),  # two jobs here: still ambiguous
        (("/p/a", "/p/b"), "/q", []),
        ((None, "/p/b"), "/p/b", ["run1"]),  # a record without cwd matches nothing
        (("/", "/p"), "/x", ["run0"]),
    ],
)
def test_started_here(cwds, here, expected):
    assert [run for run, _ in started_here(_runs(*cwds), here)] == expected


def _running_run(root, run_id: str, cwd: str, start: float) -> None:
    path = root / run_id
    path.mkdir(parents=True)
    me = os.getpid()
    record = {
        "run_id": run_id, "status": "running", "start_time": start, "cwd": cwd,
        "controller_pid": me, "controller": process_identity(me),
    }  # fmt: skip
    (path / "run.json").write_text(json.dumps(record))


def test_open_run_prefers_the_job_of_this_directory_and_refuses_only_when_ambiguous(
    tmp_path, monkeypatch
):
    runs = tmp_path / "runs"
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    _running_run(runs, "20261201-000001-aaaaaa", str(tmp_path / "a"), 1.0)
    _running_run(runs, "20261201-000002-bbbbbb", str(tmp_path / "b"), 2.0)
    monkeypatch.chdir(tmp_path / "a" / "sub")
    assert open_run(str(runs), None).run_id == "20261201-000001-aaaaaa"
    monkeypatch.chdir(tmp_path / "b")
    assert open_run(str(runs), None, "stacks").run_id == "20261201-000002-bbbbbb"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="2 runs are running; zlaunch stacks will not guess"):
        open_run(str(runs), None, "stacks")
    _running_run(runs, "20261201-000003-cccccc", str(tmp_path / "b"), 3.0)
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(UsageError) as refused:
        open_run(str(runs), None, "status")
    assert "2 runs are running" in refused.value.message
    assert "aaaaaa" not in refused.value.message  # only the ones that matched are listed
