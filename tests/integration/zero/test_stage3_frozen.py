"""ZeRO stage 3 with frozen parameters (a LoRA-style model: frozen base layers, small trained
adapters) on gloo ranks.

The frozen weights are partitioned like the trained ones (each rank keeps 1/N of them between
uses) but have no gradients and no optimizer state; training matches a single-process
reference that steps only the trained parameters, the frozen ones never change, and
checkpoints carry them (or leave them out with ``exclude_frozen_parameters``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks
from tests.integration.engine.reference import (
    GAS,
    STEPS,
    assert_matches_reference,
    base_config,
    mean_step_losses,
    reference_training,
    train_steps,
)

pytestmark = pytest.mark.multirank

HERE = "tests/integration/zero/test_stage3_frozen.py"
WORLD = 2
CASES = {
    # everything partitioned (threshold 0), prefetched and kept between forward and backward
    "default": {"stage3_param_persistence_threshold": 0},
    # no prefetch, no keeping, a live bound of two layers: frozen units are released during
    # backward and fetched again when autograd needs them
    "tight": {
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
        "stage3_max_live_parameters": 2 * 32 * 32,
        "overlap_comm": False,
    },
    "offload": {
        "stage3_param_persistence_threshold": 0,
        "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "cpu"},
    },
}


class LoraLinear(torch.nn.Module):
    """A frozen base layer plus a trained low-rank update."""

    def __init__(self, n_in: int, n_out: int, rank: int = 2):
        super().__init__()
        self.base = torch.nn.Linear(n_in, n_out)
        self.base.requires_grad_(False)
        self.a = torch.nn.Linear(n_in, rank, bias=False)
        self.b = torch.nn.Linear(rank, n_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


class LoraNet(torch.nn.Module):
    def __init__(self, seed: int = 11):
        super().__init__()
        torch.manual_seed(seed)
        self.l1 = LoraLinear(6, 32)
        self.l2 = LoraLinear(32, 32)
        self.l3 = LoraLinear(32, 32)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x):
        h = torch.tanh(self.l1(x))
        h = torch.tanh(self.l2(h))
        return self.head(torch.tanh(self.l3(h)))


def frozen_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if not p.requires_grad]


def batches(world: int):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, GAS * world * 3, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    return x, torch.tanh(x @ w)


def gathered(runtime, model) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    with runtime.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().float().clone() for n, p in params.items()}


# --------------------------------------------------------------------------- rank side
def _train(runtime, rank, zero):
    model = LoraNet()
    engine, *_ = runtime.initialize(model=model, config=base_config({"stage": 3, **zero}))
    frozen = [p for p in model.parameters() if not p.requires_grad]
    stores = [u.store for u in engine.sharding.coordinator.units if u.frozen]
    x, y = batches(WORLD)
    losses = train_steps(engine, x, y, rank, WORLD, 0, STEPS)
    peak_live = (
        engine.sharding.coordinator.peak_live_numel
    )  # before GatheredParameters gathers everything
    return {
        "losses": losses,
        "peak_live": peak_live,
        "params": gathered(runtime, model),
        "frozen_released": all(p.numel() == 0 for p in frozen),
        "frozen_units": sum(1 for u in engine.sharding.coordinator.units if u.frozen),
        "frozen_store_numel": sum(s.data.numel() for s in stores),
        "frozen_store_device": sorted({str(s.data.device) for s in stores}),
        "optimizer_numel": sum(m.numel() for m in engine.optimizer.master),
    }


def _checkpoints(runtime, rank, out_dir):
    """Save mid-run, then resume into engines whose frozen weights start different."""
    x, y = batches(WORLD)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    engine, *_ = runtime.initialize(model=LoraNet(), config=base_config(zero))
    train_steps(engine, x, y, rank, WORLD, 0, 3)
    engine.save_checkpoint(f"{out_dir}/full")
    engine.save_checkpoint(f"{out_dir}/no-frozen", exclude_frozen_parameters=True)
    out = {"continued": train_steps(engine, x, y, rank, WORLD, 3, 6)}
    for stage in (3, 2):
        model = LoraNet(seed=500)  # other frozen (and trained) values: the checkpoint's win
        fresh, *_ = runtime.initialize(model=model, config=base_config({**zero, "stage": stage}))
        fresh.load_checkpoint(f"{out_dir}/full")
        out[stage] = train_steps(fresh, x, y, rank, WORLD, 3, 6)
    # Without the frozen weights: loads strictly, and the model keeps its own.
    model = LoraNet(seed=500)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    fresh, *_ = runtime.initialize(model=model, config=base_config(zero))
    fresh.load_checkpoint(f"{out_dir}/no-frozen")
    after = gathered(runtime, model)
    out["kept_own_frozen"] = all(torch.equal(after[n], before[n]) for n in before)
    return out


def _save_16bit(runtime, out_dir):
    model = LoraNet()
    cfg = base_config(
        {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    )
    engine, *_ = runtime.initialize(model=model, config=cfg)
    return engine.save_16bit_model(f"{out_dir}/weights", "lora.safetensors")


def worker(out_dir: str):
    import runtime

    rank = int(__import__("os").environ["RANK"])
    out = {name: _train(runtime, rank, zero) for name, zero in CASES.items()}
    out["checkpoints"] = _checkpoints(runtime, rank, out_dir)
    out["saved_16bit"] = _save_16bit(runtime, out_dir)
    return out


# --------------------------------------------------------------------------- test side
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("stage3-frozen")
    return run_ranks(WORLD, f"{HERE}:worker", {"out_dir": str(out_dir)}), out_dir


@pytest.mark.parametrize("case", list(CASES))
def test_lora_training_matches_the_reference_and_frozen_weights_never_move(ranks, case):
    results, _ = ranks
    ref_losses, ref_params = reference_training(LoraNet(), *batches(WORLD))
    initial = dict(LoraNet().named_parameters())
    step_losses = mean_step_losses([r[case]["losses"] for r in results], WORLD)
    assert_matches_reference(case, step_losses, [r[case]["params"] for r in results],
                             ref_losses, ref_params)  # fmt: skip
    for r in results:
        for name in frozen_names(LoraNet()):
            assert torch.equal(r[case]["params"][name], initial[name].detach()), name


@pytest.mark.parametrize("case", list(CASES))
def test_frozen_weights_are_partitioned_without_optimizer_state(ranks, case):
    results, _ = ranks
    model = LoraNet()
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    for r in results:
        res = r[case]
        assert res["frozen_released"]  # whole only while a module runs
        assert res["frozen_units"] == 3  # one per frozen base layer
        # this rank's share of the frozen weights (each unit padded to 2 ranks x 16)
        assert frozen / WORLD <= res["frozen_store_numel"] <= frozen / WORLD + 3 * 16
        assert res["optimizer_numel"] <= trained / WORLD + 8 * 16  # masters: trained only
        device = ["cpu"]  # offload_param puts them in CPU memory; on this machine, the same
        assert res["frozen_store_device"] == device
        if case == "tight":
            # frozen units fetched for backward are released as it moves on, within the bound
            assert res["peak_live"] <= CASES["tight"]["stage3_max_live_parameters"]


def test_checkpoints_carry_frozen_weights_at_any_stage(ranks):
    results, _ = ranks
    for r in results:
        res = r["checkpoints"]
        assert res[3] == res["continued"]  # same stage: bit for bit, frozen weights restored
        for a, b in zip(res[2], res["continued"], strict=True):  # stage 2 reads them whole
            assert abs(a - b) <= 1e-5 * abs(b)
        assert res["kept_own_frozen"]


def test_excluded_frozen_weights_are_listed_not_stored(ranks):
    _, out_dir = ranks
    names = frozen_names(LoraNet())
    full = json.loads(next((out_dir / "full").glob("*/manifest.json")).read_text())
    lean = json.loads(next((out_dir / "no-frozen").glob("*/manifest.json")).read_text())
    assert full["excluded_frozen"] == []
    assert lean["excluded_frozen"] == sorted(names)
    full_bytes = sum(s["bytes"] for s in full["shards"])
    lean_bytes = sum(s["bytes"] for s in lean["shards"])
    frozen_bytes = 4 * sum(p.numel() for p in LoraNet().parameters() if not p.requires_grad)
    assert full_bytes - lean_bytes >= frozen_bytes
    # consolidating the lean checkpoint says what it lacks
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "consolidate", str(out_dir / "no-frozen"),
         "-o", str(out_dir / "lean.safetensors")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"{len(names)} frozen parameter(s) are not in it" in out.stderr


def test_save_16bit_model_gathers_the_frozen_weights(ranks):
    results, out_dir = ranks
    from safetensors.torch import load_file

    assert all(r["saved_16bit"] for r in results)
    saved = load_file(str(out_dir / "weights" / "lora.safetensors"))
    want = LoraNet().state_dict()
    assert sorted(saved) == sorted(want)
    for name, t in want.items():
        assert torch.equal(saved[name], t), name
