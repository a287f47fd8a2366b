"""runtime.zero.estimator and `zlaunch estimate`: docs/memory-model.md's formulas, buffers, no torch needed."""

import json
import struct

import pytest

from runtime.config import load_config
from runtime.zero.estimator import (
    GB,
    MAX_BUCKET,
    BufferSizes,
    buffer_bytes,
    count_safetensors_parameters,
    estimate_all,
    model_state_bytes,
)

PSI = 1_000_000  # parameters


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_mixed_precision_formulas(n):
    for precision in ("fp16", "bf16"):
        assert model_state_bytes(PSI, n, 0, precision) == (16 * PSI, 0)
        assert model_state_bytes(PSI, n, 1, precision)[0] == pytest.approx(4 * PSI + 12 * PSI / n)
        assert model_state_bytes(PSI, n, 2, precision)[0] == pytest.approx(2 * PSI + 14 * PSI / n)
        assert model_state_bytes(PSI, n, 3, precision)[0] == pytest.approx(16 * PSI / n)


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_fp32_formulas(n):
    assert model_state_bytes(PSI, n, 0, "fp32") == (16 * PSI, 0)
    assert model_state_bytes(PSI, n, 1, "fp32")[0] == pytest.approx(8 * PSI + 8 * PSI / n)
    assert model_state_bytes(PSI, n, 2, "fp32")[0] == pytest.approx(4 * PSI + 12 * PSI / n)
    assert model_state_bytes(PSI, n, 3, "fp32")[0] == pytest.approx(16 * PSI / n)


def test_offload_moves_optimizer_state_to_cpu():
    n = 4
    # Optimizer offload: GPU keeps the stage's params and grads; CPU holds 16 bytes/param / N.
    assert model_state_bytes(PSI, n, 1, "fp16", "optimizer") == pytest.approx((4 * PSI, 4 * PSI))
    assert model_state_bytes(PSI, n, 2, "fp16", "optimizer") == pytest.approx(
        (2 * PSI + 2 * PSI / n, 4 * PSI)
    )
    assert model_state_bytes(PSI, n, 3, "fp16", "optimizer") == pytest.approx((PSI, 4 * PSI))
    # Parameter offload: nothing stays on the GPU; the 16-bit shard joins the CPU side.
    assert model_state_bytes(PSI, n, 3, "bf16", "optimizer+param") == pytest.approx(
        (0, 18 * PSI / n)
    )
    assert model_state_bytes(PSI, n, 3, "fp32", "optimizer+param") == pytest.approx(
        (0, 16 * PSI / n)
    )
    with pytest.raises(ValueError, match="needs stage 1, 2 or 3"):
        model_state_bytes(PSI, n, 0, "fp16", "optimizer")
    with pytest.raises(ValueError, match="needs stage 3"):
        model_state_bytes(PSI, n, 2, "fp16", "optimizer+param")


def test_buffers_are_bounded_buckets():
    big = 10**10
    cap = MAX_BUCKET
    assert cap == 4 * 2**20
    # stage 0: one reduce bucket of 16-bit grads (no overlap by default below stage 3), at most
    # the runtime's cap whatever the config says
    assert buffer_bytes(big, 0, "fp16") == cap * 2
    # stage 1-2 add an all-gather bucket of the same size
    assert buffer_bytes(big, 2, "fp16") == cap * 2 + cap * 2
    assert buffer_bytes(big, 2, "fp32") == cap * 4 + cap * 4
    # stage 3: the configured reduce bucket, doubled (overlap), and the prefetch bucket
    assert buffer_bytes(big, 3, "fp16") == 5e8 * 2 * 2 + 5e7 * 2
    # a bucket is never larger than the model
    assert buffer_bytes(1000, 2, "fp16") == 1000 * 2 + 1000 * 2
    assert buffer_bytes(1000, 3, "fp16") == 1000 * 2 * 2 + 1000 * 2
    # the smaller of the two configured sizes is used for both at stages 1-2
    sizes = BufferSizes(reduce_bucket_size=100, allgather_bucket_size=50, overlap_comm=True)
    assert buffer_bytes(big, 1, "fp16", sizes) == 50 * 2 * 2 + 50 * 2
    assert buffer_bytes(big, 0, "fp16", sizes) == 100 * 2 * 2


def test_buffer_sizes_from_config_resolve_auto():
    config = load_config(
        {
            "zero_optimization": {
                "stage": 3,
                "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto",
                "allgather_bucket_size": 2e8,
            }
        }
    )
    sizes = BufferSizes.from_config(config, hidden_size=1000)
    assert sizes == BufferSizes(10**6, 2 * 10**8, 900_000, None)
    defaults = BufferSizes.from_config(config)
    assert (defaults.reduce_bucket_size, defaults.stage3_prefetch_bucket_size) == (5e8, 5e7)
    given = load_config({"zero_optimization": {"stage": 2, "overlap_comm": True}})
    assert BufferSizes.from_config(given).overlap_comm is True


def test_estimate_rows_and_cpu_per_node():
    rows = estimate_all(1.5e9, nodes=2, gpus_per_node=8, precision="fp16", buffers=False)
    combos = [(r.stage, r.offload) for r in rows]
    assert combos == [
        (0, "none"),
        (1, "none"),
        (1, "optimizer"),
        (2, "none"),
        (2, "optimizer"),
        (3, "none"),
        (3, "optimizer"),
        (3, "optimizer+param"),
    ]
    by = {(r.stage, r.offload): r for r in rows}
    assert by[0, "none"].gpu_model_states == 24 * GB
    assert by[2, "none"].gpu_model_states == pytest.approx(1.5e9 * (2 + 14 / 16))
    # 8 ranks per node, each 16 bytes/param / 16 ranks on the CPU
    assert by[2, "optimizer"].cpu_per_node == pytest.approx(1.5e9 * 16 / 16 * 8)
    assert all(r.gpu_buffers == 0 for r in rows)


def test_safetensors_header_count(tmp_path):
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]},
        "b": {"dtype": "F32", "shape": [5], "data_offsets": [24, 44]},
    }
    raw = json.dumps(header).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(44))
    assert count_safetensors_parameters(path) == 17
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"12345678garbage")
    with pytest.raises(ValueError, match="not a safetensors file"):
        count_safetensors_parameters(bad)


# --- the command ------------------------------------------------------------------------------
