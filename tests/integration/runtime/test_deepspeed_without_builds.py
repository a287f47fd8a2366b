"""The suite's comparisons with real DeepSpeed build no C++ op: a build lock that a killed
build left in the user's cache (torch waits on one for ever) cannot hold them, and the session
builds in a directory of its own (tests/fixtures/deepspeed/no_jit.py, tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine.mp_utils import free_port

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"
)

TRAIN = r"""
import logging, torch, deepspeed
from tests.fixtures.deepspeed.no_jit import without_jit_ops
without_jit_ops()
logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
model = torch.nn.Linear(4, 2)
cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
       "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
engine.backward(engine(torch.ones(2, 4)).sum())
engine.step()
print("stepped", engine.global_steps)
"""


def test_a_stale_build_lock_in_the_users_cache_does_not_hold_a_comparison(tmp_path):
    own = os.environ.get("TORCH_EXTENSIONS_DIR", "")
    assert own and os.path.isdir(own) and not os.listdir(own), own  # the session's, empty
    home = tmp_path / "home"
    cache = home / ".cache" / "torch_extensions"
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    for flavour in ("", f"py{sys.version_info.major}{sys.version_info.minor}_cpu"):
        for op in ALL_OPS:  # what a killed build leaves: its folder, and the lock in it
            (cache / flavour / op).mkdir(parents=True, exist_ok=True)
            (cache / flavour / op / "lock").touch()
    env = {
        **os.environ, "HOME": str(home), "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0",
        "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", TRAIN], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stepped 1" in done.stdout
    assert os.listdir(own) == []  # nothing built, here or in the cache
