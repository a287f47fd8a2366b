"""Side-by-side cost of a feature on the training step: two sets of engines, one with the
feature and one without, stepped in alternating rounds in the same processes.

Timings on a shared machine drift by more than most features cost; alternating short rounds
(A B, B A, ...) exposes both sides to the same drift, and each round's A/B ratio is a paired
sample whose median is the figure reported. Used by the benchmarks that measure an
always-on feature's overhead (observability blocks, straggler scoring).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["QuietSink", "Rounds", "free_port", "mlp", "rank_env", "run_interleaved"]


def mlp(hidden: int, layers: int) -> torch.nn.Module:
    """The same seeded MLP for every engine, so the two sides train identical models."""
    torch.manual_seed(0)
    parts: list[torch.nn.Module] = []
    for _ in range(layers):
        parts += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*parts, torch.nn.Linear(hidden, 1))


class QuietSink:
    """Drops rank 0's metrics events, so printing costs neither side."""

    fd = None

    def emit(self, event):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> None:
    """One host's rank environment, as the launcher sets it."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip


@dataclass
class Rounds:
    """Per side: every step's wall and CPU seconds; per round: the second side's mean over
    the first's."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    ratios: list[float] = field(default_factory=list)

    def summary(self, base: str, other: str) -> dict[str, float]:
        return {name: statistics.median(v) for name, v in self.wall.items()} | {
            f"mean_{name}": statistics.fmean(v) for name, v in self.wall.items()
        } | {f"cpu_{name}": statistics.median(v) for name, v in self.cpu.items()} | {
            "median_round_ratio": statistics.median(self.ratios),
            "steps": len(self.wall[base]),
        }  # fmt: skip


def run_interleaved(
    engines: dict[str, list],
    step: Callable[[object], None],
    rounds: int,
    steps_per_round: int,
    warmup: int = 5,
) -> Rounds:
    """Steps each side's engines ``steps_per_round`` times a round, the order of the two sides
    swapped every round. ``engines`` has two keys, base first; each side may hold several
    engines (created in an order that cancels a later engine's drift: A B B A)."""
    base, other = engines
    result = Rounds({base: [], other: []}, {base: [], other: []})

    def run(name: str, steps: int, record: bool) -> float:
        total = 0.0
        for engine in engines[name]:
            for _ in range(steps):
                start, start_cpu = time.perf_counter(), time.process_time()
                step(engine)
                wall = time.perf_counter() - start
                total += wall
                if record:
                    result.wall[name].append(wall)
                    result.cpu[name].append(time.process_time() - start_cpu)
        return total

    for name in engines:  # warm-up: first-step costs (allocation, profiling steps) excluded
        run(name, warmup, record=False)
    for r in range(rounds):
        got = {name: run(name, steps_per_round, record=True)
               for name in ((base, other) if r % 2 == 0 else (other, base))}  # fmt: skip
        result.ratios.append(got[other] / got[base])
    return result
