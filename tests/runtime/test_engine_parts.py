"""The engine's parts on their own, in one process: gradient accumulation, the script's
optimizer inputs, step hooks, and the sharding strategies' protocol and state accessors."""

from __future__ import annotations

import types

import pytest
import torch

import runtime
from runtime.accumulation import Accumulation, AccumulationError
from runtime.client_optimizer import build_lr_scheduler, optimizer_factory, param_groups_of
from runtime.zero.flat_strategy import FlatStrategy
from runtime.zero.stage3.build import Stage3Strategy
from runtime.zero.strategy import TrainedParam
from tests.runtime.test_engine_api import single_process_group  # noqa: F401 - autouse fixture


# --------------------------------------------------------------------------- accumulation
def test_accumulation_counts_micro_steps_to_the_boundary():
    acc = Accumulation(lambda: 3)
    assert [acc.is_boundary(m) for m in range(6)] == [False, False, True] * 2
    assert acc.begin_backward(0) is False
    acc.begin_step()
    assert acc.begin_backward(2) is True


def test_accumulation_refuses_a_second_backward_after_the_boundary_backward():
    acc = Accumulation(lambda: 1)
    assert acc.begin_backward(0) is True
    with pytest.raises(AccumulationError, match="without engine.step"):
        acc.begin_backward(0)


def test_accumulation_refuses_more_backwards_than_steps_without_step():
    acc = Accumulation(lambda: 2)
    acc.begin_backward(0)
    acc.begin_backward(0)  # two counted backwards: the limit, not yet an error
    with pytest.raises(AccumulationError, match="3 times"):
        acc.begin_backward(0)


def test_accumulation_boundary_override_and_no_sync():
    acc = Accumulation(lambda: 4)
    acc.set_boundary(True)
    assert acc.is_boundary(0) is True
    with pytest.raises(TypeError):
        acc.set_boundary(1)
    acc.set_boundary(False)
    with acc.no_sync(zero_stage=1):
        assert acc.begin_backward(0) is False  # inside no_sync nothing reduces
        with pytest.raises(AccumulationError, match="inside engine.no_sync"):
            acc.begin_step()
        with pytest.raises(AccumulationError, match="nested"):
            with acc.no_sync(zero_stage=1):
                pass
    with pytest.raises(AccumulationError, match="stage 2"):
        with acc.no_sync(zero_stage=2):
            pass


def test_accumulation_steps_are_read_at_each_call():
    steps = [2]
    acc = Accumulation(lambda: steps[0])
    assert acc.is_boundary(1) is True
    steps[0] = 4  # set_train_batch_size changed gradient_accumulation_steps
    assert acc.is_boundary(1) is False


# --------------------------------------------------------------------------- client optimizer
def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))


def test_param_groups_keep_trainable_parameters_once_per_group():
    net = _net()
    net[0].bias.requires_grad_(False)
    groups = param_groups_of(
        net,
        None,
        [{"params": [net[0].weight, net[0].bias], "lr": 0.1}, {"params": [net[0].weight]}],
    )
    assert groups == [({"lr": 0.1}, [net[0].weight]), ({}, [])]
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups_of(net, None, [net[0].bias])


def test_optimizer_factory_reuses_a_client_optimizer_over_the_new_params():
    net = _net()
    client = torch.optim.SGD(net.parameters(), lr=0.5)
    master = [torch.zeros(3, requires_grad=True)]
    made = optimizer_factory(client, None)([{"params": master}])
    assert made is client and made.param_groups[0]["params"] == master
    with pytest.raises(ValueError, match="no optimizer"):
        optimizer_factory(None, None)([{"params": master}])


def test_lr_scheduler_from_an_object_or_a_factory():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert build_lr_scheduler(sched, None, opt) is sched
    made = build_lr_scheduler(lambda o: torch.optim.lr_scheduler.StepLR(o, 2), None, opt)
    assert made.optimizer is opt
    assert build_lr_scheduler(None, None, opt) is None


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
