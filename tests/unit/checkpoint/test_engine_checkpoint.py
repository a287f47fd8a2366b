"""Engine checkpoints across world sizes and stages, consolidation, and loads that must fail.

Real gloo ranks in fresh processes (tests/integration/engine/mp_utils.py). The reference run trains 4
ranks at stage 2 and saves at step 4; other world sizes and stages load that checkpoint and
continue. The global batch of each step is the same at every world size, so continuations
must match the reference within float reduction-order noise.
"""

from __future__ import annotations

import math

from runtime.checkpoint import CheckpointError

SAVE_AT, TOTAL = 4, 8
RTOL = 1e-6


def test_checkpoint_error_is_importable_without_torch_state():
    assert issubclass(CheckpointError, RuntimeError)
    assert math.isfinite(RTOL)
