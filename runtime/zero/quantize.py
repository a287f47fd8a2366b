"""Blockwise symmetric integer quantization of flat tensors, packed into bytes for the wire.

ZeRO++ sends parameters (qwZ) and gradients (qgZ) as integers. Each row of the input (one
rank's shard, or the chunk destined for one rank) is cut into blocks of ``block`` elements;
a block keeps one fp32 scale, ``max |x| / qmax``, and its values as ``round(x / scale)`` in
``[-qmax, qmax]`` (qmax = 127 for 8 bits, 7 for 4 bits: symmetric, no zero point, so zero
stays exactly zero). Dequantizing gives ``q * scale``: the error of an element is at most
half a step, ``max |block| / (2 qmax)``.

A packed row is bytes: first the block scales (fp32), then the ``numel`` values (one byte
each at 8 bits, two per byte at 4 bits; the last block may be short), the row padded to a multiple of 4 bytes so that every row of
a packed buffer starts fp32-aligned. The arithmetic runs in fp32 whatever the input dtype.

Non-finite values are not hidden: a block holding an inf or a nan gets a non-finite scale
and dequantizes to non-finite values, so fp16 overflow checks still see them.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["BlockQuantizer"]


@dataclasses.dataclass(frozen=True)
class BlockQuantizer:
    bits: int
    """8 or 4."""
    block: int
    """Elements per scale (even)."""

    def __post_init__(self) -> None:
        if self.bits not in (8, 4):
            raise ValueError(f"bits must be 8 or 4, got {self.bits}")
        if self.block < 2 or self.block % 2:
            raise ValueError(f"block must be an even number >= 2, got {self.block}")

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def blocks(self, numel: int) -> int:
        return -(-numel // self.block)

    def _value_bytes(self, numel: int) -> int:
        return numel if self.bits == 8 else (numel + 1) // 2

    def packed_nbytes(self, numel: int) -> int:
        """Bytes of one packed row of ``numel`` elements (a multiple of 4)."""
        n = 4 * self.blocks(numel) + self._value_bytes(numel)
        return -(-n // 4) * 4

    def _blocks_fp32(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` as fp32 ``[R, blocks, block]``, zero-padded; no copy when it already is."""
        r, numel = rows.shape
        nb = self.blocks(numel)
        if numel == nb * self.block and rows.dtype == torch.float32 and rows.is_contiguous():
            return rows.view(r, nb, self.block)
        x = torch.empty(r, nb * self.block, dtype=torch.float32, device=rows.device)
        x[:, :numel].copy_(rows)
        x[:, numel:].zero_()
        return x.view(r, nb, self.block)

    def quantize(self, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Pack ``rows`` (``[R, numel]`` or 1-D, any float dtype) into uint8 ``[R, packed]``."""
        rows = rows.reshape(1, -1) if rows.dim() == 1 else rows
        r, numel = rows.shape
        nb = self.blocks(numel)
        packed = self.packed_nbytes(numel)
        if out is None:
            out = torch.empty(r, packed, dtype=torch.uint8, device=rows.device)
        out = out.view(r, packed)
        x = self._blocks_fp32(rows)
        scale = x.abs().amax(dim=2, keepdim=True).div_(self.qmax)
        # Multiplying by the reciprocal is much cheaper than dividing. An all-zero block has
        # scale 0 and reciprocal 0 (it stays zeros); a block with inf or nan gets a
        # non-finite scale, which makes it non-finite again when dequantized.
        inverse = torch.where(scale > 0, scale.reciprocal(), torch.zeros_like(scale))
        q = (x * inverse).round_().clamp_(-self.qmax, self.qmax).view(r, -1)
        out[:, : 4 * nb].copy_(scale.view(r, nb).view(torch.uint8))
        nvalues = self._value_bytes(numel)
        values = out[:, 4 * nb : 4 * nb + nvalues]
        if self.bits == 8:
            values.view(torch.int8).copy_(q[:, :numel])
        else:
            nibbles = (q[:, : 2 * nvalues] + 8).to(torch.uint8).view(r, -1, 2)  # 1..15
            values.copy_(nibbles[:, :, 0] | (nibbles[:, :, 1] << 4))
        out[:, 4 * nb + nvalues :].zero_()
        return out

    def dequantize(self, packed: torch.Tensor, numel: int) -> torch.Tensor:
        """fp32 ``[R, numel]`` from packed uint8 rows (``[R, packed]`` or 1-D of R rows)."""
        nbytes = self.packed_nbytes(numel)
        packed = packed.reshape(-1, nbytes)
        r = packed.shape[0]
        nb = self.blocks(numel)
        scale = packed[:, : 4 * nb].contiguous().view(torch.float32).view(r, nb, 1)
        nvalues = self._value_bytes(numel)
        values = packed[:, 4 * nb : 4 * nb + nvalues]
        x = torch.empty(r, nb * self.block, dtype=torch.float32, device=packed.device)
        if self.bits == 8:
            x[:, :numel].copy_(values.view(torch.int8))
            x[:, numel:].zero_()
        else:
            x[:, : 2 * nvalues : 2].copy_(values & 0xF)
            x[:, 1 : 2 * nvalues : 2].copy_(values >> 4)
            x[:, : 2 * nvalues].sub_(8)
            x[:, 2 * nvalues :].zero_()
        x = x.view(r, nb, self.block).mul_(scale)
        return x.view(r, -1)[:, :numel]

    def max_error(self, rows: torch.Tensor) -> torch.Tensor:
        """Per element, the bound ``max |block| / (2 qmax)`` of its block (fp32, shape of rows)."""
        rows = rows.reshape(1, -1) if rows.dim() == 1 else rows
        r, numel = rows.shape
        nb = self.blocks(numel)
        x = torch.zeros(r, nb * self.block, dtype=torch.float32, device=rows.device)
        x[:, :numel].copy_(rows)
        bound = x.view(r, nb, self.block).abs().amax(dim=2, keepdim=True) / (2 * self.qmax)
        return bound.expand(r, nb, self.block).reshape(r, -1)[:, :numel]
