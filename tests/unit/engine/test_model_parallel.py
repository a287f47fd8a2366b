"""ZeRO inside a model-parallel layout: 4 gloo ranks = 2 model-parallel x 2 data-parallel.

The model is a small tensor-parallel transformer written below (Megatron's column- and
row-parallel linears over the model-parallel group); its blocks run through
runtime.activation_checkpointing with ``partition_activations``. One spawn trains it at ZeRO stages 0, 1
and 2 (`runtime.initialize(mpu=...)`), saves a checkpoint halfway, reloads it into a fresh
engine, measures what partitioned checkpoints hold, and asks for stage 3 (refused). The
reference trains the full model in this process on the concatenated batch with torch's AdamW
and clip_grad_norm_; parameters, losses and gradient norms must agree within 1e-5.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multirank

MP, DP = 2, 2
STEPS, SAVE_AT, GAS, MICRO, LR, CLIP = 4, 2, 2, 2, 1e-2, 0.5

# --------------------------------------------------------------------------- the model
# A small tensor-parallel transformer (Megatron's layout). TPTransformer(size=1) is the full
# model (the reference); shard(full, rank, size, group) builds model-parallel rank `rank`'s
# part: query/key/value and the first MLP layer are column-parallel, the attention output and
# the second MLP layer row-parallel (partial products summed over the group, bias added once
# after the sum), layer norms and the input/output layers replicated. Sharded parameters carry
# Megatron's `tensor_model_parallel = True`.
HIDDEN, HEADS, FEATURES, OUT, SEQ = 16, 4, 6, 3, 8


# --------------------------------------------------------------------------- rank side


# --------------------------------------------------------------------------- test side


def test_layout_arithmetic():
    from runtime.parallel_groups import layout

    assert layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert layout(8, 4) == ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]])
    with pytest.raises(ValueError, match="must divide"):
        layout(6, 4)


def test_mpu_without_megatrons_calls_is_refused():
    from runtime.parallel_groups import check_mpu

    class Half:
        def get_model_parallel_group(self):
            return None

    with pytest.raises(TypeError, match="get_data_parallel_group"):
        check_mpu(Half(), 4)

    class Sized:
        def __getattr__(self, name):
            return lambda: 2 if name.endswith("world_size") else 0

    with pytest.raises(ValueError, match="2 x data-parallel size 2 = 4 is not the world size 8"):
        check_mpu(Sized(), 8)
