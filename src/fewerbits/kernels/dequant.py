"""Dequantization as one Triton kernel: codes and block scales in, a float matrix out.

    codes (R, C) uint8, fp4 two per byte (low nibble first) ─┐
    block scales (R/br, C/bc): uint8 codes or fp32 ───────────┼─► value(code) × scale [× s_dec]
    element / scale code tables (float32) ────────────────────┘   in fp32, then to fp32 or bf16 (RNE)

Bit for bit `QuantizedTensor.dequantize_matrix`: the same table values, the same fp32 products
in the same order, one rounding to the output dtype. The emulated GEMMs read their operands
through here on a GPU, instead of a dozen torch passes (unpack, lookup, repeat the scales,
multiply, convert) per operand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..codes import code_table
from ..quantize import QuantizedTensor, _block_shape
from .cast import _to_bf16, cdiv

_OUT = (torch.float32, torch.bfloat16)


@triton.jit
def _dequant_kernel(code_ptr, scale_ptr, elem_table, scale_table, ts_ptr, out_ptr, R, C, scr, ssr, sor,
                    BR: tl.constexpr, BC: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr,
                    PACKED: tl.constexpr, SCALE_CODES: tl.constexpr, TENSOR_SCALE: tl.constexpr,
                    OUT_BF16: tl.constexpr):
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    inside = (rows < R)[:, None] & (cols < C)[None, :]
    if PACKED:  # two codes per byte: byte j holds columns 2j (low nibble) and 2j + 1 (high)
        half = tl.program_id(1) * (TILE_C // 2) + tl.arange(0, TILE_C // 2)
        byte_mask = (rows < R)[:, None] & (half * 2 < C)[None, :]
        b = tl.load(code_ptr + rows[:, None] * scr + half[None, :], mask=byte_mask, other=0).to(tl.int32)
        codes = tl.reshape(tl.join(b & 0xF, b >> 4), (TILE_R, TILE_C))
    else:
        codes = tl.load(code_ptr + rows[:, None] * scr + cols[None, :], mask=inside, other=0).to(tl.int32)
    values = tl.load(elem_table + codes)
    s_row = rows // BR if BR > 0 else rows * 0  # BR = 0: one block spans every row
    s_col = cols // BC if BC > 0 else cols * 0
    s_idx = s_row[:, None] * ssr + s_col[None, :]
    if SCALE_CODES:
        s_code = tl.load(scale_ptr + s_idx, mask=inside, other=0).to(tl.int32)
        scale = tl.load(scale_table + s_code)
    else:
        scale = tl.load(scale_ptr + s_idx, mask=inside, other=1.0)
    values = values * scale
    if TENSOR_SCALE:
        values = values * tl.load(ts_ptr)
    if OUT_BF16:
        out = _to_bf16(values)
    else:
        out = values
    tl.store(out_ptr + rows[:, None] * sor + cols[None, :], out, mask=inside)


def supported(q: QuantizedTensor, dtype: torch.dtype) -> bool:
    """Codes stored one per byte (8-bit) or two per byte (4-bit), any block shape; fp32 or
    bf16 out."""
    return q.scheme.elem.bits in (4, 8) and dtype in _OUT


def dequantize_matrix(q: QuantizedTensor, dtype: torch.dtype = torch.float32, *, tensor_scale: bool = True,
                      tile_r: int = 32, tile_c: int = 128) -> torch.Tensor:
    """`q.dequantize_matrix(dtype, tensor_scale=...)`, in one kernel."""
    rows, cols = q.matrix_shape
    br, bc = _block_shape(q.scheme, rows, cols)
    nbr, nbc = q.scale.shape
    br, bc = (0 if nbr == 1 else br), (0 if nbc == 1 else bc)  # whole extents: no recompiles per shape
    out = torch.empty(rows, cols, dtype=dtype, device=q.data.device)
    if out.numel() == 0:
        return out
    scale_codes = q.scale.dtype == torch.uint8
    elem_table = code_table(q.scheme.elem, q.data.device)
    scale_table = code_table(q.scheme.scale_fmt, q.data.device) if scale_codes else elem_table
    use_ts = tensor_scale and q.tensor_scale is not None
    data, scale = q.data.contiguous(), q.scale.contiguous()
    grid = (cdiv(rows, tile_r), cdiv(cols, tile_c))
    _dequant_kernel[grid](
        data, scale, elem_table, scale_table, q.tensor_scale if use_ts else scale, out,
        rows, cols, data.stride(0), scale.stride(0), out.stride(0),
        BR=br, BC=bc, TILE_R=tile_r, TILE_C=tile_c, PACKED=q.scheme.elem.bits == 4,
        SCALE_CODES=scale_codes, TENSOR_SCALE=use_ts, OUT_BF16=dtype == torch.bfloat16,
    )
    return out
