"""Host sets written compactly ("node[001-004,007],login1"), as reports at scale print them:
a thousand ranks on 128 hosts must not make a report line name 128 hosts one by one."""

from __future__ import annotations

from collections.abc import Iterable

from zlaunch.wire import compress

__all__ = ["host_ranges"]


def host_ranges(hosts: Iterable[str], limit: int | None = None) -> str:
    """Distinct hosts, sorted, as a Slurm-style hostlist: ["n2", "n1", "n3", "x"] ->
    "n[1-3],x". With ``limit``, a longer list names as many of the first hosts as fit and
    says how many there are in all ("node[000,002,004],... (128 hosts)")."""
    names = sorted(set(hosts), key=_natural)
    text = compress(names)
    if limit is None or len(text) <= limit:
        return text
    tail = f",... ({len(names)} hosts)"
    lo, hi = 1, len(names) - 1  # the most leading hosts that fit (at least one)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(compress(names[:mid])) + len(tail) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return compress(names[:lo]) + tail


def _natural(name: str) -> tuple:
    """node2 before node10: digit runs compare as numbers."""
    key: list[tuple[int, int | str]] = []
    digits = ""
    for ch in name + "\0":
        if ch.isdigit():
            digits += ch
            continue
        if digits:
            key.append((0, int(digits)))
            digits = ""
        key.append((1, ch))
    return tuple(key)
