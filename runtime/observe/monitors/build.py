"""The monitors a config enables (rank 0 only)."""

from __future__ import annotations

from typing import Any

from .names import scalars

__all__ = ["build_monitors", "scalars"]


def build_monitors(config: Any, rank: int) -> list:
    """The monitors the config enables; none on ranks other than 0."""
    if rank != 0:
        return []
    monitors: list = []
    csv_block = getattr(config, "csv_monitor", None)
    if csv_block is not None and csv_block.enabled:
        from .csv_monitor import CsvMonitor

        monitors.append(CsvMonitor(csv_block.output_path, csv_block.job_name))
    wandb_block = getattr(config, "wandb", None)
    if wandb_block is not None and wandb_block.enabled:
        from .wandb_monitor import WandbMonitor

        monitors.append(
            WandbMonitor(
                project=wandb_block.project,
                group=wandb_block.group,
                team=wandb_block.team,
                config=dict(getattr(config, "raw", {}) or {}),
            )
        )
    return monitors
