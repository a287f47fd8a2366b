"""A training script that hangs on purpose after three steps.

``python hang_worker.py sleep``: rank 1 sleeps before an all-reduce that rank 0 waits in.
``python hang_worker.py stop``: rank 1 stops itself with SIGSTOP (it can no longer answer).
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
    },
)
rank = dist.get_rank()
with open(os.path.join(os.environ["HANG_PIDS"], f"rank-{rank}"), "w") as f:
    f.write(str(os.getpid()))
for _ in range(3):
    engine.backward(engine(torch.randn(1, 4)).sum())
    engine.step()
if rank == 1:
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(600)
dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1
