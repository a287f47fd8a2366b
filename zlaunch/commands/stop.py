"""``zlaunch stop``: stop a running job from any terminal of the controller's machine.

Sends SIGTERM to the controller recorded in run.json, once proven to be it (it holds the run's
lock and has the start time recorded there); the controller then stops every
rank on every host (TERM, grace period, KILL) and records the run as interrupted. With
``--save`` it sends the run's save signal (``--save-on``, SIGUSR1 by default) instead: every
rank saves a checkpoint in ``--checkpoint-dir`` at its next step and exits 0. By default the
command waits until the run has ended and says how it ended (and where the checkpoint is).
"""

from __future__ import annotations

import os
import signal
import time

import click

from zlaunch.commands.runs_common import (
    controller_to_signal,
    effective_status,
    open_run,
    run_options,
)
from zlaunch.errors import UsageError, ZlaunchError
from zlaunch.rundir import RunStatus

__all__ = ["command"]


@click.command("stop")
@run_options
@click.option("--no-wait", is_flag=True, help="Signal the controller and return at once.")
@click.option(
    "--save",
    is_flag=True,
    help="Save a checkpoint first: every rank saves at its next step, then exits 0 "
    "(needs a run started with --checkpoint-dir).",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the run to end.",
)
def command(
    run: str | None, log_dir: str | None, no_wait: bool, save: bool, timeout: float
) -> None:
    """Stop RUN (default: the running one): every rank stops; --save checkpoints first."""
    rundir = open_run(log_dir, run, "stop")
    record = rundir.record()
    status = effective_status(record)
    if status.ended or record.get("end_time") is not None:
        code = record.get("exit_code")
        raise ZlaunchError(
            f"run {rundir.run_id} already ended ({status}"
            + (f", exit code {code}" if code is not None else "")
            + "); nothing to stop"
        )
    signum = _save_signal(rundir.run_id, record) if save else signal.SIGTERM
    pid = controller_to_signal(rundir, record, "stop")
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        raise ZlaunchError(f"run {rundir.run_id}: controller pid {pid} is gone") from None
    except PermissionError:
        raise ZlaunchError(
            f"run {rundir.run_id}: not allowed to signal controller pid {pid}",
            hint="run zlaunch stop as the user who started the job",
        ) from None
    name = signal.Signals(signum).name
    click.echo(f"zlaunch: sent {name} to the controller of run {rundir.run_id} (pid {pid})")
    if no_wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = rundir.record()
        status = effective_status(record)
        if status.ended or status is RunStatus.LOST:
            code = record.get("exit_code")
            click.echo(
                f"zlaunch: run {rundir.run_id} {status}"
                + (f" (exit code {code})" if code is not None else "")
            )
            if save:
                _say_checkpoint(record)
            return
        time.sleep(0.1)
    if save:
        raise ZlaunchError(
            f"run {rundir.run_id} did not save and end within {timeout:g}s after {name}",
            hint="ranks save at their next optimizer step, and only under runtime.initialize; "
            f"`zlaunch stop {rundir.run_id}` stops it without saving",
        )
    raise ZlaunchError(
        f"run {rundir.run_id} did not end within {timeout:g}s after SIGTERM",
        hint="check it with `zlaunch status`; a second `zlaunch stop` does not kill harder",
    )


def _save_signal(run_id: str, record: dict) -> int:
    """The signal that makes the run's ranks save, or UsageError when the run cannot save."""
    if not record.get("checkpoint_dir"):
        raise UsageError(
            f"run {run_id} was started without --checkpoint-dir: there is nowhere to save",
            hint=f"`zlaunch stop {run_id}` stops it without saving",
        )
    name = record.get("save_on")
    if not name:
        raise UsageError(
            f"run {run_id} was started with --save-on none: its ranks do not save on a signal",
            hint=f"`zlaunch stop {run_id}` stops it without saving",
        )
    return int(signal.Signals[name])


def _say_checkpoint(record: dict) -> None:
    directory = record["checkpoint_dir"]
    from zlaunch.launcher import latest_tag

    tag, why = latest_tag(directory)
    if tag is None:
        click.echo(f"zlaunch: no checkpoint in {directory} ({why})", err=True)
        return
    click.echo(
        f"zlaunch: saved checkpoint {os.path.join(directory, tag)}; continue with the same "
        "command plus --resume"
    )
