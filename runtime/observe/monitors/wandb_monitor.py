"""`wandb`: the step metrics to Weights & Biases from rank 0.

``team`` is the W&B entity, ``group`` and ``project`` as W&B names them. The run starts at the
first report and finishes at exit. ``WANDB_MODE=offline`` logs to ``./wandb`` without network
(``wandb sync`` uploads it later). The package is optional: a config that enables the block
without it installed is refused before launch (runtime.config).
"""

from __future__ import annotations

import atexit
from typing import Any

from .names import scalars

__all__ = ["WandbMonitor"]


class WandbMonitor:
    def __init__(
        self,
        *,
        project: str,
        group: str | None,
        team: str | None,
        config: dict[str, Any] | None = None,
    ):
        self.options = {"project": project, "group": group, "entity": team, "config": config}
        self.run = None

    def _start(self):
        if self.run is None:
            import wandb

            self.run = wandb.init(**{k: v for k, v in self.options.items() if v is not None})
            atexit.register(self.close)
        return self.run

    def write(self, event: dict[str, Any]) -> None:
        self._log(scalars(event), int(event["samples"]))

    def write_user(self, event: dict[str, Any], samples: int) -> None:
        self._log(scalars(event), int(samples))

    def _log(self, rows: list[tuple[str, float]], step: int) -> None:
        if rows:
            self._start().log(dict(rows), step=step)

    def close(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish()
