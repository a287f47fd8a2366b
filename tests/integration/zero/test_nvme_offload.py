"""`offload_optimizer.device: "nvme"` at stages 1, 2 and 3 on two gloo ranks: the losses and
parameters of CPU offload, the swap files private and gone after the engine closes, and
checkpoints that move between NVMe and CPU offload both ways."""

from __future__ import annotations

import os

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks
from tests.integration.engine.reference import (
    STEPS,
    base_config,
    small_model,
    train_steps,
)

pytestmark = pytest.mark.multirank

HERE = "tests/integration/zero/test_nvme_offload.py"
# Small buckets and sub-groups: several swap chunks per step, so read-ahead and write-behind
# of distinct chunks really run while another is updated.
ZERO = {
    "allgather_bucket_size": 300,
    "sub_group_size": 200,
    "stage3_param_persistence_threshold": 0,
}


def _batches(world: int):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, 4 * world * 4, 6, generator=g)
    return x, torch.tanh(x @ torch.randn(6, 3, generator=g))


def _config(stage: int, device: str, nvme_path: str, **extra) -> dict:
    off = {"device": device, "nvme_path": nvme_path} if device == "nvme" else {"device": device}
    return base_config({**ZERO, "stage": stage, "offload_optimizer": off}, **extra)


def _run(runtime, stage, device, nvme_path, rank, world, **extra):
    model = small_model()
    engine, *_ = runtime.initialize(model=model, config=_config(stage, device, nvme_path, **extra))
    x, y = _batches(world)
    swap = None
    if device == "nvme":
        (name,) = [n for n in os.listdir(nvme_path) if f"rank{rank}-" in n]
        path = os.path.join(nvme_path, name)
        swap = {"mode": os.stat(path).st_mode & 0o777, "names": sorted(os.listdir(path))}
    losses = train_steps(engine, x, y, rank, world, 0, STEPS)
    return engine, model, losses, swap


def _params(model):
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def worker(nvme_path: str, ckpt_dir: str):
    import runtime

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    out = {}
    for stage in (1, 2, 3):
        for device in ("cpu", "nvme"):
            path = os.path.join(nvme_path, f"s{stage}")
            engine, model, losses, swap = _run(runtime, stage, device, path, rank, world)
            out[(stage, device)] = {"losses": losses, "params": _params(model), "swap": swap}
            if device == "nvme":
                engine.optimizer.close()
                out[(stage, device)]["left"] = [n for n in os.listdir(path) if f"rank{rank}-" in n]
    # Checkpoints both ways at stage 3 with bf16: saved under one offload, resumed under the
    # other, the next steps' losses are those of the run that never stopped.
    x, y = _batches(world)
    bf16 = {"bf16": {"enabled": True}}
    resumed = {}
    for saver, loader in (("nvme", "cpu"), ("cpu", "nvme")):
        path = os.path.join(nvme_path, f"ck-{saver}")
        tag_dir = os.path.join(ckpt_dir, saver)
        model = small_model()
        engine, *_ = runtime.initialize(model=model, config=_config(3, saver, path, **bf16))
        train_steps(engine, x, y, rank, world, 0, 2)
        engine.save_checkpoint(tag_dir, tag="t")
        straight = train_steps(engine, x, y, rank, world, 2, STEPS)
        engine2, *_ = runtime.initialize(
            model=small_model(), config=_config(3, loader, path + "-load", **bf16)
        )
        engine2.load_checkpoint(tag_dir, tag="t")
        again = train_steps(engine2, x, y, rank, world, 2, STEPS)
        resumed[saver] = (straight, again)
    out["resumed"] = resumed
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    nvme = tmp_path_factory.mktemp("nvme")
    ckpt = tmp_path_factory.mktemp("ckpt")
    return run_ranks(
        2, f"{HERE}:worker", {"nvme_path": str(nvme), "ckpt_dir": str(ckpt)}, timeout=300
    )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_nvme_offload_trains_like_cpu_offload(results, stage):
    for r in results:
        cpu, nvme = r[(stage, "cpu")], r[(stage, "nvme")]
        assert nvme["losses"] == pytest.approx(cpu["losses"], rel=1e-6, abs=1e-7)
        assert cpu["losses"][-1] < cpu["losses"][0]  # it trained
        for name, p in cpu["params"].items():
            torch.testing.assert_close(nvme["params"][name], p, rtol=1e-6, atol=1e-7)
        # The rank's directory is private and shows no data files (they have no names).
        assert nvme["swap"] == {"mode": 0o700, "names": ["owner"]}
        assert nvme["left"] == []


@pytest.mark.parametrize("saver", ["nvme", "cpu"])
def test_checkpoints_move_between_nvme_and_cpu_offload(results, saver):
    for r in results:
        straight, again = r["resumed"][saver]
        assert again == pytest.approx(straight, rel=1e-6, abs=1e-7)
