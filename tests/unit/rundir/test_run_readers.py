"""The run directory as its readers meet it: run.json checked field by field (and refused by
the writer when a reader would drop it), runs found by their directory's name, a FIFO or an
unreadable root never a hang or a lost index entry."""

from __future__ import annotations

import json
import math
import os

import pytest


def _run(root, run_id: str, record) -> None:
    path = root / run_id
    path.mkdir(parents=True, mode=0o700)
    (path / "run.json").write_text(json.dumps(record))


def test_runs_are_found_by_directory_name_not_by_what_run_json_says(tmp_path):
    from zlaunch.commands.runs_common import known_runs

    _run(tmp_path, "20260101-000000-aaaaaa", {"run_id": "../../elsewhere", "start_time": 5.0})
    _run(tmp_path, "20260101-000001-bbbbbb", {})
    _run(tmp_path, "20260101-000002-cccccc", [])
    runs, _ = known_runs(str(tmp_path))
    assert [(run.path, rec["run_id"]) for run, rec in runs] == [
        (str(tmp_path / "20260101-000001-bbbbbb"), "20260101-000001-bbbbbb"),
        (str(tmp_path / "20260101-000000-aaaaaa"), "20260101-000000-aaaaaa"),
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [("start_time", math.nan), ("start_time", 1e20), ("hosts", [1]), ("exit_code", "3"),
     ("plan", {"nodes": [{"host": "h", "workers": [{"rank": "x"}]}]}), ("controller_pid", -1)],
)  # fmt: skip
def test_a_bad_run_json_field_is_left_out_and_named(field, value):
    from zlaunch.rundir.run_record import checked_run_record

    record, problems = checked_run_record({field: value, "cwd": "/w"}, "20260101-000000-aaaaaa")
    assert record == {"cwd": "/w", "run_id": "20260101-000000-aaaaaa"}
    assert problems and problems[0].startswith(f"{field} is not ")


def test_a_fifo_run_json_is_a_bad_run_not_a_hang(tmp_path):
    from zlaunch.rundir.layout import RunDir

    (tmp_path / "r").mkdir()
    os.mkfifo(tmp_path / "r" / "run.json")
    with pytest.raises(ValueError, match="not a regular file"):
        RunDir(str(tmp_path / "r"), "r").record()


def test_an_unreadable_run_root_deletes_no_index_entry_and_a_gone_run_does(tmp_path, monkeypatch):
    from zlaunch.rundir import index as run_index

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _run(tmp_path / "root", "20260101-000000-aaaaaa", {})
    run_index.register("20260101-000000-aaaaaa", str(tmp_path / "root" / "20260101-000000-aaaaaa"))
    run_index.register("20260101-000001-gone00", str(tmp_path / "root" / "20260101-000001-gone00"))
    run_index.register("20260101-000002-unmnt0", str(tmp_path / "unmounted" / "x"))
    links = tmp_path / "state" / "zlaunch" / "runs"
    real_stat = os.stat

    def stat_denied(path, *args, **kwargs):  # the root unreadable for a moment
        if str(path).startswith(str(tmp_path / "root")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_denied)
    assert run_index.indexed_run_paths() == []
    assert len(os.listdir(links)) == 3  # nothing forgotten on a transient error
    monkeypatch.setattr(os, "stat", real_stat)
    assert run_index.indexed_run_paths() == [str(tmp_path / "root" / "20260101-000000-aaaaaa")]
    assert sorted(os.listdir(links)) == ["20260101-000000-aaaaaa", "20260101-000002-unmnt0"]


def test_a_link_removed_while_listing_is_skipped(tmp_path, monkeypatch):
    from zlaunch.rundir import index as run_index

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _run(tmp_path / "root", "20260101-000000-aaaaaa", {})
    run_index.register("20260101-000000-aaaaaa", str(tmp_path / "root" / "20260101-000000-aaaaaa"))

    def raced(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "readlink", raced)
    assert run_index.indexed_run_paths() == []


@pytest.mark.parametrize(
    "fields,named",
    [({"statsu": "running"}, "statsu is not a field of run.json"),
     ({"exit_code": "1"}, "exit_code is not an exit code"),
     ({"hosts": ["a", 1]}, "hosts is not a list of host names")],
)  # fmt: skip
def test_the_writer_refuses_a_run_json_field_its_readers_would_drop(tmp_path, fields, named):
    from zlaunch.rundir.layout import RunDir

    run = RunDir.create(str(tmp_path / "runs"), "20260101-000000-aaaaaa", {"cwd": "/w"})
    before = (tmp_path / "runs" / "20260101-000000-aaaaaa" / "run.json").read_bytes()
    with pytest.raises(ValueError, match=named):
        run.update(**fields)
    # nothing was written: the file is the one before the refused update
    assert (tmp_path / "runs" / "20260101-000000-aaaaaa" / "run.json").read_bytes() == before
    assert run.update(exit_code=1, warnings=[{"attempt": 0, "text": "w"}])["exit_code"] == 1
    with pytest.raises(ValueError, match="warnings is not"):
        run.update(warnings=["w"])
