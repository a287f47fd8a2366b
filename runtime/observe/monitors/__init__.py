"""DeepSpeed's monitors: `csv_monitor` and `wandb` write the step metrics rank 0 reports.

Both take the engine's metrics event (runtime.observe.metrics) and write its numeric fields under
DeepSpeed's names (``Train/Samples/train_loss``, ... against the number of samples seen), like
the tensorboard block. `comet` is refused before launch (runtime.config.features).
"""

from __future__ import annotations

from runtime.observe.monitors.build import build_monitors
from runtime.observe.monitors.names import scalars

__all__ = [
    "build_monitors",
    "scalars",
]
