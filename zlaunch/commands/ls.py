"""``zlaunch ls``: every run of this user (or those under --log-dir), oldest first."""

from __future__ import annotations

import datetime
import os

import click

from zlaunch.commands.runs_common import effective_status, known_runs, last_engine_row
from zlaunch.console import print_table
from zlaunch.job import DEFAULT_LOG_DIR

__all__ = ["command"]


def _when(stamp: object) -> str:
    if not isinstance(stamp, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _ranks(record: dict) -> str:
    plan = record.get("plan") or {}
    size = plan.get("world_size")
    return str(size) if size is not None else "-"


@click.command("ls")
@click.option(
    "--log-dir",
    default=None,
    help="Only the runs under this directory. Default: every run of this user, from any "
    f"directory (and ./{DEFAULT_LOG_DIR}).",
)
@click.option("--no-color", is_flag=True, help="Plain table.")
def command(log_dir: str | None, no_color: bool) -> None:
    """List runs, oldest first: id, start, hosts, ranks, attempts, status, last step, where."""
    runs, where = known_runs(log_dir)
    if not runs:
        click.echo(f"no runs in {where}")
        return
    home = os.path.expanduser("~")
    rows = []
    for run, record in runs:
        last = last_engine_row(run)
        step = "-"
        if last is not None:
            step = str(last["step"]) + (
                f"/{last['total_steps']}" if last.get("total_steps") else ""
            )
        status = effective_status(record)
        if record.get("exit_code") not in (None, 0):
            status += f" ({record['exit_code']})"
        parent = os.path.dirname(run.path)
        if parent == home or parent.startswith(home + os.sep):
            parent = "~" + parent[len(home) :]
        rows.append(
            [
                run.run_id,
                _when(record.get("start_time")),
                ",".join(record.get("hosts") or []) or "-",
                _ranks(record),
                str(len(record.get("attempts") or []) or 1),
                status,
                step,
                parent,
            ]
        )
    print_table(
        f"runs in {where}",
        ["RUN", "START", "HOSTS", "RANKS", "ATTEMPTS", "STATUS", "LAST STEP", "LOG DIR"],
        rows,
        color=False if no_color else None,
    )
