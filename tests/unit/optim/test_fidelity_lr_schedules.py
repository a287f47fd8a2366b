"""LR schedules DeepSpeed accepts are accepted here with the same values, and what DeepSpeed
refuses is refused: OneCycle per-group momenta and `cycle_second_step_size: 0`, LRRangeTest
per-group minimum lr, negative step sizes.

Each case runs through the config reader and the classes; where DeepSpeed is installed its
own classes run beside ours on identical optimizers and every step's lr (and beta1) must agree.
"""

from __future__ import annotations

import os

import pytest
import torch

from runtime.config import ConfigError, load_config
from runtime.optim.lr_schedules import LRRangeTest, OneCycle, build_scheduler


def _deepspeed_schedules():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime import lr_schedules
    except ImportError:
        return None
    return lr_schedules


def deepspeed_or_skip():
    schedules = _deepspeed_schedules()
    if schedules is None:
        pytest.skip("deepspeed is not installed (pip install '.[bench]' to compare with it)")
    return schedules


def adam_groups(n=2, lr=0.1):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(n)]
    return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999))


def scheduler_from_config(kind: str, params: dict, optimizer):
    config = load_config({"train_batch_size": 1, "scheduler": {"type": kind, "params": params}})
    return build_scheduler(config.scheduler, optimizer)


def trace(scheduler, optimizer, steps: int) -> list[tuple]:
    """Per step: each group's lr and beta1 (DeepSpeed overwrites beta2; only beta1 cycles)."""
    out = []
    for _ in range(steps):
        scheduler.step()
        out.append(tuple((float(g["lr"]), float(g["betas"][0])) for g in optimizer.param_groups))
    return out


def flat(nested) -> list[float]:
    if isinstance(nested, (list, tuple)):
        return [x for item in nested for x in flat(item)]
    return [float(nested)]


ONE_CYCLE_CASES = [
    {
        "cycle_min_lr": [0.01, 0.02],
        "cycle_max_lr": [0.1, 0.2],
        "cycle_first_step_size": 5,
        "cycle_min_mom": [0.8, 0.85],
        "cycle_max_mom": [0.9, 0.95],
        "decay_step_size": 2,
        "decay_lr_rate": 0.1,
        "decay_mom_rate": 0.05,
    },
    {
        "cycle_min_lr": 0.01,
        "cycle_max_lr": 0.1,
        "cycle_first_step_size": 4,
        "cycle_second_step_size": 0,
        "cycle_first_stair_count": 2,
    },
    {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 3},
]


@pytest.mark.parametrize("params", ONE_CYCLE_CASES)
def test_one_cycle_cases_deepspeed_accepts_are_accepted(params):
    ours_opt = adam_groups()
    ours = scheduler_from_config("OneCycle", params, ours_opt)
    values = trace(ours, ours_opt, 30)
    assert all(lr > 0 and mom > 0 for step in values for lr, mom in step)
    if isinstance(params.get("cycle_min_mom"), list):
        # each group cycles between its own momenta
        assert values[0][0][1] != values[0][1][1]
    if params.get("cycle_second_step_size") == 0:
        # the lr only rises during the cycle, then holds at the minimum (no decay)
        lrs = [step[0][0] for step in values]
        assert lrs[:3] == sorted(lrs[:3]) and lrs[10] == pytest.approx(0.01)


@pytest.mark.parametrize("params", ONE_CYCLE_CASES)
def test_one_cycle_matches_deepspeed_step_by_step(params):
    schedules = deepspeed_or_skip()
    ours_opt, their_opt = adam_groups(), adam_groups()
    ours = scheduler_from_config("OneCycle", params, ours_opt)
    theirs = schedules.OneCycle(their_opt, **params)
    ours_trace, their_trace = trace(ours, ours_opt, 40), trace(theirs, their_opt, 40)
    assert flat(ours_trace) == pytest.approx(flat(their_trace), rel=1e-12, abs=1e-15)


def test_lr_range_test_keeps_a_min_lr_per_group():
    params = {"lr_range_test_min_lr": [0.001, 0.01], "lr_range_test_step_size": 3}
    ours_opt = adam_groups()
    ours = scheduler_from_config("LRRangeTest", params, ours_opt)
    ours_lrs = [[float(g["lr"]) for g in ours_opt.param_groups]]
    for _ in range(10):
        ours.step()
        ours_lrs.append([float(g["lr"]) for g in ours_opt.param_groups])
    assert ours_lrs[0] == [0.001, 0.01] and ours_lrs[-1][1] == pytest.approx(10 * ours_lrs[-1][0])


def test_lr_range_test_per_group_min_lr_is_deepspeeds():
    schedules = deepspeed_or_skip()
    params = {"lr_range_test_min_lr": [0.001, 0.01], "lr_range_test_step_size": 3}
    ours_opt = adam_groups()
    ours = scheduler_from_config("LRRangeTest", params, ours_opt)
    ours_lrs = [[float(g["lr"]) for g in ours_opt.param_groups]]
    for _ in range(10):
        ours.step()
        ours_lrs.append([float(g["lr"]) for g in ours_opt.param_groups])
    their_opt = adam_groups()
    theirs = schedules.LRRangeTest(their_opt, **params)
    their_lrs = [[float(g["lr"]) for g in their_opt.param_groups]]
    for _ in range(10):
        theirs.step()
        their_lrs.append([float(g["lr"]) for g in their_opt.param_groups])
    assert flat(ours_lrs) == pytest.approx(flat(their_lrs), rel=1e-12, abs=1e-15)


NEGATIVE = [
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": -4}),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 0}),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_second_step_size": -1}),
    ("LRRangeTest", {"lr_range_test_step_size": -2}),
    ("LRRangeTest", {"lr_range_test_step_size": 0}),
]


@pytest.mark.parametrize(("kind", "params"), NEGATIVE)
def test_non_positive_step_sizes_are_refused(kind, params):
    key = next(k for k in params if k.endswith("step_size"))
    with pytest.raises(ConfigError, match=f"scheduler.params.{key} must be >= "):
        load_config({"train_batch_size": 1, "scheduler": {"type": kind, "params": params}})
    cls = {"OneCycle": OneCycle, "LRRangeTest": LRRangeTest}[kind]
    with pytest.raises(ConfigError, match=f"scheduler.params.{key} must be"):
        cls(adam_groups(1), **params)  # the class alone refuses too (lr would go negative)


@pytest.mark.parametrize(("kind", "params"), NEGATIVE)
def test_deepspeed_refuses_non_positive_step_sizes_too(kind, params):
    schedules = deepspeed_or_skip()
    key = next(k for k in params if k.endswith("step_size"))
    with pytest.raises(ValueError, match=key):
        getattr(schedules, kind)(adam_groups(1), **params)


def test_per_group_lists_must_match_the_groups():
    scheduler = {
        "type": "OneCycle",
        "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_min_mom": [0.8, 0.8, 0.8]},
    }
    config = load_config({"train_batch_size": 1, "scheduler": scheduler})
    with pytest.raises(ConfigError, match="cycle_min_mom has 3 values but the optimizer has 2"):
        build_scheduler(config.scheduler, adam_groups(2))
    with pytest.raises(ConfigError, match=r"cycle_max_mom\[1\] must be a number"):
        load_config(
            {
                "train_batch_size": 1,
                "scheduler": {
                    "type": "OneCycle",
                    "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_max_mom": [1, "x"]},
                },
            }
        )
