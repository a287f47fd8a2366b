"""A write under ``GatheredParameters(params, modifier_rank=0)`` is rank 0's value everywhere:
on every rank's parameter, in the fp32 master (the next step starts from it), in
``safe_get_full_fp32_param`` and in a saved checkpoint; at every stage, fp32 and bf16.

At stages 0-2 the parameters are whole on every rank, so nothing needs gathering; without the
write-back (`runtime.zero.flat_writeback`) the next step would overwrite the write with the
master (mixed precision), mix the ranks' writes shard by shard (stages 1-2) or leave the ranks
with different weights (stage 0). The reference is the same model built with rank 0's values
before ``initialize``: the two must train identically, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks

HERE = "tests/integration/zero/test_gathered_writes.py"
STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16")
WRITTEN = ("0.weight", "2.bias")
"""``0.weight`` spans both ranks' shards at stages 1-3; ``2.bias`` lies in one."""


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def config(stage: int, precision: str) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def chosen_values(rank: int, shapes: dict) -> dict[str, torch.Tensor]:
    """What ``rank`` writes: its own draw, representable in bf16 (so exact in both dtypes)."""
    g = torch.Generator().manual_seed(100 + rank)
    return {n: torch.randn(s, generator=g).bfloat16().float() for n, s in shapes.items()}


def full_params(runtime, m) -> dict[str, torch.Tensor]:
    params = dict(m.named_parameters())
    with runtime.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().float().clone() for n, p in params.items()}


def train(engine, rank: int, steps: int) -> list[float]:
    g = torch.Generator().manual_seed(7 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g)
        y = torch.randn(4, 4, generator=g)
        dtype = next(engine.module.parameters()).dtype
        loss = (engine(x.to(dtype)).float() - y).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def write_then_train(out_dir: str) -> dict:
    import os

    import torch.distributed as dist

    import runtime
    from runtime.deepspeed_api.deepspeed.utils import (
        get_fp32_state_dict_from_zero_checkpoint,
        safe_get_full_fp32_param,
    )

    rank = int(os.environ["RANK"])
    out = {}
    for stage in STAGES:
        for precision in PRECISIONS:
            key = f"{stage}-{precision}"
            m = model()
            shapes = {n: tuple(p.shape) for n, p in m.named_parameters() if n in WRITTEN}
            mine = chosen_values(rank, shapes)
            engine, *_ = runtime.initialize(
                model=m, model_parameters=m.parameters(), config=config(stage, precision)
            )
            params = dict(m.named_parameters())
            written = [params[n] for n in WRITTEN]
            with runtime.zero.GatheredParameters(written, modifier_rank=0), torch.no_grad():
                for n in WRITTEN:
                    params[n].copy_(mine[n])  # every rank writes; rank 0's value must win
            after_write = full_params(runtime, m)
            fp32 = {n: safe_get_full_fp32_param(params[n]) for n in WRITTEN}
            engine.save_checkpoint(f"{out_dir}/{key}")
            dist.barrier()
            saved = None
            if rank == 0:
                state = get_fp32_state_dict_from_zero_checkpoint(f"{out_dir}/{key}")
                saved = {n: state[n].clone() for n in WRITTEN}
            losses = train(engine, rank, 3)
            trained = full_params(runtime, m)

            # The reference: rank 0's values in the model before initialize.
            ref_model = model()
            ref_values = chosen_values(0, shapes)
            with torch.no_grad():
                for n, p in ref_model.named_parameters():
                    if n in WRITTEN:
                        p.copy_(ref_values[n])
            ref, *_ = runtime.initialize(
                model=ref_model,
                model_parameters=ref_model.parameters(),
                config=config(stage, precision),
            )
            ref_losses = train(ref, rank, 3)
            out[key] = {
                "chosen": mine,
                "after_write": {n: after_write[n] for n in WRITTEN},
                "fp32": fp32,
                "saved": saved,
                "losses": losses,
                "ref_losses": ref_losses,
                "trained": trained,
                "ref_trained": full_params(runtime, ref_model),
            }
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("gathered-writes"))
    return run_ranks(2, f"{HERE}:write_then_train", {"out_dir": out_dir}, timeout=300)


@pytest.mark.multirank
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_write_under_modifier_rank_is_rank0s_everywhere(results, stage, precision):
    key = f"{stage}-{precision}"
    chosen = results[0][key]["chosen"]
    # The ranks really wrote different values: only the broadcast makes them agree.
    assert not torch.equal(chosen["0.weight"], results[1][key]["chosen"]["0.weight"])
    for rank, res in enumerate(results):
        r = res[key]
        for n in WRITTEN:
            assert torch.equal(r["after_write"][n], chosen[n]), (key, rank, n)
            assert torch.equal(r["fp32"][n], chosen[n]), (key, rank, n)
    saved = results[0][key]["saved"]
    for n in WRITTEN:
        assert saved[n].dtype == torch.float32
        assert torch.equal(saved[n], chosen[n]), (key, n)


@pytest.mark.multirank
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_training_after_the_write_starts_from_it(results, stage, precision):
    """The same losses and weights, bit for bit, as a model built with the values: the
    master took the write (else the first step would train from the old weights)."""
    key = f"{stage}-{precision}"
    for rank, res in enumerate(results):
        r = res[key]
        assert r["losses"] == r["ref_losses"], (key, rank)
        for n, t in r["trained"].items():
            assert torch.equal(t, r["ref_trained"][n]), (key, rank, n)
    # Every rank holds the same trained weights.
    for n, t in results[0][key]["trained"].items():
        assert torch.equal(t, results[1][key]["trained"][n]), (key, n)
