"""The blockwise quantizer of ZeRO++ (`runtime.zero.quantize`): round trips within half a
step of each block, the packed sizes the wire carries, exact zeros, non-finite values kept
visible, and the int4 packing."""

from __future__ import annotations

import pytest
import torch

from runtime.zero.quantize import BlockQuantizer
from runtime.zero.stage3.fetch import GRAD_QUANTIZER, WEIGHT_QUANTIZER

# fp32 rounding of q * scale may exceed the half-step bound by a few ulps.
ULPS = 1 + 1e-5


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("numel", [1, 15, 64, 999, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_within_half_a_step_of_each_block(bits, numel, dtype):
    q = BlockQuantizer(bits, 64)
    x = (torch.randn(3, numel, generator=torch.Generator().manual_seed(numel)) * 3).to(dtype)
    packed = q.quantize(x)
    assert packed.dtype == torch.uint8 and packed.shape == (3, q.packed_nbytes(numel))
    y = q.dequantize(packed, numel)
    err = (y - x.float()).abs()
    assert (err <= q.max_error(x) * ULPS).all()
    # Not a copy: a random tensor does lose precision, and the block's largest value is exact.
    assert err.max() > 0 or numel == 1  # one value per block is its maximum: exact
    first = x[0, : min(64, numel)].float()
    top = first.abs().argmax()
    assert y[0, top] == pytest.approx(first[top].item(), rel=1e-6)


def test_one_block_by_hand():
    q = BlockQuantizer(8, 4)
    x = torch.tensor([1.0, -0.5, 0.25, 0.0, 10.0, 0.0])
    y = q.dequantize(q.quantize(x), 6)[0]
    step = 1.0 / 127  # block [1, -0.5, 0.25, 0]: scale 1/127
    assert y[:4].tolist() == pytest.approx([1.0, -64 * step, 32 * step, 0.0], abs=1e-7)
    assert y[4:].tolist() == [10.0, 0.0]  # block [10, 0]: the maximum and zero are exact


def test_packed_sizes_are_what_the_wire_carries():
    # 8 bits: 4 bytes of scale per block + 1 byte per value, rounded up to 4 bytes.
    assert BlockQuantizer(8, 2048).packed_nbytes(4096) == 2 * 4 + 4096
    assert BlockQuantizer(8, 2048).packed_nbytes(10) == 4 + 12
    # 4 bits: two values per byte.
    assert BlockQuantizer(4, 512).packed_nbytes(1024) == 2 * 4 + 512
    assert BlockQuantizer(4, 512).packed_nbytes(3) == 4 + 4
    # The formats ZeRO++ uses: about a quarter of fp32 bytes, half of bf16's.
    for q in (WEIGHT_QUANTIZER, GRAD_QUANTIZER):
        assert q.bits == 8
        assert 0.25 < q.packed_nbytes(1 << 20) / (4 << 20) < 0.26


def test_rows_are_quantized_independently():
    q = BlockQuantizer(8, 64)
    a = torch.randn(100)
    rows = torch.stack([a, a * 1000])
    packed = q.quantize(rows)
    assert torch.equal(packed[0], q.quantize(a)[0])  # the big row does not change the small one
    torch.testing.assert_close(q.dequantize(packed, 100)[1] / 1000, q.dequantize(packed, 100)[0])


def test_zeros_stay_zero_and_nonfinite_values_stay_visible():
    q = BlockQuantizer(8, 4)
    assert torch.equal(q.dequantize(q.quantize(torch.zeros(10)), 10), torch.zeros(1, 10))
    x = torch.tensor([1.0, float("inf"), 2.0, 3.0, 1.0, 2.0, float("nan"), 0.0, 5.0])
    y = q.dequantize(q.quantize(x), 9)[0]
    assert not torch.isfinite(y[:8]).any()  # the blocks holding inf and nan
    assert y[8] == 5.0  # the clean block is untouched


def test_quantized_into_a_given_buffer_and_read_back_as_one_flat_buffer():
    q = BlockQuantizer(4, 16)
    x = torch.randn(4, 40)
    out = torch.full((4 * q.packed_nbytes(40),), 255, dtype=torch.uint8)
    q.quantize(x, out=out)
    torch.testing.assert_close(q.dequantize(out, 40), q.dequantize(q.quantize(x), 40))


@pytest.mark.parametrize("bits, block", [(3, 64), (8, 0), (8, 7)])
def test_bad_formats_are_refused(bits, block):
    with pytest.raises(ValueError):
        BlockQuantizer(bits, block)
