"""The live view's panel, drawn from what a `JobView` tracks (rich is imported when drawn).

Top to bottom: the job's progress bar (step/total, percent, ETA, elapsed), the latest step's
numbers, the step's wall-clock split and MFU (`live_breakdown`), the script's own metrics,
ranks alive per host with the failed, stopped and lost ones, and, while running, how long the
job has been silent. Lines of ranks redrawing a progress bar (tqdm) sit above the panel.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from zlaunch.console.safe_text import shown
from zlaunch.rundir import RunStatus
from zlaunch.text import host_ranges, rank_ranges
from zlaunch.wire import human_bytes, number, rate

if TYPE_CHECKING:
    from zlaunch.console.job_view import JobView

__all__ = ["render_panel", "progress_lines", "duration"]

MAX_BARS_SHOWN = 8
MAX_HOSTS_SHOWN = 8
LIST_CHARS = 60
"""A rank or host list in the panel longer than this is cut, with its count."""
BAR_WIDTH = 30  # leaves room for "step N/M  P%  ETA  elapsed" on an 80-column terminal
SLOW_STEP_NOTE = 10.0
"""Seconds without a step after which the panel says when the last one was."""


def duration(seconds: float | None) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def render_panel(view: JobView) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    event = view.latest or {}
    parts: list[Any] = [_progress(view, event)]
    if event:
        parts.append(_metrics_grid(event))
    parts.extend(view.breakdown.rows(event))
    if view.user:
        parts.append(Text("  ".join(f"{k} {number(v)}" for k, v in view.user.items())))
    parts.append(_ranks_line(view))
    if view.fleet_line:
        parts.append(Text(f"fleet: {view.fleet_line}", style="yellow"))
    if view.start_line:
        parts.append(Text(view.start_line, style="yellow"))
    parts.extend(_silence_notes(view))
    return Panel(
        Group(*parts),
        title=f"zlaunch {view.run_id}".strip(),
        subtitle=view.status,
        title_align="left",
        subtitle_align="right",
    )


def _progress(view: JobView, event: dict[str, Any]) -> Any:
    """The job's progress bar: step/total, percent, ETA and elapsed (a pulse without a
    total)."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    step, total = event.get("step"), event.get("total_steps")
    bar = Table.grid(padding=(0, 1))
    bar.add_column(width=BAR_WIDTH)
    bar.add_column()
    elapsed = duration(time.monotonic() - view.started_at)
    if total:
        done = min(step or 0, total)
        label = (
            f"step {step}/{total}  {100 * done / total:.0f}%  ETA {duration(view.eta())}"
            f"  elapsed {elapsed}"
        )
        bar.add_row(ProgressBar(total=total, completed=done, width=BAR_WIDTH), Text(label))
    else:
        waiting = "no step metrics yet" if step is None else f"step {step}"
        bar.add_row(ProgressBar(total=None, width=BAR_WIDTH), Text(f"{waiting}  elapsed {elapsed}"))
    return bar


