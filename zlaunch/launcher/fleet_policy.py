"""Which hosts the next attempt runs on when the fleet changes: shrink, swap in a spare, grow.

Pure: host names in, host names out, no clock and no I/O; table-tested in
``tests/unit/launcher/test_fleet_policy.py``. The restart policy
(``zlaunch/launcher/restart_policy.py``) calls it after every attempt of a job with a node range
(``--nodes MIN:MAX``, or ``--min-nodes``/``--max-nodes``); the launcher supplies the sets:

- ``leaving``: hosts that must not be in the next attempt: lost (agent gone, unreachable),
  preempted, or dropped by another policy (a slow host taken out);
- ``ready``: hosts outside the attempt that may join: they answered a probe (a lost host that
  came back, a host added to the hostfile), or are spares never tried yet;
- ``swap_out``: hosts replaced by a ready host when there is one, and kept otherwise;
- ``grow``: fill up to the range's maximum with ready hosts (the job grows back), instead of
  only keeping the count it had.

The hosts of an attempt are always in hostfile order (the rank order), whatever order they
joined in: ranks are numbered host by host, and the checkpoint reshards to any order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["NodeRange", "Fleet", "BelowMinimum", "next_fleet"]


@dataclass(frozen=True)
class NodeRange:
    """How many hosts a job may run on: ``--nodes MIN:MAX`` (torchrun's spelling)."""

    min: int
    """Below this many hosts the job stops (after saving, when it can)."""
    max: int
    """The job never runs on more hosts than this; it grows back up to it."""

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"a node range needs 1 <= MIN <= MAX, got {self.min}:{self.max}")

    def __str__(self) -> str:
        return f"{self.min}:{self.max}"


@dataclass(frozen=True)
class Fleet:
    """The next attempt's hosts, and how they differ from the last attempt's."""

    hosts: tuple[str, ...]
    """Hostfile order (the rank order)."""
    joined: tuple[str, ...] = ()
    """Hosts new in it: grown onto, or swapped in for one that left."""
    left: tuple[str, ...] = ()
    """Hosts of the last attempt that are not in it."""

    @property
    def changed(self) -> bool:
        return bool(self.joined or self.left)


@dataclass(frozen=True)
class BelowMinimum:
    """Fewer hosts than the range's minimum would be left: the job stops."""

    hosts: tuple[str, ...]
    """What would have been left."""
    minimum: int
    left: tuple[str, ...] = ()


def next_fleet(
    current: Sequence[str],
    listed: Sequence[str],
    nodes: NodeRange,
    *,
    leaving: Collection[str] = (),
    ready: Collection[str] = (),
    swap_out: Collection[str] = (),
    grow: bool = False,
) -> Fleet | BelowMinimum:
    """The hosts of the attempt after one on ``current``.

    ``listed`` is every host the job may use, in hostfile order (a host of ``current`` no
    longer listed, because the hostfile was rewritten without it, leaves). Ready hosts are
    taken in hostfile order: first to replace swapped-out hosts, then to keep the count the
    attempt had, then (``grow``) up to ``nodes.max``.
    """
    position = {name: index for index, name in enumerate(listed)}
    leaving, swap_out = set(leaving), set(swap_out)
    kept = [h for h in current if h not in leaving and h in position]
    pool = [h for h in listed if h in ready and h not in current and h not in leaving]
    joined: list[str] = []
    for host in list(kept):
        if host in swap_out and pool:
            kept.remove(host)
            joined.append(pool.pop(0))
    target = nodes.max if grow else min(len(current), nodes.max)
    while len(kept) + len(joined) < target and pool:
        joined.append(pool.pop(0))
    while len(kept) + len(joined) > nodes.max:  # a range narrower than the attempt was
        (joined or kept).pop()
    hosts = tuple(sorted(kept + joined, key=position.__getitem__))
    left = tuple(h for h in current if h not in hosts)
    if len(hosts) < nodes.min:
        return BelowMinimum(hosts, nodes.min, left)
    return Fleet(hosts, tuple(h for h in hosts if h in joined), left)
