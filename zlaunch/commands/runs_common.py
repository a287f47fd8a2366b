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

from zlaunch.errors import UsageError, ZlaunchError
from zlaunch.options import DEFAULT_LOG_DIR
from zlaunch.rundir import RunDir, RunStatus, find_run, lock_holder, process_identity

__all__ = [
    "run_options",
    "open_run",
    "ENDED",
    "controller_alive",
    "controller_to_signal",
    "effective_status",
    "run_ended",
    "engine_rows",
    "last_engine_row",
]

TAIL_BLOCK = 64 * 1024
ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.INTERRUPTED})


def run_options(func: Callable) -> Callable:
    """``[RUN]`` (id or unique prefix; default the latest) and ``--log-dir``, like ``run``."""
    func = click.option(
        "--log-dir",
        default=None,
        help=f"Root of run directories. Default: ./{DEFAULT_LOG_DIR}.",
    )(func)
    return click.argument("run", required=False)(func)


def open_run(log_dir: str | None, run: str | None) -> RunDir:
    root = os.path.abspath(os.path.expanduser(log_dir or DEFAULT_LOG_DIR))
    try:
        return find_run(root, run)
    except FileNotFoundError as err:
        raise UsageError(
            str(err),
            hint="give the run id (see `zlaunch ls`) and the --log-dir the job was started with",
        ) from None


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


def effective_status(record: dict[str, Any]) -> str:
    """run.json's status, or "lost" when it says running but its controller is gone."""
    status = record.get("status") or "unknown"
    if status not in ENDED and record.get("end_time") is None and not controller_alive(record):
        return "lost"
    return status


def run_ended(record: dict[str, Any]) -> bool:
    return record.get("end_time") is not None or effective_status(record) in ENDED | {"lost"}


def engine_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step-metrics rows (not the script's own ``log_metrics`` rows)."""
    return [r for r in rows if r.get("source", "engine") == "engine" and "step" in r]


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
                    except ValueError:  # a row half-written right now
                        continue
                    if isinstance(row, dict) and row.get("source", "engine") == "engine":
                        if "step" in row:
                            return row
                if block >= size:
                    return None
                block *= 8
    except FileNotFoundError:
        return None
