"""The collectives a training script calls, as ``deepspeed.comm`` offers them.

Ported scripts write ``import deepspeed.comm as dist`` and call ``dist.get_rank()``,
``dist.barrier()`` or ``dist.all_reduce(t)``; here that is ``import runtime.distributed.script_comm as dist``.
``group=None`` is the runtime's data-parallel group (the world group, as in DeepSpeed). The
engine's own collectives go through runtime.distributed.comm (explicit group, byte accounting); these are
for the script's own tensors and are not counted in the step metrics.

Before the process group exists every function raises, naming the call that creates it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as torch_dist

from runtime.errors import UsageError

__all__ = [
    "ReduceOp",
    "all_reduce",
    "barrier",
    "broadcast",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_initialized",
]

ReduceOp = torch_dist.ReduceOp


def _require() -> None:
    if not torch_dist.is_initialized():
        raise UsageError(
            "the process group is not initialised; call runtime.init_distributed() or "
            "runtime.initialize(...) first"
        )


def init_distributed(*args, **kwargs) -> None:
    """`runtime.init_distributed` (DeepSpeed's `deepspeed.comm.init_distributed`)."""
    from runtime import init_distributed as init

    init(*args, **kwargs)


def is_initialized() -> bool:
    return torch_dist.is_initialized()


def get_rank(group=None) -> int:
    """This process's rank in `group` (default: the runtime's group)."""
    _require()
    return torch_dist.get_rank(group)


def get_world_size(group=None) -> int:
    """The number of ranks in `group` (default: the runtime's group)."""
    _require()
    return torch_dist.get_world_size(group)


def get_local_rank() -> int:
    """This process's rank on its node (LOCAL_RANK, set by the launcher; 0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier(group=None) -> None:
    """Wait until every rank of `group` has called barrier."""
    _require()
    torch_dist.barrier(group=group)


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over `group` in place (SUM by default, as DeepSpeed). AVG works on gloo
    too (gloo has no AVG: sum, then divide). Returns the work handle when `async_op`."""
    _require()
    if op == ReduceOp.AVG and torch_dist.get_backend(group) == "gloo":
        work = torch_dist.all_reduce(tensor, op=ReduceOp.SUM, group=group, async_op=async_op)
        if async_op:
            work.wait()  # the division needs the sum; the caller still gets a finished handle
        tensor.div_(torch_dist.get_world_size(group))
        return work
    return torch_dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """Copy rank `src`'s `tensor` to every rank of `group`, in place."""
    _require()
    return torch_dist.broadcast(tensor, src=src, group=group, async_op=async_op)
