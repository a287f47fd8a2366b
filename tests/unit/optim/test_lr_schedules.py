"""runtime.optim.lr_schedules against hand-computed values of DeepSpeed's formulas.

Iterations follow DeepSpeed: the lr after construction is the value at iteration -1, after the
k-th step() it is the value at iteration k-1.
"""

import pytest
import torch
from torch.optim.lr_scheduler import LRScheduler

from runtime.config import ConfigError, load_config
from runtime.optim.lr_schedules import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
)


def sgd(lr=0.1, groups=1):
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return torch.optim.SGD(params, lr=lr)


def adam(lr=0.1):
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=lr, betas=(0.9, 0.999))


def lrs_at(scheduler, iterations):
    """The optimizer's lr after stepping to each iteration in turn (ascending)."""
    out = {}
    for iteration in iterations:
        while scheduler.last_batch_iteration < iteration:
            scheduler.step()
        out[iteration] = scheduler.optimizer.param_groups[0]["lr"]
        assert scheduler.get_last_lr()[0] == out[iteration]
    return out


def approx(values):
    return {k: pytest.approx(v, rel=1e-10, abs=1e-15) for k, v in values.items()}


def test_warmup_lr_log():
    opt = sgd()
    scheduler = WarmupLR(opt, warmup_min_lr=0.01, warmup_max_lr=0.11, warmup_num_steps=10)
    assert isinstance(scheduler, LRScheduler)
    assert opt.param_groups[0]["lr"] == 0.01  # iteration -1
    # gamma = log(it + 1) / log(10): log10(2) = 0.30102999566, log10(5) = 0.69897000434
    assert lrs_at(scheduler, [0, 1, 4, 9, 10, 500]) == approx(
        {0: 0.01, 1: 0.0401029995664, 4: 0.0798970004336, 9: 0.11, 10: 0.11, 500: 0.11}
    )


def test_warmup_lr_linear_and_default_max_is_the_optimizer_lr():
    opt = sgd(lr=0.5)
    scheduler = WarmupLR(opt, warmup_num_steps=4, warmup_type="linear")
    assert opt.param_groups[0]["lr"] == 0.0
    assert lrs_at(scheduler, [0, 1, 2, 3, 4, 9]) == approx(
        {0: 0.0, 1: 0.125, 2: 0.25, 3: 0.375, 4: 0.5, 9: 0.5}
    )


def test_warmup_lr_per_group_values():
    opt = sgd(lr=1.0, groups=2)
    WarmupLR(
        opt,
        warmup_min_lr=[0.1, 0.2],
        warmup_max_lr=[1.1, 2.2],
        warmup_num_steps=2,
        warmup_type="linear",
    ).step()  # iteration 0
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.2]
    with pytest.raises(
        ConfigError, match=r"scheduler.params.warmup_min_lr has 3 values but the optimizer has 2"
    ):
        WarmupLR(opt, warmup_min_lr=[0.1, 0.2, 0.3])


def test_warmup_decay_lr():
    scheduler = WarmupDecayLR(
        sgd(lr=1.0), total_num_steps=20, warmup_num_steps=10, warmup_type="linear"
    )
    # warmup: it / 10; decay: (20 - it) / (20 - 10), floored at 0
    assert lrs_at(scheduler, [0, 5, 9, 10, 15, 19, 20, 25]) == approx(
        {0: 0.0, 5: 0.5, 9: 0.9, 10: 1.0, 15: 0.5, 19: 0.1, 20: 0.0, 25: 0.0}
    )


def test_warmup_cosine_lr():
    opt = sgd(lr=2.0)
    scheduler = WarmupCosineLR(
        opt,
        total_num_steps=12,
        warmup_num_steps=2,
        warmup_min_ratio=0.2,
        cos_min_ratio=0.1,
        warmup_type="linear",
    )
    assert opt.param_groups[0]["lr"] == 0.0  # ratio 0 before the first step, as DeepSpeed
    # warmup ratio 0.2 + (it/2) * 0.8; then 0.1 + 0.9 * (1 + cos(pi * (it - 1) / 10)) / 2
    # cos(0.1 pi) = 0.95105651630
    assert lrs_at(scheduler, [0, 1, 2, 6, 11, 30]) == approx(
        {0: 0.4, 1: 1.2, 2: 2 * 0.977975432335, 6: 1.1, 11: 0.2, 30: 0.2}
    )


