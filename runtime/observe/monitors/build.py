"""DeepSpeed's monitors: `csv_monitor` and `wandb` write the step metrics rank 0 reports.

Both take the engine's metrics event (runtime.observe.metrics) and write its numeric fields under
DeepSpeed's names (``Train/Samples/train_loss``, ... against the number of samples seen), like
the tensorboard block. `comet` is refused before launch (runtime.config.features).
"""

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
