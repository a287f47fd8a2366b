"""`offload_param.device: "nvme"` at stage 3 on two gloo ranks: the losses and parameters of
CPU offload (alone, and with the optimizer on NVMe too: ZeRO-Infinity),
 the parameter swap files private and gone after the engine closes, and
checkpoints that move between NVMe and CPU parameter offload both ways."""

from __future__ import annotations

import os

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks
from tests.integration.engine.reference import STEPS, base_config, small_model, train_steps

pytestmark = pytest.mark.multirank

HERE = "tests/integration/zero/test_nvme_param_offload.py"
# Threshold 0: every parameter is partitioned, so every unit's shard goes through the files.
ZERO = {"stage": 3, "sub_group_size": 200, "stage3_param_persistence_threshold": 0}
# (offload_param, offload_optimizer) per run; "nvme-deep": four writes behind, not one.
RUNS = {
    "cpu": ("cpu", "cpu"),
    "nvme": ("nvme", "cpu"),
    "infinity": ("nvme", "nvme"),
    "nvme-deep": ("nvme-deep", "cpu"),
}


def _batches(world: int):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, 4 * world * 4, 6, generator=g)
    return x, torch.tanh(x @ torch.randn(6, 3, generator=g))


def _offload(device: str, path: str) -> dict:
    if device == "cpu":
        return {"device": "cpu"}
    block = {"device": "nvme", "nvme_path": path, "buffer_count": 1}
    if device == "nvme-deep":
        block["buffer_count"] = 4
    return block


def _config(param: str, opt: str, path: str, **extra) -> dict:
    zero = {
        **ZERO,
        "offload_param": _offload(param, path),
        "offload_optimizer": _offload(opt, path),
    }
    return base_config(zero, **extra)


def _swap_dirs(path: str, rank: int) -> list[str]:
    if not os.path.isdir(path):
        return []
    return sorted(n for n in os.listdir(path) if f"rank{rank}-" in n)


def worker(nvme_path: str, ckpt_dir: str):
    import runtime

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    x, y = _batches(world)
    out = {}
    for name, (param, opt) in RUNS.items():
        path = os.path.join(nvme_path, name)
        model = small_model()
        engine, *_ = runtime.initialize(model=model, config=_config(param, opt, path))
        run = {"dirs": _swap_dirs(path, rank), "modes": []}
        for d in run["dirs"]:
            full = os.path.join(path, d)
            run["modes"].append((os.stat(full).st_mode & 0o777, sorted(os.listdir(full))))
        store = engine.sharding.store
        run["losses"] = train_steps(engine, x, y, rank, world, 0, STEPS)
        # Bytes that went through the parameter files, and what one pass over the shards is.
        run["shard_bytes"] = store.layout.shard_numel * 4
        stats = getattr(store, "swapper", None)
        run["moved"] = (stats.stats.bytes_read, stats.stats.bytes_written) if stats else None
        with torch.no_grad():
            run["out"] = engine(x[0][:4]).float()
        run["masters"] = [(i, m.clone()) for i, m in engine.named_master_shards()]
        engine.optimizer.close()
        run["left"] = _swap_dirs(path, rank)
        out[name] = run
    # Checkpoints both ways with bf16: saved under one parameter offload, resumed under the
    # other, the next steps' losses are those of the run that never stopped.
    bf16 = {"bf16": {"enabled": True}}
    resumed = {}
    for saver, loader in (("nvme", "cpu"), ("cpu", "nvme")):
        path = os.path.join(nvme_path, f"ck-{saver}")
        tag_dir = os.path.join(ckpt_dir, saver)
        engine, *_ = runtime.initialize(
            model=small_model(), config=_config(saver, "cpu", path, **bf16)
        )
        train_steps(engine, x, y, rank, world, 0, 2)
        engine.save_checkpoint(tag_dir, tag="t")
        straight = train_steps(engine, x, y, rank, world, 2, 6)
        engine2, *_ = runtime.initialize(
            model=small_model(), config=_config(loader, "cpu", path + "-load", **bf16)
        )
        engine2.load_checkpoint(tag_dir, tag="t")
        again = train_steps(engine2, x, y, rank, world, 2, 6)
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


@pytest.mark.parametrize("name", ["nvme", "infinity", "nvme-deep"])
def test_nvme_param_offload_trains_like_cpu_offload(results, name):
    for rank, r in enumerate(results):
        cpu, nvme = r["cpu"], r[name]
        assert cpu["losses"][-1] < cpu["losses"][0]  # it trained
        # Same arithmetic on the same values: only where the shards wait differs.
        assert nvme["losses"] == cpu["losses"]
        torch.testing.assert_close(nvme["out"], cpu["out"], rtol=0, atol=0)
        # The shard view reads swapped masters back (ZeRO-Infinity's are in files).
        assert [i for i, _ in nvme["masters"]] == [i for i, _ in cpu["masters"]]
        assert all(m.numel() > 0 for _, m in nvme["masters"])
        for (_, a), (_, b) in zip(nvme["masters"], cpu["masters"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        # One private directory per tier (parameters; optimizer too for ZeRO-Infinity), no
        # named data files, all gone once the engine is closed.
        want = 2 if name == "infinity" else 1
        assert len(nvme["dirs"]) == want and all(f"rank{rank}-" in d for d in nvme["dirs"])
        assert nvme["modes"] == [(0o700, ["owner"])] * want
        assert nvme["left"] == []
        # The shards really lived in the files: every step wrote them all once (and the
        # partitioning once more); every step's first gather read them all again.
        read, written = nvme["moved"]
        assert written == (STEPS + 1) * nvme["shard_bytes"]
        assert read >= (STEPS + 1) * nvme["shard_bytes"]


@pytest.mark.parametrize("saver", ["nvme", "cpu"])
def test_checkpoints_move_between_nvme_and_cpu_param_offload(results, saver):
    for r in results:
        straight, again = r["resumed"][saver]
        assert again == pytest.approx(straight, rel=1e-6, abs=1e-7)
