"""The spec frame of one node: what its agent starts, with the shared environment sent once.

Every worker of a node gets the same forwarded names, env files and --env values; only a few
names (RANK, LOCAL_RANK) differ. Sending the shared part once keeps a spec small whatever the
number of slots. A spec that would still exceed the frame limit is refused here, before
anything is sent, with the names that make it big: an agent cannot read it, and the job would
otherwise never start.
"""

from __future__ import annotations

import json

from zlaunch.errors import UsageError
from zlaunch.job.plan import NodePlan, shared_env
from zlaunch.wire import frames

__all__ = ["shared_env", "node_spec", "encode_spec"]


def node_spec(
    node: NodePlan, *, master_addr: str, grace: float, heartbeat_timeout: float
) -> frames.Spec:
    common = shared_env([w.env for w in node.workers])
    return frames.Spec(
        cwd=node.cwd,
        master_addr=master_addr,
        grace=grace,
        heartbeat_timeout=heartbeat_timeout,
        env=common,
        workers=[
            frames.WorkerSpec(
                rank=w.rank,
                local_rank=w.local_rank,
                argv=list(w.argv),
                env={k: v for k, v in w.env.items() if k not in common},
            )
            for w in node.workers
        ],
    )


def encode_spec(spec: frames.Spec, host: str, limit: int = frames.MAX_FRAME_BYTES) -> bytes:
    """The spec as a frame; UsageError (exit 2) naming the biggest variables when too long."""
    data = frames.encode(spec)
    if len(data) <= limit:
        return data
    sizes: dict[str, int] = {}
    for env in [spec.env] + [w.env for w in spec.workers]:
        for name, value in env.items():
            sizes[name] = sizes.get(name, 0) + len(json.dumps(value)) - 2  # the quotes
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
    listing = ", ".join(f"{name} ({_mib(size)})" for name, size in biggest)
    raise UsageError(
        f"the start message for {host} would be {_mib(len(data))}, more than the "
        f"{_mib(limit)} an agent reads; the largest variables are {listing}",
        hint="keep large data out of the environment (.zlaunch_env, --env): write it to a file "
        "and pass the file's path",
    )


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"
