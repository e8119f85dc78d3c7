"""A contiguous transposed copy of a 2-D tensor of one-byte codes, in square tiles.

`t.t().contiguous()` copies element by element along the output, so for one-byte elements every
read touches a different 32-byte sector of the input. Here each program loads a TILE × TILE
tile with rows read along their length, transposes it on chip and stores it with the output's
rows written along theirs: both sides move whole sectors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 64


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, sxr, sxc, TILE: tl.constexpr):
    rows = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    inside = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :] * sxc, mask=inside, other=0)
    y_ptrs = y_ptr + cols[:, None].to(tl.int64) * R + rows[None, :]  # y (C, R) row-major
    tl.store(y_ptrs, tl.trans(x), mask=tl.trans(inside))


def transpose(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() for a 2-D tensor with one-byte elements (any strides)."""
    if x.dim() != 2 or x.element_size() != 1:
        raise ValueError(f"transpose takes a 2-D tensor of one-byte elements, not {x.dim()}-D {x.dtype}")
    R, C = x.shape
    y = torch.empty(C, R, dtype=torch.uint8, device=x.device)
    if x.numel():
        src = x.view(torch.uint8)  # the bytes (fp8 dtypes included), strides unchanged
        _transpose_kernel[(triton.cdiv(R, TILE), triton.cdiv(C, TILE))](
            src, y, R, C, src.stride(0), src.stride(1), TILE=TILE)
    return y.view(x.dtype)
