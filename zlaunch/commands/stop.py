"""``zlaunch stop``: stop a running job from any terminal of the controller's machine.

Sends SIGTERM to the controller recorded in run.json, once proven to be it (it holds the run's
lock and has the start time recorded there); the controller then stops every
rank on every host exactly as on Ctrl-C (TERM, grace period, KILL) and records the run as
interrupted. By default the command waits until the run has ended and says how it ended.
"""

from __future__ import annotations

import os
import signal
import time

import click

from zlaunch.commands.runs_common import (
    ENDED,
    controller_to_signal,
    effective_status,
    open_run,
    run_options,
)
from zlaunch.errors import ZlaunchError

__all__ = ["command"]


@click.command("stop")
@run_options
@click.option("--no-wait", is_flag=True, help="Signal the controller and return at once.")
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the run to end.",
)
def command(run: str | None, log_dir: str | None, no_wait: bool, timeout: float) -> None:
    """Stop RUN (default: the latest): every rank stops as on Ctrl-C."""
    rundir = open_run(log_dir, run, "stop")
    record = rundir.record()
    status = effective_status(record)
    if status in ENDED or record.get("end_time") is not None:
        code = record.get("exit_code")
        raise ZlaunchError(
            f"run {rundir.run_id} already ended ({status}"
            + (f", exit code {code}" if code is not None else "")
            + "); nothing to stop"
        )
    pid = controller_to_signal(rundir, record, "stop")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise ZlaunchError(f"run {rundir.run_id}: controller pid {pid} is gone") from None
    except PermissionError:
        raise ZlaunchError(
            f"run {rundir.run_id}: not allowed to signal controller pid {pid}",
            hint="run zlaunch stop as the user who started the job",
        ) from None
    click.echo(f"zlaunch: sent SIGTERM to the controller of run {rundir.run_id} (pid {pid})")
    if no_wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = rundir.record()
        status = effective_status(record)
        if status in ENDED or status == "lost":
            code = record.get("exit_code")
            click.echo(
                f"zlaunch: run {rundir.run_id} {status}"
                + (f" (exit code {code})" if code is not None else "")
            )
            return
        time.sleep(0.1)
    raise ZlaunchError(
        f"run {rundir.run_id} did not end within {timeout:g}s after SIGTERM",
        hint="check it with `zlaunch status`; a second `zlaunch stop` does not kill harder",
    )
