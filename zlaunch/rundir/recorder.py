"""The controller's writer of the run directory: run.json's status and attempts, the rank
logs, metrics.jsonl, ranks.json and failure.json, all through the typed records of
zlaunch/rundir/records.py. The read side (``zlaunch ls/logs/status/stop/stacks``) reads the same
files through the same types (zlaunch/rundir/layout.py).

A write that fails (disk full, directory gone, a file system gone read-only) is said once per
file on the console and never stops the job: the ranks' training matters more than its
bookkeeping. Every writer below goes through `Recorder._guarded`, so none can forget to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Protocol, TypeVar

from zlaunch.job import LaunchOptions, Plan
from zlaunch.rundir.index import register
from zlaunch.rundir.layout import RunDir, new_run_id, plan_record
from zlaunch.rundir.records import FailureReport, RankRow, RanksFile, RunStatus
from zlaunch.text import redact_argv

__all__ = ["Recorder"]

T = TypeVar("T")

RANKS_MIN_INTERVAL = 1.0
"""Seconds between ranks.json rewrites, at least (the launcher writes what changed in between
a moment later, and the attempt's end at once)."""
RANKS_COST_SHARE = 20
"""...and at least this many times the last rewrite's duration: the file, a row per rank,
takes the controller at most 1/20 of its time however many ranks there are (at 16,384 ranks
a rewrite takes some 0.2 s: every 4 s)."""
LOG_BUFFER_BYTES = 4 * 1024 * 1024
"""Rank-log bytes held, all ranks together, before they are written whatever the time: the
loop writes them whenever it has nothing waiting (so a quiet job's lines reach the file at
once) and a few times a second while busy (one write per rank for many frames)."""


class Notes(Protocol):
    """What the recorder needs of whoever shows the job (the launcher's console): a place to
    say that a write failed. The run directory sits below the console and never imports it."""

    def note(self, text: str, *, error: bool = False) -> None: ...


class Recorder:
    def __init__(self, run_dir: RunDir, console: Notes, index_error: str = ""):
        self.run_dir = run_dir
        self.console = console
        self.index_error = index_error
        """'' or why the run is not in the per-user index (said with the run's id)."""
        self._metrics: IO[str] | None = None
        self._ranks_written = -float("inf")  # monotonic
        self._ranks_cost = 0.0
        """Seconds the last ranks.json rewrite took."""
        self._collectives: dict[int, dict[str, Any]] = {}
        self.failed_writes: dict[str, str] = {}
        """What could not be written (file -> the first error), each said once."""
        self._unwritten: dict[_RankLog, None] = {}
        """Rank logs holding bytes not written yet, in the order they got them."""
        self._unwritten_bytes = 0

    def _guarded(self, what: str, write: Callable[[], T]) -> T | None:
        """``write()``; an OSError is said once for ``what`` and swallowed (None).

        So is a ValueError: run.json read back unparsable, or a record its readers would not
        accept (``run_record.writable_run_record``: a controller bug). Either leaves the record
        incomplete, which is said; neither may stop the job it records.
        """
        try:
            return write()
        except (OSError, ValueError) as err:
            reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
            if what not in self.failed_writes:
                self.failed_writes[what] = reason
                self.console.note(
                    f"cannot write {what} in {self.path}: {reason}; the job goes "
                    "on, its record there is incomplete",
                    error=True,
                )
            return None

    @classmethod
    def create(cls, options: LaunchOptions, console: Notes) -> Recorder:
        run_dir = RunDir.create(
            options.log_dir,
            new_run_id(),
            {
                "config": options.config_path,
                "hosts": [h.name for h in options.hosts],
                "program": redact_argv(options.program),
                "cwd": options.cwd,
                "plan": None,
                # `zlaunch stop --save` sends save_on, and says where the checkpoint went
                "checkpoint_dir": options.checkpoint_dir,
                "save_on": options.save_on,
            },
        )
        try:  # indexed, so `zlaunch ls/logs/...` find it from anywhere
            register(run_dir.run_id, run_dir.path)
            index_error = ""
        except OSError as err:
            index_error = f" (not indexed: {err.strerror or err}; use --log-dir to find it)"
        return cls(run_dir, console, index_error)

    @property
    def run_id(self) -> str:
        return self.run_dir.run_id

    @property
    def path(self) -> str:
        return self.run_dir.path

    # ---- run.json -----------------------------------------------------------------------

    def status(self, status: RunStatus) -> None:
        self._guarded("run.json", lambda: self.run_dir.update(status=status))

    def planned(self, plan: Plan) -> None:
        record = plan_record(plan)
        self._guarded(
            "run.json", lambda: self.run_dir.update(status=RunStatus.RUNNING, plan=record)
        )

    def restarting(self) -> None:
        """The next attempt is starting: the run is live again."""
        self._guarded(
            "run.json",
            lambda: self.run_dir.update(status=RunStatus.STARTING, end_time=None, exit_code=None),
        )

    def attempt(
        self,
        first: LaunchOptions,
        attempt: int,
        options: LaunchOptions,
        reason: str,
        change: dict[str, Any] | None = None,
    ) -> None:
        """run.json's "attempts": each attempt's hosts, world size, batch and why it started;
        ``change``: the fleet change that started it (which hosts were lost or preempted, the
        step saved at, the steps and seconds it cost)."""

        def write() -> None:
            record = self.run_dir.record()
            started = record.get("start_time")
            attempts = record.get("attempts") or [_attempt_entry(0, first, "start", started)]
            attempts = [a for a in attempts if a["attempt"] != attempt]  # a retried start
            entry = _attempt_entry(attempt, options, reason, time.time())
            if change is not None:
                entry["change"] = change
            attempts.append(entry)
            self.run_dir.update(attempts=attempts)

        self._guarded("run.json", write)

    def warnings(self, attempt: int, texts: Sequence[str]) -> None:
        """run.json's "warnings": what an attempt's end said beside its outcome."""

        def write() -> None:
            kept = list(self.run_dir.record().get("warnings") or [])
            kept += [{"attempt": attempt, "text": text} for text in texts]
            self.run_dir.update(warnings=kept)

        self._guarded("run.json", write)

    def end(self, status: RunStatus, code: int, error: str | None = None) -> None:
        """The run's end (once: a later call keeps the first end)."""

        def write() -> None:
            try:
                record = self.run_dir.record()
            except ValueError:  # unreadable run.json: the end is what it can still say
                record = {}
            if record.get("end_time") is not None:
                return
            if error is not None:
                record["error"] = error
            record.update(status=status, exit_code=code, end_time=time.time())
            self.run_dir.write_record(record)

        self._guarded("run.json", write)

    # ---- attempt files ------------------------------------------------------------------

    def open_rank_log(self, attempt: int, host: str, rank: int) -> _RankLog:
        what = f"rank {rank}'s log"
        log = self._guarded(what, lambda: self.run_dir.open_rank_log(attempt, host, rank))
        return _RankLog(log, lambda write: self._guarded(what, write), self)

    def _hold(self, log: _RankLog, size: int) -> None:
        """``log`` holds ``size`` more bytes; all are written once LOG_BUFFER_BYTES wait."""
        self._unwritten[log] = None
        self._unwritten_bytes += size
        if self._unwritten_bytes >= LOG_BUFFER_BYTES:
            self.write_logs()

    def write_logs(self) -> None:
        """Write every rank log's held bytes (one write per rank)."""
        logs, self._unwritten = self._unwritten, {}
        self._unwritten_bytes = 0
        for log in logs:
            log.write_held()

    def open_metrics(self) -> None:
        if self._metrics is None:
            self._metrics = self._guarded("metrics.jsonl", self.run_dir.open_metrics)

    def metrics(self, row: dict[str, Any]) -> None:
        metrics = self._metrics
        if metrics is not None and "metrics.jsonl" not in self.failed_writes:

            def write() -> None:
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()

            self._guarded("metrics.jsonl", write)

    def ranks_due(self) -> bool:
        """Whether ranks.json may be rewritten now (RANKS_MIN_INTERVAL, RANKS_COST_SHARE)."""
        since = time.monotonic() - self._ranks_written
        return since >= max(RANKS_MIN_INTERVAL, RANKS_COST_SHARE * self._ranks_cost)

    def ranks(self, attempt: int, rows: Sequence[RankRow]) -> None:
        started = time.monotonic()
        now = time.time()
        self._guarded(
            "ranks.json", lambda: self.run_dir.write_ranks(RanksFile(attempt, now, tuple(rows)))
        )
        self._ranks_written = time.monotonic()
        self._ranks_cost = self._ranks_written - started

    def collectives(self, rank: int, event: dict[str, Any]) -> None:
        """A rank's collective records, as its agent sent them with a stacks request."""
        self._collectives[rank] = {"records": event["records"], "received": time.time()}
        self._guarded("collectives.json", lambda: self.run_dir.write_collectives(self._collectives))

    def failure(self, report: FailureReport) -> None:
        self._guarded("failure.json", lambda: self.run_dir.write_failure(report))

    def close(self) -> None:
        if self._metrics is not None:
            metrics, self._metrics = self._metrics, None
            self._guarded("metrics.jsonl", metrics.close)


class _RankLog:
    """A rank's log file whose failed writes are reported (once) instead of raised; with no file
    (it could not be opened) the lines still reach the console, only the log lacks them.

    Bytes are held until the recorder writes them (`Recorder.write_logs`), in order, all of
    them: a rank log never drops a byte."""

    __slots__ = ("_file", "_guard", "_recorder", "_held")

    def __init__(
        self,
        file: IO[bytes] | None,
        guard: Callable[[Callable[[], Any]], Any],
        recorder: Recorder | None = None,
    ):
        self._file = file
        self._guard = guard
        self._recorder = recorder
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if self._file is None:
            return
        self._held.append(data)
        if self._recorder is None:
            self.write_held()
        else:
            self._recorder._hold(self, len(data))

    def write_held(self) -> None:
        if self._file is None or not self._held:
            return
        file, data = self._file, b"".join(self._held)
        self._held.clear()
        self._guard(lambda: _write_all(file, data))

    def close(self) -> None:
        if self._file is not None:
            self.write_held()
            file, self._file = self._file, None
            self._guard(file.close)


def _write_all(file: IO[bytes], data: bytes) -> None:
    """Every byte, in order (an unbuffered write may take only part of a large one)."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]


def _attempt_entry(
    attempt: int, options: LaunchOptions, reason: str, at: float | None
) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "hosts": [h.name for h in options.hosts],
        "world_size": options.world_size,
        "batch": options.batch,
        "reason": reason,
        "start_time": at,
    }
