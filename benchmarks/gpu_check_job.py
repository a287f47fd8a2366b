"""The job the device check launches with zlaunch (gpu_check_launch.zlaunch_nccl): one rank
that trains a few ZeRO-2 steps (NCCL on a GPU, gloo on a CPU), says it is ready, then keeps
stepping (and all-reducing its loss) until the stop file appears, so that `zlaunch stacks`
finds it inside a step with collectives in its flight recorder."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed

import runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ready", required=True)
    ap.add_argument("--stop", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
        "steps_per_print": 10_000,
    }
    engine, *_ = runtime.initialize(model=model, config=config)
    x = torch.randn(4, 64, device=engine.device)

    def step() -> None:
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        # At world 1 the runtime's own collectives are skipped (nothing to exchange): the
        # script's own all-reduce is what the flight recorder has to show.
        torch.distributed.all_reduce(loss.detach().reshape(1))

    # Step a little longer than zlaunch's records thread takes to copy the flight recorder
    # (it looks every half second): `zlaunch stacks` then finds records to show.
    warm = time.monotonic() + 2.0
    while time.monotonic() < warm:
        step()
    info = {
        "backend": engine.comm.backend,
        "device": str(engine.device),
        **{k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK",
                                           "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")},
    }  # fmt: skip
    tmp = args.ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, args.ready)
    deadline = time.monotonic() + 120
    while not os.path.exists(args.stop) and time.monotonic() < deadline:
        step()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
