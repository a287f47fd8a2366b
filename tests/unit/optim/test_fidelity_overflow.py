"""Steps with non-finite gradients are skipped, counted and reported at every precision and
stage (issue: bf16 and fp32 used to apply them and turn every weight into nan).

The rule (runtime/optim/precision.py): skip everywhere; `bf16.check_grad_overflow: false` applies
them at bf16 stages 1-2 only, where DeepSpeed reads the key. Held against DeepSpeed itself
where it is installed: the same steps are skipped except fp32 stage 0, where DeepSpeed applies
the step (a documented difference).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("precision", "stage", "check", "skips"),
    [
        ("fp16", 0, True, True),
        ("fp16", 2, True, True),
        ("fp32", 0, True, True),
        ("fp32", 2, True, True),
        ("bf16", 0, False, True),  # DeepSpeed reads check_grad_overflow at stages 1-2 only
        ("bf16", 1, False, False),
        ("bf16", 2, False, False),
        ("bf16", 2, True, True),
        ("bf16", 3, False, True),
    ],
)
def test_the_skip_rule_per_precision_and_stage(precision, stage, check, skips):
    from runtime.config import load_config
    from runtime.optim.precision import Precision

    source = {"train_batch_size": 1, "zero_optimization": {"stage": stage}}
    if precision != "fp32":
        source[precision] = {"enabled": True}
    if precision == "bf16":
        source["bf16"]["check_grad_overflow"] = check
    assert Precision.from_config(load_config(source)).skips_on_overflow is skips


# --- DeepSpeed side by side --------------------------------------------------------------------
