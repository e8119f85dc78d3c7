"""A contiguous transposed copy of a 2-D tensor of one-, two- or four-byte elements, in square
tiles.

`t.t().contiguous()` copies element by element along the output, so for small elements every
read touches a different 32-byte sector of the input (torch's copy of a transposed bf16 gradient
ran at ~600 GB/s on the H200, docs/kernels-notes.md v22). Here each program loads a
TILE × TILE tile with rows read along their length, transposes it on chip and stores it with
the output's rows written along theirs: both sides move whole sectors. The elements move as
integers of their width, so the bytes are the input's whatever the dtype (NaN payloads too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cast import cdiv

TILE = 64
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, sxr, sxc, TILE: tl.constexpr):
    rows = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    inside = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :] * sxc, mask=inside, other=0)
    y_ptrs = y_ptr + cols[:, None].to(tl.int64) * R + rows[None, :]  # y (C, R) row-major
    tl.store(y_ptrs, tl.trans(x), mask=tl.trans(inside))


def transpose(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() for a 2-D tensor with 1-, 2- or 4-byte elements (any strides)."""
    if x.dim() != 2 or x.element_size() not in _AS_INT or x.is_complex():
        raise ValueError(f"transpose takes a 2-D tensor of one-, two- or four-byte real elements, "
                         f"not {x.dim()}-D {x.dtype}")
    R, C = x.shape
    as_int = _AS_INT[x.element_size()]
    y = torch.empty(C, R, dtype=as_int, device=x.device)
    if x.numel():
        src = x.view(as_int)  # the bits (fp8, bf16, fp32 alike), strides unchanged
        _transpose_kernel[(cdiv(R, TILE), cdiv(C, TILE))](
            src, y, R, C, src.stride(0), src.stride(1), TILE=TILE)
    return y.view(x.dtype)
