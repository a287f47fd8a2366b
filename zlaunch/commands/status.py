"""``zlaunch status``: a run's state, its last metrics, and every rank: alive or how it ended.

Reads run.json, ranks.json (written by the controller on every rank start and exit),
failure.json and metrics.jsonl. A rank is "alive" only while its run is live; a rank that
ranks.json still shows running in a run whose controller is gone is "unknown".
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import click

from zlaunch.commands.runs_common import effective_status, last_engine_row, open_run, run_options
from zlaunch.console import format_metrics, print_table
from zlaunch.rundir import RankPhase, RankRow, RanksFile

__all__ = ["command", "rank_rows"]


def _when(stamp: Any) -> str:
    if not isinstance(stamp, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _rank_state(rank: RankRow, live: bool) -> str:
    if rank.state is RankPhase.LOST:
        return "lost (connection to its host's agent broke)"
    if rank.state is RankPhase.EXITED:
        if rank.signal_name:
            return f"killed by {rank.signal_name} (exit {rank.exit_code})"
        return f"exited {rank.exit_code}" if rank.exit_code else "exited 0"
    if not live:
        return "unknown (controller gone)"
    return "alive" if rank.state is RankPhase.RUNNING else "starting"


def rank_rows(record: dict[str, Any], ranks: RanksFile | None, live: bool) -> list[list[str]]:
    """HOST, RANK, LOCAL, PID, STATE, LAST STEP, LAST OUTPUT for every rank of the plan."""
    if ranks is None:
        # Not started yet (or an older controller): the plan tells at least who should run.
        plan = record.get("plan") or {}
        entries = [
            RankRow(rank=w["rank"], local_rank=w["local_rank"], host=node["host"])
            for node in plan.get("nodes", [])
            for w in node.get("workers", [])
        ]
    else:
        entries = list(ranks.ranks)
    rows = []
    now = time.time()
    for rank in sorted(entries, key=lambda r: r.rank):
        last = rank.last_step
        output = rank.last_output
        rows.append(
            [
                str(rank.host or "-"),
                str(rank.rank),
                "-" if rank.local_rank is None else str(rank.local_rank),
                str(rank.pid or "-"),
                _rank_state(rank, live) if ranks is not None else "not started",
                "-" if last is None else str(last),
                f"{_ago(now - output)} ago" if isinstance(output, (int, float)) else "-",
            ]
        )
    return rows


def attempt_rows(attempts: list[dict[str, Any]]) -> list[list[str]]:
    """One row per attempt of the run: its hosts, world size and batch, and the fleet change
    that started it with what it cost."""
    rows = []
    for entry in attempts:
        if not isinstance(entry, dict):
            continue
        hosts = entry.get("hosts")
        rows.append(
            [
                str(entry.get("attempt", "-")),
                _when(entry.get("start_time")),
                ",".join(hosts) if isinstance(hosts, list) else "-",
                str(entry.get("world_size", "-")),
                str(entry.get("batch") or "as configured"),
                _change_words(entry),
            ]
        )
    return rows


def _change_words(entry: dict[str, Any]) -> str:
    change = entry.get("change")
    reason = str(entry.get("reason") or "-")
    if not isinstance(change, dict):
        return reason
    hosts = ", ".join(map(str, change.get("hosts") or []))
    if change.get("kind") == "lost":
        return f"lost {hosts}"
    if change.get("kind") == "joined":
        words = [f"{hosts} joined"]
    elif change.get("kind") == "slow":
        slow = change.get("slow")
        figures = ", ".join(f"{h} {w}" for h, w in slow.items()) if isinstance(slow, dict) else ""
        words = [f"slow {hosts} taken out" + (f" ({figures})" if figures else "")]
    else:
        words = [f"preempted {hosts}"]
    if change.get("saved_step") is not None:
        words.append(f"saved at step {change['saved_step']}")
    elif change.get("deadline_missed"):
        words.append("deadline passed before the save: resumed from the previous checkpoint")
    else:
        words.append("not saved: resumed from the latest checkpoint")
    if change.get("steps_lost") is not None:
        words.append(f"{change['steps_lost']} step(s) lost")
    if isinstance(change.get("notice_to_restart_s"), (int, float)):
        words.append(f"{change['notice_to_restart_s']:.1f} s from the notice to the restart")
    if isinstance(change.get("save_to_restart_s"), (int, float)):
        words.append(f"{change['save_to_restart_s']:.1f} s from the save request to the restart")
    return "; ".join(words)


def _ago(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_lines(ranks: RanksFile | None) -> list[str]:
    """The latest state of every rank's progress bar (a line redrawn with carriage returns)."""
    lines = []
    for rank in sorted(ranks.ranks if ranks else (), key=lambda r: r.rank):
        if rank.progress and rank.state in (RankPhase.RUNNING, RankPhase.STARTING):
            lines.append(f"[{rank.host}:{rank.rank}] {rank.progress}")
    return lines


@click.command("status")
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print run, ranks and last metrics as JSON.")
@click.option("--no-color", is_flag=True, help="Plain table.")
def command(run: str | None, log_dir: str | None, as_json: bool, no_color: bool) -> None:
    """Show RUN (default: the latest): status, last metrics, every rank's state."""
    rundir = open_run(log_dir, run)
    record = rundir.record()
    ranks = rundir.ranks()
    status = effective_status(record)
    live = status.live
    last = last_engine_row(rundir)
    failure = rundir.failure()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "run_id": rundir.run_id,
                    "status": status,
                    "exit_code": record.get("exit_code"),
                    "ranks": [r.to_json() for r in ranks.ranks] if ranks else None,
                    "last_metrics": last,
                    "root_cause": failure.root_cause.to_json() if failure else None,
                    "attempts": record.get("attempts") or [],
                },
                indent=2,
            )
        )
        return
    lines = [
        f"run      {rundir.run_id}  ({rundir.path})",
        f"status   {status}"
        + (f", exit code {record['exit_code']}" if record.get("exit_code") is not None else ""),
        f"started  {_when(record.get('start_time'))}"
        + (f"   ended {_when(record['end_time'])}" if record.get("end_time") else ""),
        f"hosts    {', '.join(record.get('hosts') or []) or '-'}",
    ]
    if last is not None:
        age = f"  ({_ago(time.time() - last['time'])} ago)" if live and "time" in last else ""
        lines.append(f"metrics  {format_metrics(last)}{age}")
    else:
        lines.append("metrics  none reported yet")
    if failure:
        root = failure.root_cause
        who = ", ".join(map(str, root.rank)) if isinstance(root.rank, list) else root.rank
        lines.append(f"cause    rank {who} on {root.host}: {root.how()}")
    click.echo("\n".join(lines))
    print_table(
        "ranks",
        ["HOST", "RANK", "LOCAL", "PID", "STATE", "LAST STEP", "LAST OUTPUT"],
        rank_rows(record, ranks, live),
        color=False if no_color else None,
    )
    attempts = record.get("attempts") or []
    if attempts:
        print_table(
            "attempts",
            ["ATTEMPT", "STARTED", "HOSTS", "WORLD", "BATCH", "WHY"],
            attempt_rows(attempts),
            color=False if no_color else None,
        )
    bars = progress_lines(ranks) if live else []
    if bars:
        click.echo("progress")
        for line in bars:
            click.echo(f"  {line}")
