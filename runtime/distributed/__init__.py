"""Distribution: the ranks, their process group and every collective.

`launch_env` (which launcher started this rank, and the process group made from its
environment), `comm` (the only caller of torch.distributed collectives, with byte accounting),
`script_comm` (DeepSpeed's ``deepspeed.comm`` names for a script's own tensors, public as
``runtime.dist``), `parallel_groups` (Megatron's model-parallel interface), `collective_timeout`
and `teardown` (leaving the group cleanly at exit).
"""

from __future__ import annotations

from runtime.distributed import comm, parallel_groups, script_comm
from runtime.distributed.comm import CommObserver, Communicator, Handle
from runtime.distributed.launch_env import DistEnv, init_distributed, shutdown_distributed
from runtime.distributed.parallel_groups import check_mpu

__all__ = [
    "CommObserver",
    "Communicator",
    "DistEnv",
    "Handle",
    "check_mpu",
    "comm",
    "init_distributed",
    "parallel_groups",
    "script_comm",
    "shutdown_distributed",
]
