"""ZeRO stage 3 on gloo ranks: parity with a single-process reference, memory per rank, bytes
per step, zero.Init, GatheredParameters, save_16bit_model and the user's stage-3 example.

Each world size is started once (`mp_utils.run_ranks`) and runs every scenario in turn; the
tests below check the pieces. The reference trains the same model on the concatenated batch of
all ranks and micro-steps, in this process, with torch's AdamW and clip_grad_norm_.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.reference import (
    GAS,
    MICRO,
    STEPS,
)

pytestmark = pytest.mark.multirank

# 128x128 weights without bias, every one a multiple of 4 ranks x 16 alignment.


def batches(world: int, steps: int = STEPS):
    g = torch.Generator().manual_seed(99)
    rows = GAS * world * MICRO
    x = torch.randn(steps, rows, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    # The branch switch: the same for every row of a step, so every rank (and the reference,
    # which sees the whole batch) takes the same path.
    switch = torch.tensor([(1.0, -1.0, 0.0)[(s * 7) % 3] for s in range(steps)])
    x[:, :, 0] = switch[:, None]
    return x, torch.tanh(x @ w)


# --------------------------------------------------------------------------- rank side


# --------------------------------------------------------------------------- test side


def test_branch_model_really_changes_order():
    x, _ = batches(2)
    paths = {float(x[s, 0, 0]) for s in range(STEPS)}
    assert paths == {1.0, -1.0, 0.0}
