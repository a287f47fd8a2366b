"""``zlaunch plot``: loss, learning rate, throughput and loss scale of a run, against step.

Reads metrics.jsonl (works while the job runs). matplotlib comes from the ``plot`` extra and
is imported only here, with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from typing import Any

import click

from zlaunch.commands.runs_common import engine_rows, open_run, run_options
from zlaunch.errors import UsageError

__all__ = ["command", "series"]


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping rows where it is missing (e.g. overflow)."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


@click.command("plot")
@run_options
@click.option(
    "-o",
    "--output",
    default=None,
    help="PNG (or any matplotlib format by extension) to write. Default: <run-id>.png.",
)
def command(run: str | None, log_dir: str | None, output: str | None) -> None:
    """Plot loss, lr, throughput and loss scale of RUN (default: the latest) against step."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UsageError(
            "zlaunch plot needs matplotlib, which is not installed",
            hint="pip install 'zlaunch[plot]'",
        ) from None
    rundir = open_run(log_dir, run)
    try:
        rows = engine_rows(rundir.metrics())
    except ValueError as err:
        raise UsageError(f"{rundir.path}/metrics.jsonl: unreadable row: {err}") from None
    if not rows:
        raise UsageError(
            f"run {rundir.run_id} has no step metrics yet",
            hint="metrics come from runtime.initialize engines, every steps_per_print steps",
        )
    rows.sort(key=lambda r: r["step"])
    output = output or f"{rundir.run_id}.png"

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    fig.suptitle(f"zlaunch run {rundir.run_id}")
    panels = [
        (axes[0][0], "loss", "loss", "tab:blue"),
        (axes[0][1], "lr", "learning rate", "tab:green"),
        (axes[1][0], "samples_per_s", "samples/s", "tab:orange"),
        (axes[1][1], "loss_scale", "loss scale", "tab:red"),
    ]
    for ax, key, label, color in panels:
        steps, values = series(rows, key)
        ax.plot(steps, values, marker="o", markersize=3, color=color, label=label)
        ax.set_title(label)
        ax.set_ylabel(label)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not steps:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    token_steps, tokens = series(rows, "tokens_per_s")
    if tokens:
        twin = axes[1][0].twinx()
        twin.plot(token_steps, tokens, linestyle="--", color="tab:purple", label="tokens/s")
        twin.set_ylabel("tokens/s")
        handles = axes[1][0].get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        axes[1][0].legend(handles=handles, loc="lower right")
        axes[1][0].set_title("throughput")
    scales = series(rows, "loss_scale")[1]
    if scales and min(scales) > 0 and max(scales) / min(scales) > 8:
        axes[1][1].set_yscale("log", base=2)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)
    click.echo(f"zlaunch: wrote {output} ({len(rows)} steps of run {rundir.run_id})")
