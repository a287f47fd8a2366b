"""One rank of this runtime resuming from the DeepSpeed fixture (run by mp_utils.run_ranks)."""

from __future__ import annotations

import os
import sys

import torch

# As a script under zlaunch, the repository is not on the path yet.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

import runtime  # noqa: E402
from tests.fixtures.deepspeed import ds_case  # noqa: E402


def resume(load_dir: str, case: str, steps: int, load_optimizer_states: bool = True) -> dict:
    """Load ``load_dir`` into a fresh engine of the fixture's model (a different random init,
    so only the load can make it right), train ``steps`` steps on the global batches that
    follow the save, and return the mean losses and what the load restored."""
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    model = ds_case.model_for(case, seed=99)
    engine, _, _, _ = runtime.initialize(
        model=model, model_parameters=model.parameters(), config=ds_case.ds_config(case, world)
    )
    path, client = engine.load_checkpoint(load_dir, load_optimizer_states=load_optimizer_states)
    out = {
        "path": path,
        "client_state": client,
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "lr": engine.get_lr(),
        "losses": [],
    }
    for s in range(steps):
        ids = ds_case.rank_batch(ds_case.SAVE_STEP + s, rank, world)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().clone()
        dist.all_reduce(t)
        out["losses"].append(float(t) / world)
    return out


def load_other_model(load_dir: str) -> None:
    """Load into a model with another vocabulary: must raise, the weights untouched."""
    from transformers import LlamaForCausalLM

    world = int(os.environ["WORLD_SIZE"])
    config = ds_case.build_model().config
    config.vocab_size = 80
    model = LlamaForCausalLM(config)
    engine, _, _, _ = runtime.initialize(
        model=model,
        model_parameters=model.parameters(),
        config=ds_case.ds_config("zero2_fp32", world),
    )
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        engine.load_checkpoint(load_dir)
    finally:
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def main() -> None:
    """Under zlaunch --resume --checkpoint-dir DIR: `runtime.initialize` loads DIR's latest
    checkpoint by itself; train ``--steps`` steps and write rank 0's mean losses to ``--out``."""
    import argparse
    import json

    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    model = ds_case.model_for(args.case, seed=99)
    engine, _, _, _ = runtime.initialize(
        model=model, model_parameters=model.parameters(), config=ds_case.ds_config(args.case, world)
    )
    losses = []
    for _ in range(args.steps):
        ids = ds_case.rank_batch(engine.global_steps, rank, world)  # the step after the save
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().clone()
        dist.all_reduce(t)
        losses.append(float(t) / world)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "global_steps": engine.global_steps}, f)


if __name__ == "__main__":
    main()
