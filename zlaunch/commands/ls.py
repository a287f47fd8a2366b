"""``zlaunch ls``: the runs under the log directory, oldest first."""

from __future__ import annotations

import datetime
import os

import click

from zlaunch.commands.runs_common import effective_status, last_engine_row
from zlaunch.console import print_table
from zlaunch.options import DEFAULT_LOG_DIR
from zlaunch.rundir import RunDir, list_runs

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
    "--log-dir", default=None, help=f"Root of run directories. Default: ./{DEFAULT_LOG_DIR}."
)
@click.option("--no-color", is_flag=True, help="Plain table.")
def command(log_dir: str | None, no_color: bool) -> None:
    """List runs: id, start, hosts, ranks, status, last step."""
    root = os.path.abspath(os.path.expanduser(log_dir or DEFAULT_LOG_DIR))
    runs = list_runs(root)
    if not runs:
        click.echo(f"no runs in {root}")
        return
    rows = []
    for record in runs:
        run_id = record.get("run_id", "?")
        last = last_engine_row(RunDir(os.path.join(root, run_id), run_id))
        step = "-"
        if last is not None:
            step = str(last["step"]) + (
                f"/{last['total_steps']}" if last.get("total_steps") else ""
            )
        status = effective_status(record)
        if record.get("exit_code") not in (None, 0):
            status += f" ({record['exit_code']})"
        rows.append(
            [
                run_id,
                _when(record.get("start_time")),
                ",".join(record.get("hosts") or []) or "-",
                _ranks(record),
                status,
                step,
            ]
        )
    print_table(
        f"runs in {root}",
        ["RUN", "START", "HOSTS", "RANKS", "STATUS", "LAST STEP"],
        rows,
        color=False if no_color else None,
    )
