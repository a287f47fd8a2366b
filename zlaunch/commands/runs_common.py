"""What the run-directory commands (ls, logs, status, stop, plot) share.

They only read the run directory (`zlaunch.rundir`), so they work from any terminal while the
job runs and after it ended. A run is "ended" when its run.json says so, or when the
controller that wrote it is no longer alive on this machine (killed without cleanup).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import click

from zlaunch.commands.run_choice import started_here
from zlaunch.errors import UsageError, ZlaunchError
from zlaunch.job import DEFAULT_LOG_DIR
from zlaunch.rundir import (
    RunDir,
    RunStatus,
    default_log_dir,
    index_dir,
    indexed_run_paths,
    lock_holder,
    process_identity,
    run_paths,
)
from zlaunch.text import clip
from zlaunch.wire import checked_metrics

__all__ = [
    "run_options",
    "open_run",
    "known_runs",
    "controller_alive",
    "controller_to_signal",
    "effective_status",
    "run_ended",
    "engine_rows",
    "last_engine_row",
]

TAIL_BLOCK = 64 * 1024


def run_options(func: Callable) -> Callable:
    """``[RUN]`` (id or unique prefix; default: the running one, else the latest) and
    ``--log-dir`` (default: every run of this user, from any directory)."""
    func = click.option(
        "--log-dir",
        default=None,
        help="Only the runs under this directory. Default: every run of this user "
        f"(the index in {_index_hint()}) and ./{DEFAULT_LOG_DIR}.",
    )(func)
    return click.argument("run", required=False)(func)


def _index_hint() -> str:
    return "$XDG_STATE_HOME/zlaunch/runs"


def known_runs(log_dir: str | None) -> tuple[list[tuple[RunDir, dict[str, Any]]], str]:
    """(run, run.json) of every run to choose from, oldest first, and where they were looked for.

    With --log-dir: the runs under it. Without: the user's index of runs (any directory),
    the runs under $ZLAUNCH_LOG_DIR or ./zlaunch_runs (runs from before the index), each once.
    """
    if log_dir is not None:
        roots = [os.path.abspath(os.path.expanduser(log_dir))]
        paths = run_paths(roots[0])
        where = roots[0]
    else:
        root = default_log_dir()
        paths = run_paths(root)
        paths += indexed_run_paths()
        where = f"{root} or the index of runs ({index_dir()})"
    seen: set[str] = set()
    runs = []
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        run = RunDir(path, os.path.basename(path))
        try:
            record = run.record()
        except (OSError, ValueError) as err:  # a bad run is skipped, said, never a crash
            click.echo(f"zlaunch: skipped run {run.run_id}: {_reason(err)}", err=True)
            continue
        if run.problems:
            click.echo(f"zlaunch: run {run.run_id}: run.json: {'; '.join(run.problems)}", err=True)
        runs.append((run, record))
    runs.sort(key=lambda item: (_start(item[1]), item[0].run_id))
    return runs, where


def _reason(err: Exception) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def _start(record: dict[str, Any]) -> float:
    stamp = record.get("start_time")
    return float(stamp) if isinstance(stamp, (int, float)) else 0.0


def open_run(log_dir: str | None, run: str | None, command: str = "status") -> RunDir:
    """The run RUN names (its id or a unique prefix); without RUN the one that is running, or
    the latest when none is. More than one running: the one started in this directory or the
    closest parent of it (commands/run_choice.py); still more than one: refused (exit 2),
    naming them."""
    runs, where = known_runs(log_dir)
    if not runs:
        raise UsageError(
            f"no runs in {where}",
            hint="give the run id (see `zlaunch ls`) and the --log-dir the job was started with",
        )
    if run is not None:
        matches = [item for item in runs if item[0].run_id == run] or [
            item for item in runs if item[0].run_id.startswith(run)
        ]
        if len(matches) == 1:
            return matches[0][0]
        if not matches:
            raise UsageError(
                f"no run matching {clip(run)} in {where}",
                hint="give the run id (see `zlaunch ls`) and the --log-dir the job was started with",
            )
        raise UsageError(
            f"{len(matches)} runs match {clip(run)}: "
            + ", ".join(item[0].run_id for item in matches[-5:]),
            hint="give more of the run id",
        )
    running = [item for item in runs if not run_ended(item[1])]
    if len(running) > 1:
        here = started_here(running, os.getcwd())
        if len(here) == 1:
            return here[0][0]  # the job of this directory (or of a parent of it)
        running = here or running
        listing = "\n".join(
            f"    {r.run_id}  started {_clock(rec)}  in {rec.get('cwd') or '-'}"
            for r, rec in running
        )
        raise UsageError(
            f"{len(running)} runs are running; zlaunch {command} will not guess which:\n{listing}",
            hint=f"name one: zlaunch {command} {running[-1][0].run_id}",
        )
    return (running or runs)[-1][0]


def _clock(record: dict[str, Any]) -> str:
    import datetime

    stamp = record.get("start_time")
    if not isinstance(stamp, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def controller_alive(record: dict[str, Any]) -> bool:
    """Whether the controller that owns the run still lives (checked on this machine): the
    process with its pid has the start time and boot recorded in run.json. A recycled pid
    belongs to a process started later, so it never matches."""
    recorded = record.get("controller")
    pid = record.get("controller_pid")
    if not isinstance(recorded, dict) or not isinstance(pid, int) or pid <= 0:
        return False
    return recorded.get("pid") == pid and process_identity(pid) == recorded


def controller_to_signal(run: RunDir, record: dict[str, Any], what: str) -> int:
    """The controller's pid, once proven: it holds the run's lock and matches the identity
    recorded at start. ZlaunchError otherwise: signalling a stranger is never an option."""
    pid = record.get("controller_pid")
    holder = lock_holder(run.path)
    if holder is None or holder != pid or not controller_alive(record):
        raise ZlaunchError(
            f"run {run.run_id}: its controller (pid {pid}) is not running on this machine; "
            f"nothing to {what}"
            + (f" (pid {pid} is another process now)" if process_identity(pid or 0) else ""),
            hint=f"zlaunch {what} must run on the machine that started the job, while it runs",
        )
    return pid


def effective_status(record: dict[str, Any]) -> RunStatus:
    """run.json's status, or LOST when it says running but its controller is gone."""
    status = RunStatus.parse(record.get("status")) or RunStatus.UNKNOWN
    if not status.ended and record.get("end_time") is None and not controller_alive(record):
        return RunStatus.LOST
    return status


