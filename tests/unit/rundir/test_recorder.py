"""The recorder's promise: a write that fails is said once per file and never stops the job."""

from __future__ import annotations

import errno

from zlaunch.rundir.recorder import Recorder
from zlaunch.rundir.records import RunStatus


class FullDisk:
    """A run directory on a full disk: every write raises ENOSPC."""

    path = "/runs/r1"

    def _full(self, *_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    update = write_record = write_ranks = write_failure = open_metrics = _full

    def open_rank_log(self, *_args):
        return FullFile()

    def record(self):
        return {}


class FullFile:
    closed = 0

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        FullFile.closed += 1


class Notes:
    def __init__(self):
        self.said = []

    def note(self, text, error=False):
        self.said.append((text, error))


def test_every_writer_survives_a_full_disk_and_says_so_once_per_file():
    notes = Notes()
    recorder = Recorder(FullDisk(), notes)
    recorder.status(RunStatus.RUNNING)
    recorder.status(RunStatus.STOPPING)
    recorder.restarting()
    recorder.open_metrics()
    recorder.metrics({"step": 1})
    recorder.ranks(0, [])
    recorder.failure(object())
    log = recorder.open_rank_log(0, "node1", 3)
    log.write(b"a line\n")
    log.write(b"another\n")
    log.close()
    recorder.end(RunStatus.FAILED, 1, "boom")
    recorder.close()
    files = [text.split(" in /runs/r1")[0] for text, error in notes.said if error]
    assert files == [
        "cannot write run.json",
        "cannot write metrics.jsonl",
        "cannot write ranks.json",
        "cannot write failure.json",
        "cannot write rank 3's log",
    ]
    assert all("No space left on device" in text for text, _ in notes.said)
    assert FullFile.closed == 1
    assert set(recorder.failed_writes) == {
        "run.json",
        "metrics.jsonl",
        "ranks.json",
        "failure.json",
        "rank 3's log",
    }


def test_a_record_its_readers_would_refuse_is_said_and_the_job_goes_on(tmp_path):
    """A controller bug that builds a bad run.json field costs the record, never the job."""
    from zlaunch.rundir.layout import RunDir

    run_dir = RunDir.create(str(tmp_path / "runs"), "20260101-000000-aaaaaa", {"cwd": "/w"})
    notes = Notes()
    recorder = Recorder(run_dir, notes)
    recorder.warnings(0, [7, 8])  # not texts: the readers' table refuses them
    recorder.warnings(0, [9])
    recorder.status(RunStatus.RUNNING)  # later writes of run.json still happen
    assert [text.split(" in ")[0] for text, _ in notes.said] == ["cannot write run.json"]
    assert "warnings is not a list of attempts' warnings" in notes.said[0][0]
    assert run_dir.record()["status"] == RunStatus.RUNNING
    assert "warnings" not in run_dir.record()
