"""``zlaunch plot``: loss, learning rate, throughput and loss scale (the gradient norm for a
run without dynamic loss scaling) of a run, against step.

When the run has them, two more panels: the wall-clock split of a step (rank 0's forward,
backward, reduction wait, optimizer step and all-gather wait, from ``wall_clock_breakdown``;
the slowest rank's total dashed) and MFU / TFLOP/s per device (runtime.observe.profiling).

Reads metrics.jsonl (works while the job runs). matplotlib comes from the ``plot`` extra and
is imported only here, with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
from typing import Any

import click

from zlaunch.commands.runs_common import engine_rows, open_run, run_options
from zlaunch.errors import UsageError

__all__ = ["command", "series", "SPLIT"]

# (field, label, color): the wall-clock split stacked bottom-up. Waits are inside forward /
# backward, so those are drawn less their waits; the stack adds up to the measured total.
SPLIT = (
    ("time_forward", "forward", "tab:blue"),
    ("time_backward", "backward", "tab:orange"),
    ("time_reduce_wait", "reduction wait", "tab:red"),
    ("time_allgather_wait", "all-gather wait", "tab:purple"),
    ("time_step", "optimizer step", "tab:green"),
)


def split_series(rows: list[dict[str, Any]]) -> tuple[list[int], dict[str, list[float]]]:
    """Steps and the stacked parts (ms) of the wall-clock split (zlaunch.console.live_breakdown.split:
    waits taken out of the phase that holds them, adding up to the measured total)."""
    from zlaunch.wire import split

    steps: list[int] = []
    parts: dict[str, list[float]] = {key: [] for key, _, _ in SPLIT}
    for row in rows:
        values = split(row)
        if values is None:
            continue
        steps.append(row["step"])
        for key, _, _ in SPLIT:
            parts[key].append(values[key.removeprefix("time_")] * 1000)
    return steps, parts


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping rows where it is missing (e.g. overflow)."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def fourth_panel(scales: list[float]) -> tuple[str, str]:
    """(metric, title) of the fourth panel: the loss scale when it moved; otherwise (fp32,
    bf16, a static scale: a flat line) the gradient norm, which says more."""
    if scales and len(set(scales)) > 1:
        return "loss_scale", "loss scale"
    return "grad_norm", "gradient norm"


@click.command("plot")
@run_options
@click.option(
    "-o",
    "--output",
    default=None,
    help="PNG (or any matplotlib format by extension) to write. Default: <run-id>.png.",
)
def command(run: str | None, log_dir: str | None, output: str | None) -> None:
    """Plot loss, lr, throughput and loss scale of RUN (default: the latest) against step,
    and the wall-clock split and MFU when the run reports them."""
    plt = _pyplot()
    rundir = open_run(log_dir, run)
    rows = _step_rows(rundir)
    output = output or f"{rundir.run_id}.png"
    fig = _figure(plt, rundir.run_id, rows)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)
    click.echo(f"zlaunch: wrote {output} ({len(rows)} steps of run {rundir.run_id})")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            "zlaunch plot needs matplotlib, which is not installed",
            hint="pip install 'zlaunch[plot]'",
        ) from None
    return plt


def _step_rows(rundir) -> list[dict]:
    """The run's step-metrics rows by step; UsageError when there are none or one is bad."""
    try:
        rows = engine_rows(rundir.metrics())
    except ValueError as err:
        raise UsageError(f"{rundir.path}/metrics.jsonl: unreadable row: {err}") from None
    if not rows:
        raise UsageError(
            f"run {rundir.run_id} has no step metrics yet",
            hint="metrics come from runtime.initialize engines, every steps_per_print steps",
        )
    return sorted(rows, key=lambda r: r["step"])


def _figure(plt, run_id: str, rows: list[dict]):
    """Loss, lr, throughput and the fourth panel; the split and MFU when reported."""
    from matplotlib.ticker import MaxNLocator

    split_steps, split = split_series(rows)
    mfu_steps, mfu = series(rows, "mfu")
    tflops_steps, tflops = series(rows, "tflops")
    insight = bool(split_steps or tflops)
    fig, axes = plt.subplots(3 if insight else 2, 2, figsize=(11, 10 if insight else 7))
    fig.suptitle(f"zlaunch run {run_id}")
    scales = series(rows, "loss_scale")[1]
    fourth = fourth_panel(scales)
    scaled = fourth[0] == "loss_scale"
    panels = [
        (axes[0][0], "loss", "loss", "tab:blue"),
        (axes[0][1], "lr", "learning rate", "tab:green"),
        (axes[1][0], "samples_per_s", "samples/s", "tab:orange"),
        (axes[1][1], *fourth, "tab:red"),
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
    if scaled and min(scales) > 0 and max(scales) / min(scales) > 8:
        axes[1][1].set_yscale("log", base=2)
    if insight:
        _plot_split(axes[2][0], split_steps, split, rows, MaxNLocator)
        _plot_mfu(axes[2][1], mfu_steps, mfu, tflops_steps, tflops, rows, MaxNLocator)
    return fig


def _plot_split(ax, steps, parts, rows, locator) -> None:
    ax.set_title("wall-clock split of a step (rank 0)")
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step")
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(locator(integer=True))
    if not steps:
        ax.text(
            0.5, 0.5, "no wall_clock_breakdown", ha="center", va="center", transform=ax.transAxes
        )
        return
    ax.stackplot(
        steps,
        *[parts[key] for key, _, _ in SPLIT],
        labels=[label for _, label, _ in SPLIT],
        colors=[color for _, _, color in SPLIT],
        alpha=0.8,
    )
    slow_steps, slow = [], []
    for row in rows:
        keys = ("slowest_time_forward", "slowest_time_backward", "slowest_time_step")
        if all(isinstance(row.get(k), (int, float)) for k in keys):
            slow_steps.append(row["step"])
            slow.append(sum(row[k] for k in keys) * 1000)
    if slow:
        last = next((r.get("straggler") for r in reversed(rows) if r.get("straggler")), None)
        label = f"slowest rank total ({last})" if last else "slowest rank total"
        ax.plot(slow_steps, slow, linestyle="--", color="black", label=label)
    ax.legend(loc="upper right", fontsize="small")


def _plot_mfu(ax, mfu_steps, mfu, tflops_steps, tflops, rows, locator) -> None:
    source = next((r.get("peak_source") for r in reversed(rows) if r.get("peak_source")), None)
    ax.set_title("MFU" + (f" (peak: {source})" if source else ""), fontsize="small")
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(locator(integer=True))
    if mfu:
        ax.plot(
            mfu_steps,
            [m * 100 for m in mfu],
            marker="o",
            markersize=3,
            color="tab:cyan",
            label="MFU %",
        )
        ax.set_ylabel("MFU %")
    if tflops:
        twin = ax.twinx() if mfu else ax
        twin.plot(
            tflops_steps, tflops, linestyle="--", color="tab:brown", label="TFLOP/s per device"
        )
        twin.set_ylabel("TFLOP/s per device")
    if not (mfu or tflops):
        ax.text(0.5, 0.5, "no FLOP count", ha="center", va="center", transform=ax.transAxes)