def run_ended(record: dict[str, Any]) -> bool:
    if record.get("end_time") is not None:
        return True
    status = effective_status(record)
    return status.ended or status is RunStatus.LOST


def engine_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step-metrics rows (not the script's own ``log_metrics`` rows)."""
    checked = (checked_metrics(r).row for r in rows if isinstance(r, dict))
    return [r for r in checked if r is not None and r.get("source", "engine") == "engine"]


def last_engine_row(run: RunDir) -> dict[str, Any] | None:
    """The latest step-metrics row, read from the end of metrics.jsonl (runs can be long)."""
    path = os.path.join(run.path, "metrics.jsonl")
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            block = TAIL_BLOCK
            while True:
                handle.seek(max(0, size - block))
                lines = handle.read().split(b"\n")
                if size > block:
                    lines = lines[1:]  # the first one may be cut
                for raw in reversed(lines):
                    try:
                        row = json.loads(raw) if raw.strip() else None
                    except (ValueError, RecursionError):  # half-written right now, or garbage
                        continue
                    if isinstance(row, dict) and row.get("source", "engine") == "engine":
                        row = checked_metrics(row).row  # a bad row (NaN bytes) is no crash
                        if row is not None:
                            return row
                if block >= size:
                    return None
                block *= 8
    except FileNotFoundError:
        return None
