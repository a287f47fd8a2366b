"""Ranks of a multi-rank job that never joined it: what they reported, in words (pure).

zlaunch.worker.boot reports, as each rank's script ends, the largest default process group it
joined (zlaunch/worker/group.py). A rank of an N-rank job that joined none, or a smaller one,
trained on its own: the job "succeeds" N times over while nobody averaged a gradient. That is
said in the job's last lines and recorded in run.json and failure.json, with the fix where one
is known: accelerate on a machine without GPUs forms a process group only when told to use
the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zlaunch.text import rank_ranges

__all__ = ["GroupReport", "ACCELERATE_CPU_FIX", "alone_warning"]

ACCELERATE_CPU_FIX = (
    "accelerate forms a process group on CPU only with ACCELERATE_USE_CPU=1 "
    "(--env ACCELERATE_USE_CPU=1) or Accelerator(cpu=True)"
)


@dataclass(frozen=True)
class GroupReport:
    """One rank's word as its script ended."""

    size: int
    """The largest default process group it joined; 0 for none."""
    accelerate: bool = False
    """Whether the script had loaded accelerate."""
    accelerate_processes: int | None = None
    """How many processes accelerate's state trained with (None: accelerate not set up)."""

    def trained_with(self) -> int:
        """The processes this rank trained with: accelerate's word where it has one."""
        if self.accelerate_processes is not None:
            return min(self.size, self.accelerate_processes) if self.size else 0
        return self.size


def alone_warning(reports: Mapping[int, GroupReport], world_size: int) -> str | None:
    """The warning for the ranks that did not join a group of ``world_size``, or None.

    Ranks that did not report (not Python, killed, ``os._exit``) are not judged.
    """
    if world_size < 2:
        return None
    short = {rank: r for rank, r in reports.items() if r.trained_with() < world_size}
    if not short:
        return None
    never = sorted(rank for rank, r in short.items() if r.trained_with() <= 1)
    smaller = sorted(rank for rank, r in short.items() if r.trained_with() > 1)
    parts = []
    if never:
        parts.append(
            f"{_ranks(never)} of this {world_size}-rank job trained alone, each a world of "
            "one (no process group of the job's size)"
        )
    if smaller:
        sizes = ", ".join(sorted({str(short[r].trained_with()) for r in smaller}))
        parts.append(f"{_ranks(smaller)} joined a process group of {sizes}, not {world_size}")
    text = "; ".join(parts)
    if any(r.accelerate for r in short.values()):
        text += f"; {ACCELERATE_CPU_FIX}"
    else:
        text += "; call torch.distributed.init_process_group() (or your library's setup) in it"
    return text


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
