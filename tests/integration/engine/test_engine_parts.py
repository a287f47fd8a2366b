"""The engine's parts on their own, in one process: gradient accumulation, the script's
optimizer inputs, step hooks, and the sharding strategies' protocol and state accessors."""

from __future__ import annotations

import types

import pytest
import torch

import runtime
from runtime.zero.flat_strategy import FlatStrategy
from runtime.zero.stage3.build import Stage3Strategy
from runtime.zero.strategy import TrainedParam
from tests.unit.engine.test_engine_api import single_process_group  # noqa: F401 - autouse fixture
from tests.unit.engine.test_engine_parts import _net  # shared with the unit half

# --------------------------------------------------------------------------- accumulation


# --------------------------------------------------------------------------- client optimizer


# --------------------------------------------------------------------------- engine assembly
def _config(stage: int, **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": stage},
    }
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize(
    ("stage", "kind"), [(0, FlatStrategy), (2, FlatStrategy), (3, Stage3Strategy)]
)
def test_one_strategy_object_per_stage_behind_the_protocol(stage, kind):
    net = _net()
    engine, optimizer, *_ = runtime.initialize(model=net, config=_config(stage))
    strategy = engine.sharding
    assert isinstance(strategy, kind)
    assert optimizer is strategy.optimizer is engine.optimizer
    assert strategy.replicated is (stage == 0)
    assert strategy.master_dtype == torch.float32
    names = {n: TrainedParam(tuple(p.shape), 0) for n, p in net.named_parameters()}
    assert strategy.trained_params() == names
    owned = strategy.owned_ranges()
    assert [r.master for r in owned] == list(optimizer.master)
    assert all(r.hi - r.lo == r.master.numel() for r in owned)
    for attr in ("flat_params", "reducer", "layout", "stage3"):
        assert not hasattr(engine, attr)


def test_step_hooks_run_after_every_step_with_the_outcome_at_boundaries():
    engine, *_ = runtime.initialize(model=_net(), config=_config(1))
    seen = []
    engine.add_step_hook(
        types.SimpleNamespace(after_step=lambda e, outcome: seen.append((e.micro_steps, outcome)))
    )
    for _ in range(4):
        engine.backward(engine(torch.randn(2, 2)).pow(2).mean())
        engine.step()
    assert [m for m, _ in seen] == [1, 2, 3, 4]
    assert [o is None for _, o in seen] == [True, False, True, False]
    assert seen[3][1].grad_norm == engine.get_global_grad_norm()


def test_precision_state_round_trips_the_loss_scaler():
    engine, *_ = runtime.initialize(
        model=_net(), config=_config(1, fp16={"enabled": True, "initial_scale_power": 4})
    )
    state = engine.precision.state_dict()
    engine.precision.scaler.update(True)  # an overflow halves the scale
    engine.precision.scaler.update(True)
    assert engine.loss_scale != 16
    engine.precision.load_state_dict(state)
    assert engine.loss_scale == 16
