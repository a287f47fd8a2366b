"""A rank that trains a few steps and exits, to watch how it leaves its process group.

    python exit_worker.py train STAGE [--hold-group]
    python exit_worker.py fail-in-collective

``train`` ends normally; ``--hold-group`` keeps a reference to the world group in a global, as
some user scripts do. An atexit handler registered before the runtime's (so it runs after it)
prints the gloo worker threads still alive: ``backend threads left: N``.
``fail-in-collective``: rank 0 raises with an all_reduce in flight; the other ranks sleep.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

import runtime
from runtime.distributed.comm import Communicator
from runtime.distributed.launch_env import init_distributed


def backend_threads() -> int:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names.count("pt_gloo_runloop")


def train(stage: int, hold_group: bool) -> None:
    atexit.register(lambda: print(f"backend threads left: {backend_threads()}", flush=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "overlap_comm": True, "reduce_bucket_size": 500},
        "steps_per_print": 100,
    }
    engine, *_ = runtime.initialize(model=model, config=config)
    if hold_group:
        globals()["HELD_GROUP"] = dist.group.WORLD
    for _ in range(5):
        loss = engine(torch.randn(4, 32)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    globals()["ENGINE"] = engine  # alive until interpreter teardown, as in a script's globals
    print(f"rank {dist.get_rank()} trained", flush=True)


def fail_in_collective() -> None:
    init_distributed()
    comm = Communicator(None)
    if dist.get_rank() == 0:
        globals()["IN_FLIGHT"] = comm.all_reduce(torch.ones(1000), async_op=True)
        raise RuntimeError("rank 0 fails with a collective in flight")
    time.sleep(120)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "train":
        train(int(sys.argv[2]), "--hold-group" in sys.argv)
    else:
        fail_in_collective()