def test_one_cycle_lr_and_momentum():
    opt = adam()
    scheduler = OneCycle(
        opt,
        cycle_min_lr=0.1,
        cycle_max_lr=1.0,
        cycle_first_step_size=4,
        decay_step_size=2,
        decay_lr_rate=0.5,
        cycle_min_mom=0.8,
        cycle_max_mom=0.9,
        decay_mom_rate=0.1,
    )
    assert opt.param_groups[0]["lr"] == 0.1
    assert opt.param_groups[0]["betas"] == (0.8, 0.999)  # beta2 kept
    expected = {  # iteration: (lr, beta1)
        0: (0.325, 0.875),  # x = 1/8, scale 1/4
        3: (1.0, 0.8),  # top of the cycle
        5: (0.55, 0.85),  # falling half, scale 1/2
        7: (0.1, 0.9),  # end of the cycle
        8: (0.08, 0.945),  # decay: interval 0.5 -> 0.1 / 1.25, 0.9 * 1.05
        11: (0.05, 1.08),  # interval 2 -> 0.1 / 2, 0.9 * 1.2
    }
    for iteration, (lr, beta1) in expected.items():
        lrs_at(scheduler, [iteration])
        group = opt.param_groups[0]
        assert group["lr"] == pytest.approx(lr, rel=1e-12), iteration
        assert group["betas"][0] == pytest.approx(beta1, rel=1e-12), iteration
        assert group["betas"][1] == 0.999


def test_one_cycle_stairs_and_no_momentum_without_betas():
    opt = sgd()
    scheduler = OneCycle(
        opt, cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=4, cycle_first_stair_count=2
    )
    assert not scheduler.cycle_momentum and "betas" not in opt.param_groups[0]
    assert lrs_at(scheduler, [0, 1, 2, 3, 4, 6, 7]) == approx(
        {0: 0.1, 1: 0.55, 2: 0.55, 3: 1.0, 4: 0.55, 6: 0.1, 7: 0.1}
    )


def test_lr_range_test():
    continuous = LRRangeTest(sgd(), lr_range_test_min_lr=0.01, lr_range_test_step_size=2)
    assert lrs_at(continuous, [-1, 0, 3]) == approx({-1: 0.01, 0: 0.015, 3: 0.03})
    stairs = LRRangeTest(
        sgd(), lr_range_test_min_lr=0.01, lr_range_test_step_size=2, lr_range_test_staircase=True
    )
    assert lrs_at(stairs, [0, 1, 2]) == approx({0: 0.01, 1: 0.02, 2: 0.02})


def test_build_from_config_uses_optimizer_lr_and_defaults():
    config = load_config({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}}})
    opt = sgd(lr=0.3)
    scheduler = build_scheduler(config.scheduler, opt)
    assert isinstance(scheduler, WarmupLR)
    assert scheduler.max_lrs == [0.3] and scheduler.min_lrs == [0.0]
    assert scheduler.warmup_type == "log" and scheduler.warmup_num_steps == 100
    assert lrs_at(scheduler, [99]) == approx({99: 0.3})
    cosine = load_config(
        {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50}}}
    )
    built = build_scheduler(cosine.scheduler, sgd())
    assert (built.warmup_num_steps, built.cos_min_ratio, built.warmup_min_ratio) == (
        1000,
        0.0001,
        0.0,
    )


def test_wrapper_optimizer_is_unwrapped():
    class Wrapper:
        def __init__(self, optimizer):
            self.optimizer = optimizer

    opt = sgd()
    scheduler = WarmupLR(Wrapper(opt), warmup_num_steps=2, warmup_type="linear")
    assert scheduler.optimizer is opt
    with pytest.raises(TypeError):
        WarmupLR(object())


def test_explicit_iteration_and_state_dict_round_trip():
    def make():
        opt = sgd(lr=1.0)
        return opt, WarmupDecayLR(opt, total_num_steps=30, warmup_num_steps=5)

    _, a = make()
    for _ in range(7):
        a.step()
    assert a.last_batch_iteration == 6
    _, b = make()
    b.load_state_dict(a.state_dict())
    _, c = make()
    c.load_state_dict({"last_batch_iteration": 6})  # DeepSpeed's checkpoint form
    for _ in range(10):
        a.step()
        b.step()
        c.step()
        assert a.get_last_lr() == b.get_last_lr() == c.get_last_lr()
    opt, d = make()
    d.step(16)  # DeepSpeed's step(last_batch_iteration)
    assert opt.param_groups[0]["lr"] == a.get_last_lr()[0]


def test_resume_from_last_batch_iteration_param():
    opt = sgd(lr=1.0)
    WarmupLR(opt, warmup_num_steps=10, warmup_type="linear", last_batch_iteration=4)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.4)  # iteration 4: 4 / 10
