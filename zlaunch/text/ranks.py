"""Rank sets written compactly ("0-2,5"), as every report and view prints them."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["rank_ranges"]


def rank_ranges(ranks: Iterable[int], limit: int | None = None) -> str:
    """Ranks as a compact list: [0, 1, 2, 5] -> "0-2,5".

    With ``limit``, a list longer than ``limit`` characters keeps its first spans and its
    last one and says how many ranks it holds: every other rank of 1024 ->
    "0,2,4,6,...,1022 (512 ranks)". A cut list never reads as a complete one.
    """
    spans: list[list[int]] = []
    count = 0
    for r in sorted(set(ranks)):
        count += 1
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    text = ",".join(words)
    if limit is None or len(text) <= limit:
        return text
    tail = f",...,{words[-1]} ({count} ranks)"
    kept: list[str] = []
    used = 0
    for word in words[:-1]:
        if kept and used + len(word) + 1 + len(tail) > limit:
            break
        kept.append(word)
        used += len(word) + 1
    return ",".join(kept) + tail
