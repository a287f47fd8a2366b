"""Rank sets written compactly ("0-2,5"), as every report and view prints them."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["rank_ranges"]


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks as a compact list: [0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
