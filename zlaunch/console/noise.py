"""Lines that every rank prints and that say nothing about the job, kept off the console.

Such a line is hidden on the console only: the rank log keeps every byte the worker wrote, and
the first time a kind is hidden the console says once what it was and where to find it, so
nothing disappears silently. The list is short on purpose: a line joins it only when it is
known to be harmless in every case, and is matched by a fixed string, never a pattern.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Noise", "KNOWN_NOISE", "NoiseFilter"]


@dataclass(frozen=True)
class Noise:
    """One kind of harmless line."""

    needle: str
    """A fixed substring that only this line contains."""
    note: str
    """What it means, said once on the console when the first such line is hidden."""


KNOWN_NOISE: tuple[Noise, ...] = (
    Noise(
        "[c10d] The hostname of the client socket cannot be retrieved",
        "hid c10d's 'hostname of the client socket cannot be retrieved' warnings: c10d found no "
        "reverse DNS name for a peer's address, which only affects its own log messages "
        "(the lines are in the rank logs)",
    ),
)


class NoiseFilter:
    """Splits a batch of a rank's lines into the ones to show and the known noise."""

    def __init__(self, known: Sequence[Noise] = KNOWN_NOISE) -> None:
        self.known = tuple(known)
        self.hidden: dict[Noise, int] = {}

    def keep(self, lines: Sequence[str]) -> tuple[list[str], list[Noise]]:
        """The lines to show, and the kinds hidden here for the first time (to note once)."""
        shown: list[str] = []
        first: list[Noise] = []
        joined = "\n".join(lines)  # a needle has no newline: one search for the whole batch
        if not any(kind.needle in joined for kind in self.known):
            return list(lines), first
        for line in lines:
            kind = next((k for k in self.known if k.needle in line), None)
            if kind is None:
                shown.append(line)
                continue
            if kind not in self.hidden:
                first.append(kind)
            self.hidden[kind] = self.hidden.get(kind, 0) + 1
        return shown, first
