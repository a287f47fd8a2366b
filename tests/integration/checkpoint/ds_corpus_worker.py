"""One rank of this runtime resuming checkpoints of the DeepSpeed corpus (run by
mp_utils.run_ranks): tests/fixtures/deepspeed/corpus, written by make_corpus.py."""

from __future__ import annotations

import os

import runtime
from runtime.checkpoint import CheckpointError
from tests.fixtures.deepspeed import corpus_cases


def resume_one(load_dir: str, case: str, steps: int, stage: int | None = None) -> dict:
    """Load ``load_dir`` into a fresh engine of the case's model (another random init, so only
    the load can make it right), at ``stage`` (default: the case's), train ``steps`` steps on
    the global batches that follow the save; the mean losses and the counters restored."""
    import torch.distributed as dist

    spec = corpus_cases.CASES[case]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    model = corpus_cases.build(spec, seed=99)
    engine, _, _, _ = runtime.initialize(
        model=model,
        model_parameters=corpus_cases.param_groups(spec, model),
        optimizer=corpus_cases.client_optimizer(spec, corpus_cases.param_groups(spec, model)),
        config=corpus_cases.ds_config(spec, world, stage),
    )
    engine.load_checkpoint(load_dir)
    out = {"global_steps": engine.global_steps, "losses": []}
    for s in range(steps):
        loss = corpus_cases.loss_of(engine, spec, corpus_cases.SAVE_STEP + s, rank, world)
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().clone()
        dist.all_reduce(t)
        out["losses"].append(float(t) / world)
    return out


def masters_one(load_dir: str, case: str, stage: int) -> dict:
    """Load ``load_dir`` into a fresh engine of the case's model at ``stage`` and read every
    parameter's whole fp32 master back (a collective): what the next step starts from, before
    any step has run. Tied tensors are read under each of their names."""
    # The bundled package's function, as a script under --runtime bundled imports it (here the
    # installed DeepSpeed would shadow it).
    from runtime.deepspeed_api.deepspeed.utils import safe_get_full_fp32_param

    spec = corpus_cases.CASES[case]
    world = int(os.environ["WORLD_SIZE"])
    model = corpus_cases.build(spec, seed=99)
    engine, _, _, _ = runtime.initialize(
        model=model,
        model_parameters=corpus_cases.param_groups(spec, model),
        optimizer=corpus_cases.client_optimizer(spec, corpus_cases.param_groups(spec, model)),
        config=corpus_cases.ds_config(spec, world, stage),
    )
    engine.load_checkpoint(load_dir)
    named = engine.module.named_parameters(remove_duplicate=False)
    return {name: safe_get_full_fp32_param(p).flatten().tolist() for name, p in named}


def masters(corpus: str, runs: list[tuple[str, int]]) -> dict:
    """`masters_one` for every (case, stage) of ``runs``, one engine after the other."""
    return {
        f"{case}@z{stage}": masters_one(os.path.join(corpus, case), case, stage)
        for case, stage in runs
    }


def resume(corpus: str, runs: list[tuple[str, int]], steps: int) -> dict:
    """`resume_one` for every (case, stage) of ``runs``, one engine after the other in this
    process group: per run its result, or the CheckpointError's message."""
    out = {}
    for case, stage in runs:
        try:
            out[f"{case}@z{stage}"] = resume_one(os.path.join(corpus, case), case, steps, stage)
        except CheckpointError as err:
            out[f"{case}@z{stage}"] = {"error": str(err)}
    return out
