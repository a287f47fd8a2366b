"""The engine's parts on their own, in one process: gradient accumulation, the script's
optimizer inputs, step hooks, and the sharding strategies' protocol and state accessors."""

from __future__ import annotations

import pytest
import torch

from runtime.engine.accumulation import Accumulation, AccumulationError
from runtime.optim.client_optimizer import build_lr_scheduler, optimizer_factory, param_groups_of
from tests.unit.engine.test_engine_api import single_process_group  # noqa: F401 - autouse fixture


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
