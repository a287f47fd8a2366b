"""``zlaunch stacks``: where is every rank right now? For a job that hangs.

Signals the controller (on the machine that started the job), which asks every rank whose
worker listens (every Python worker: zlaunch.worker.boot arms its stacks thread before the
script starts, zlaunch/worker/stack_dumper.py; `runtime/observe/stacks.py` arms faulthandler elsewhere) to
write each thread's
Python stack to stderr. The dumps land in the rank logs; this command reads what each log grew
by, keeps the stack lines, and prints the ranks grouped by identical stacks: a rank stuck
somewhere else than its peers stands out at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import click

from zlaunch.commands.runs_common import (
    controller_to_signal,
    effective_status,
    open_run,
    run_options,
)
from zlaunch.errors import ZlaunchError
from zlaunch.rundir import RankPhase, RankRow, RanksFile
from zlaunch.text import (
    FAULTHANDLER,
    QUIET_AFTER,
    group_ranks,
    parse_dump_by,
    rank_ranges,
    stack_line_count,
)

__all__ = ["command"]


def _read_from(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


@click.command("stacks")
@run_options
@click.option(
    "--timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to wait for the ranks' dumps.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the stacks, collective records and suspect as failure.json's root_cause holds them.",
)
def command(run: str | None, log_dir: str | None, timeout: float, as_json: bool) -> None:
    """Print every rank's Python stacks and recent collectives, grouped: where RUN (default:
    the latest) is stuck, and which rank the others wait for."""
    from zlaunch.wire import protocol

    rundir = open_run(log_dir, run, "stacks")
    record = rundir.record()
    status = effective_status(record)
    if status.ended or record.get("end_time") is not None:
        raise ZlaunchError(f"run {rundir.run_id} already ended ({status}); no stacks to show")
    controller = controller_to_signal(rundir, record, "stacks")
    state = rundir.ranks() or RanksFile(attempt=0, time=0.0)
    rows = [r for r in state.ranks if r.state is RankPhase.RUNNING]
    ready = {r.rank: r for r in rows if r.stacks}
    silent = sorted(r.rank for r in rows if not r.stacks)
    if not ready:
        raise ZlaunchError(
            f"run {rundir.run_id}: no running rank can dump its stacks",
            hint="Python workers listen from their start; programs run with --no-python "
            "(or another interpreter) cannot be asked",
        )
    paths = {r: rundir.rank_log_path(state.attempt, row.host, r) for r, row in ready.items()}
    start = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
    asked_at = time.time()
    try:
        os.kill(controller, protocol.STACKS_SIGNAL)
    except (ProcessLookupError, PermissionError) as err:
        raise ZlaunchError(f"run {rundir.run_id}: cannot signal its controller ({err})") from None

    dumps: dict[int, Any] = {}
    dumped_by: dict[int, str] = {}
    # A dump is complete once its stack lines stop growing for QUIET_AFTER (a rank may keep
    # printing other lines meanwhile).
    seen_lines = {r: 0 for r in paths}
    changed_at = {r: time.monotonic() for r in paths}
    deadline = time.monotonic() + timeout
    while len(dumps) < len(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.monotonic()
        for r, path in paths.items():
            if r in dumps:
                continue
            text = _read_from(path, start[r]).decode("utf-8", errors="replace")
            n = stack_line_count(text)
            if n != seen_lines[r]:
                seen_lines[r], changed_at[r] = n, now
            elif n and now - changed_at[r] >= QUIET_AFTER:
                dumps[r], dumped_by[r] = parse_dump_by(text)
    from zlaunch.launcher import hang_failure  # it reads this module's parser

    records = _fresh_records(rundir, asked_at)
    failure = hang_failure(
        0.0,
        0.0,
        {r: row.host for r, row in ready.items()},
        dumps,
        silent,
        records,
        {r: row.pid for r, row in ready.items()},
        headline="stacks asked by `zlaunch stacks`",
        by_faulthandler=sorted(r for r, by in dumped_by.items() if by == FAULTHANDLER),
    )
    if as_json:
        click.echo(json.dumps({"run_id": rundir.run_id, "root_cause": failure.to_json()}, indent=2))
    else:
        _print_groups(rundir.run_id, ready, dumps)
        _print_dumpers(dumped_by)
        _print_collectives(failure)
    missing = sorted(set(paths) - set(dumps))
    if missing:
        click.echo(f"no dump within {timeout:g}s from rank(s) {rank_ranges(missing)}", err=True)
    if silent:
        click.echo(
            f"rank(s) {rank_ranges(silent)} cannot dump (not Python, or still starting)", err=True
        )
    if missing or not dumps:
        raise click.exceptions.Exit(1)


def _fresh_records(rundir: Any, asked_at: float, wait: float = 1.0) -> dict[int, list[dict]]:
    """The ranks' collective records the controller received for this request (its agents
    send them with the signal, before the stacks are complete)."""
    from zlaunch.launcher import decode_records

    deadline = time.monotonic() + wait
    while True:
        fresh = {
            r: decode_records(v.get("records")).records  # the controller checked them already
            for r, v in rundir.collectives().items()
            if isinstance(v.get("received"), (int, float)) and v["received"] >= asked_at - 0.5
        }
        if fresh or time.monotonic() >= deadline:
            return fresh
        time.sleep(0.05)


def _print_dumpers(dumped_by: dict[int, str]) -> None:
    """Which ranks faulthandler answered for: their stacks thread could not run (the GIL held
    in C code), or they were not started by zlaunch's boot (a wrapper's Python child)."""
    stood_in = sorted(r for r, by in dumped_by.items() if by == FAULTHANDLER)
    if stood_in:
        click.echo(
            f"\nrank(s) {rank_ranges(stood_in)} dumped by faulthandler: their stacks thread "
            "could not run (a thread holds the GIL in C code), or the process arms only "
            "faulthandler"
        )


def _print_collectives(failure: Any) -> None:
    from zlaunch.console import format_hang

    hang = failure.hang or {}
    if not hang.get("collective_groups"):
        return
    click.echo("")
    only = {**hang, "stack_groups": [], "no_dump": []}
    for line in format_hang(dataclasses.replace(failure, hang=only)):
        click.echo(line.removeprefix("    "))
    click.echo(f"\nsuspect: {hang['suspect']['message']}")


def _print_groups(run_id: str, ready: dict[int, RankRow], dumps: dict[int, Any]) -> None:
    groups = group_ranks(dumps)
    click.echo(
        f"zlaunch stacks: run {run_id}, {len(dumps)} rank(s), "
        f"{len(groups)} distinct stack{'s' if len(groups) != 1 else ''}"
    )
    for ranks, dump in groups:
        hosts = sorted({ready[r].host for r in ranks})
        label = "rank" if len(ranks) == 1 else "ranks"
        click.echo(f"\n{label} {rank_ranges(ranks)} ({', '.join(hosts)}):")
        for kind, frames in dump:
            click.echo("  main thread:" if kind == "main" else "  other thread:")
            for frame in frames:
                click.echo(f"    {frame}")
