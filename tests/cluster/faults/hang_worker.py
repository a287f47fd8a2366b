"""A training script that hangs on purpose after three steps.

``python hang_worker.py sleep``: rank 1 sleeps before an all-reduce that rank 0 waits in.
``python hang_worker.py stop``: rank 1 stops itself with SIGSTOP (it can no longer answer).
``python hang_worker.py barrier``: rank 0 alone calls ``dist.barrier()``; the others go on to
the all-reduce.
``python hang_worker.py skip``: rank 0 skips the all-reduce and goes on to a barrier.
``python hang_worker.py stage3``: under ZeRO-3, rank 0 alone runs a forward (its parameter
all-gathers are collectives), then every rank calls a barrier.
Every rank writes its pid to ``$HANG_PIDS/rank-N`` first, so a test can check it is gone.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import runtime

mode = sys.argv[1]
model = torch.nn.Linear(4, 4)
engine, *_ = runtime.initialize(
    model=model,
    model_parameters=model.parameters(),
    config={
        "train_micro_batch_size_per_gpu": 1,
        "steps_per_print": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_optimization": (
            {"stage": 3, "stage3_param_persistence_threshold": 0} if mode == "stage3" else {}
        ),
    },
)
rank = dist.get_rank()
with open(os.path.join(os.environ["HANG_PIDS"], f"rank-{rank}"), "w") as f:
    f.write(str(os.getpid()))
for _ in range(3):
    engine.backward(engine(torch.randn(1, 4)).sum())
    engine.step()
if mode == "barrier":
    if rank == 0:
        dist.barrier()  # a collective only rank 0 calls
    dist.all_reduce(torch.ones(1))
elif mode == "stage3":
    if rank == 0:
        engine(torch.randn(1, 4))  # an evaluation on rank 0 only
    dist.barrier()
elif mode == "skip":
    if rank != 0:  # rank 0 skips it
        dist.all_reduce(torch.ones(1))
    dist.barrier()
if rank == 1:
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(600)
dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1
