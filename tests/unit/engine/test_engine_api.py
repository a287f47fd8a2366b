"""The engine's API in one process (world size 1): initialize, config sources, client optimizer
and scheduler, the accumulation-misuse error, optimizer names, data loader, counters."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist

from runtime.config import ConfigError
from runtime.optim.optimizers import build_optimizer, resolve_optimizer_class


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


def test_optimizer_names_follow_deepspeed():
    t = [torch.zeros(3)]
    assert resolve_optimizer_class("Adam", {}) is torch.optim.AdamW
    assert resolve_optimizer_class("adam", {"adam_w_mode": False}) is torch.optim.Adam
    assert resolve_optimizer_class("ADAMW", {}) is torch.optim.AdamW
    assert resolve_optimizer_class("sgd", {}) is torch.optim.SGD
    assert resolve_optimizer_class("rmsprop", {}) is torch.optim.RMSprop
    with pytest.raises(ConfigError, match="unknown optimizer"):
        resolve_optimizer_class("Lamb2", {})
    cfg = types.SimpleNamespace(
        type="Adam",
        params={"lr": 0.1, "betas": [0.8, 0.9], "adam_w_mode": False, "torch_adam": True},
    )
    opt = build_optimizer(cfg, [{"params": t}])
    assert type(opt) is torch.optim.Adam and opt.defaults["betas"] == (0.8, 0.9)
    assert opt.defaults["fused"] is True  # the fast kernel on CPU
    bad = types.SimpleNamespace(type="SGD", params={"lr": 0.1, "betas": [0.9, 0.9]})
    with pytest.raises(ConfigError, match="does not take betas"):
        build_optimizer(bad, [{"params": t}])
