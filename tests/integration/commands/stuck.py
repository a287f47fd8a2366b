"""A job that hangs the way real ones do: every rank but one waits in the gradient reduction
for a rank stuck elsewhere (here: sleeping in `wait_for_data`). Used by the stacks tests.

    stuck.py --stuck-rank R [--chatter]

--chatter: the stuck rank also prints a line every 50 ms from a second thread (a rank that
keeps logging while its main thread is stuck).
"""

import argparse
import threading
import time

import torch

import runtime


def wait_for_data():
    time.sleep(3600)


def chatter():
    while True:
        print("still here", flush=True)
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--chatter", action="store_true")
    args = parser.parse_args()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    engine, *_ = runtime.initialize(model=torch.nn.Linear(4, 4), config=config)
    print(f"rank {engine.global_rank} initialized", flush=True)
    if engine.global_rank == args.stuck_rank:
        if args.chatter:
            threading.Thread(target=chatter, daemon=True).start()
        wait_for_data()
    loss = engine(torch.randn(1, 4)).sum()
    engine.backward(loss)  # waits for the stuck rank's gradients
    engine.step()


if __name__ == "__main__":
    main()