def _ranks_line(view: JobView) -> Any:
    """Ranks alive/expected per host (at scale: the count, then the hosts short of ranks,
    grouped), then the failed, stopped and lost ranks as ranges."""
    from rich.text import Text

    hosts = Text("ranks alive: ")
    health = view.health()
    if len(health) > MAX_HOSTS_SHOWN:
        # Many hosts: a count, then only the hosts that are not complete, grouped by their
        # count ("node[003-004] 0/8"), the emptiest first.
        full = sum(1 for _, alive, expected in health if alive == expected)
        total = sum(alive for _, alive, _ in health)
        hosts.append(f"{total}/{sum(e for _, _, e in health)} on {len(health)} hosts, ")
        hosts.append(f"{full} complete  ")
        short: dict[tuple[int, int], list[str]] = {}
        for host, alive, expected in health:
            if alive != expected:
                short.setdefault((alive, expected), []).append(host)
        groups = sorted(short.items(), key=lambda item: (item[0][0] / item[0][1], item[0]))
        health = [
            (host_ranges(names, limit=LIST_CHARS), alive, expected)
            for (alive, expected), names in groups[:MAX_HOSTS_SHOWN]
        ]
        rest = sum(len(names) for _, names in groups[MAX_HOSTS_SHOWN:])
        if rest:
            health.append((f"and {rest} more hosts short of ranks", -1, 0))
    for host, alive, expected in health:
        if alive < 0:
            hosts.append(host + "  ", style="yellow")
            continue
        style = "green" if alive == expected else ("red" if alive == 0 else "yellow")
        if view.status not in (RunStatus.RUNNING, RunStatus.STARTING) and alive == 0:
            style = "dim"
        hosts.append(f"{host} {alive}/{expected}", style=style)
        hosts.append("  ")
    failed = sorted(r for r, c in view.exits.items() if c != 0 and r not in view.stopped)
    if failed:
        hosts.append(f"failed ranks: {rank_ranges(failed, limit=LIST_CHARS)}  ", style="bold red")
    if view.stopped:
        hosts.append(f"stopped ranks: {rank_ranges(view.stopped, limit=LIST_CHARS)}  ", style="dim")
    if view.lost:
        hosts.append(f"lost ranks: {rank_ranges(view.lost, limit=LIST_CHARS)}", style="bold red")
    return hosts


def _silence_notes(view: JobView) -> list[Any]:
    """While running: how long since the last step, and which ranks have gone quiet."""
    from rich.text import Text

    if view.status != RunStatus.RUNNING:
        return []
    now, notes = time.monotonic(), []
    if view.latest_at is not None and now - view.latest_at >= SLOW_STEP_NOTE:
        notes.append(Text(f"last step {duration(now - view.latest_at)} ago", style="dim"))
    quiet = view.quiet_ranks(now)
    if quiet:
        longest = max(silence for _, silence in quiet)
        notes.append(
            Text(
                f"no output from ranks {rank_ranges((r for r, _ in quiet), limit=LIST_CHARS)} for "
                f"{duration(min(s for _, s in quiet))}+ (longest {duration(longest)}): "
                "`zlaunch stacks` shows where they are",
                style="yellow",
            )
        )
    return notes


def progress_lines(bars: dict[int, tuple[str, str]]) -> list[Any]:
    """One line per rank redrawing a progress bar, under its prefix, just above the panel."""
    from rich.text import Text

    rows = []
    for rank in sorted(bars)[:MAX_BARS_SHOWN]:
        host, text = bars[rank]
        row = Text(f"[{host}:{rank}] ", style="bold")
        row.append(Text.from_ansi(shown(text, color=True)))  # its colours, nothing else
        row.no_wrap, row.overflow = True, "ellipsis"
        rows.append(row)
    if len(bars) > MAX_BARS_SHOWN:
        rest = rank_ranges(sorted(bars)[MAX_BARS_SHOWN:], limit=LIST_CHARS)
        rows.append(Text(f"... and {len(bars) - MAX_BARS_SHOWN} more ranks ({rest})", style="dim"))
    return rows


def _metrics_grid(event: dict[str, Any]) -> Any:
    """The latest step's numbers, four to a row."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    for _ in range(4):
        grid.add_column()
    step_ms = event.get("step_time")
    grid.add_row(
        f"loss [bold]{number(event.get('loss'))}[/]",
        f"lr {number(event.get('lr'), '.3g')}",
        f"grad norm {number(event.get('grad_norm'))}",
        f"loss scale {number(event.get('loss_scale'), 'g')}",
    )
    grid.add_row(
        f"step time {step_ms * 1000:.1f} ms" if isinstance(step_ms, float) else "step time -",
        f"samples/s {rate(event.get('samples_per_s'))}",
        f"tokens/s {rate(event.get('tokens_per_s'))}",
        f"skipped {number(event.get('skipped_steps'))}",
    )
    grid.add_row(
        f"mem {human_bytes(event.get('memory_bytes'))}",
        f"peak {human_bytes(event.get('memory_peak_bytes'))}",
        f"comm {human_bytes(event.get('comm_bytes'))}",
        f"samples {number(event.get('samples'))}",
    )
    return grid
