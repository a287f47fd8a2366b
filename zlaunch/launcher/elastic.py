"""Going on with fewer hosts: the hosts and the batch of a restart after a host was lost.

With ``--max-restarts N --min-nodes M``, a host whose agent connection broke (the host
crashed, its link went down, every process on it was killed) is dropped: the next attempt
runs on the remaining hosts plus spares (hosts listed beyond ``--num-nodes``, in hostfile
order), as long as at least M hosts are left. With ``--max-nodes`` a host that comes back
(zlaunch/launcher/host_probe.py) joins again at a step boundary: `options_after_grow`, the
hosts in hostfile order (zlaunch/launcher/fleet_policy.py). The global batch is kept: the ranks get the
batch triple for the new world size (`zlaunch.wire.batch`) and resume from the latest
checkpoint, which loads at any world size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from zlaunch.errors import LaunchError
from zlaunch.job import Host, LaunchOptions
from zlaunch.launcher.fleet_policy import BelowMinimum, Fleet, NodeRange, next_fleet
from zlaunch.wire import BatchError, BatchOverride, kept_batch

__all__ = ["batch_for_world", "next_hosts", "options_after_grow", "options_after_loss"]


def next_hosts(
    current: Sequence[Host], lost: Iterable[str], spares: Sequence[Host], min_nodes: int
) -> tuple[list[Host], list[Host]]:
    """(hosts of the next attempt, spares still unused). Raises LaunchError below min_nodes."""
    lost = set(lost)
    kept = [h for h in current if h.name not in lost]
    free = [h for h in spares if h.name not in lost]
    taken, rest = free[: len(current) - len(kept)], free[len(current) - len(kept) :]
    hosts = kept + taken
    if len(hosts) < min_nodes:
        raise LaunchError(
            f"lost {', '.join(sorted(lost))}: {len(hosts)} host(s) left, fewer than "
            f"--min-nodes {min_nodes}; job stopped"
        )
    return hosts, rest


def _batch_for(options: LaunchOptions, world: int, new_world: int) -> str | None:
    if options.config_path is None or world == new_world:
        return options.batch
    from runtime.config import ConfigError, load_config

    try:
        return batch_for_world(load_config(options.config_path), world, new_world).encode()
    except ConfigError as err:
        raise LaunchError(f"cannot restart on {new_world} ranks: {err}") from None


def batch_for_world(config, world: int, new_world: int) -> BatchOverride:
    """The batch triple at ``new_world`` ranks with the ``world``-rank global batch of
    ``config`` (a `runtime.config.Config`) kept; ConfigError when it cannot be kept."""
    from runtime.config import ConfigError

    resolved = config.resolve(world)
    try:
        return kept_batch(
            resolved.train_batch_size, resolved.train_micro_batch_size_per_gpu, new_world
        )
    except BatchError as err:
        raise ConfigError(str(err)) from None


def options_after_loss(
    first: LaunchOptions, current: LaunchOptions, lost: Iterable[str]
) -> LaunchOptions:
    """The options of the attempt after ``lost`` hosts were lost; ``first`` is the job's
    first attempt (whose world size the global batch was set for)."""
    hosts, spares = next_hosts(current.hosts, lost, current.spare_hosts, first.min_nodes)
    new_world = sum(len(h.slots) for h in hosts)
    return dataclasses.replace(
        current,
        hosts=tuple(hosts),
        spare_hosts=tuple(spares),
        batch=_batch_for(first, first.world_size, new_world),
    )


def options_after_grow(
    first: LaunchOptions, current: LaunchOptions, joining: Sequence[Host], order: Sequence[str]
) -> tuple[LaunchOptions, Fleet]:
    """The options of the attempt after ``joining`` hosts answered, up to --max-nodes, with
    the hosts in ``order`` (the hostfile's; hosts it does not name go last), the global batch
    of ``first`` kept; and the fleet change (who joined)."""
    nodes = NodeRange(first.min_nodes or 1, first.max_nodes or len(current.hosts))
    by_name = {h.name: h for h in (*current.hosts, *joining)}
    listed = [name for name in order if name in by_name]
    listed += [name for name in by_name if name not in listed]
    fleet = next_fleet(
        [h.name for h in current.hosts], listed, nodes, ready=[h.name for h in joining], grow=True
    )
    if isinstance(fleet, BelowMinimum):  # cannot be: nobody leaves when hosts join
        raise LaunchError(f"growing left {len(fleet.hosts)} host(s), fewer than {fleet.minimum}")
    hosts = [by_name[name] for name in fleet.hosts]
    new_world = sum(len(h.slots) for h in hosts)
    options = dataclasses.replace(
        current,
        hosts=tuple(hosts),
        spare_hosts=tuple(h for h in current.spare_hosts if h.name not in fleet.hosts),
        batch=_batch_for(first, first.world_size, new_world),
    )
    return options, fleet
