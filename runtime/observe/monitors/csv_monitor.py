"""`csv_monitor`: DeepSpeed's layout, one CSV per metric under ``output_path/job_name``.

A metric ``Train/Samples/train_loss`` goes to ``Train_Samples_train_loss.csv`` with the header
``step,train_loss`` and one ``samples,value`` row per report (DeepSpeed's csvMonitor). Unlike
DeepSpeed, a file that already has rows (a restarted job) gets no second header.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from .names import scalars

__all__ = ["CsvMonitor"]


class CsvMonitor:
    def __init__(self, output_path: str, job_name: str):
        self.log_dir = os.path.join(output_path, job_name)
        os.makedirs(self.log_dir, exist_ok=True)

    def path_of(self, name: str) -> str:
        return os.path.join(self.log_dir, name.replace("/", "_").replace(" ", "_") + ".csv")

    def _write(self, rows: list[tuple[str, float]], step: int) -> None:
        for name, value in rows:
            path = self.path_of(name)
            fresh = not os.path.exists(path) or os.path.getsize(path) == 0
            with open(path, "a", newline="") as handle:
                writer = csv.writer(handle)
                if fresh:
                    writer.writerow(["step", name.rsplit("/", 1)[-1]])
                writer.writerow([step, value])

    def write(self, event: dict[str, Any]) -> None:
        self._write(scalars(event), int(event["samples"]))

    def write_user(self, event: dict[str, Any], samples: int) -> None:
        self._write(scalars(event), int(samples))
