"""AdamW's update of one fp32 parameter in one pass: read p, g, m, v once, write p, m, v once.

The multi-tensor path (train/optim.py) makes about ten passes over every parameter-sized list
and two fp32 temporaries as large as the parameters; this kernel makes one and none. The
arithmetic per element is the optimizer's formula in its order, each operation rounded once
(fp fusion off, IEEE division and square root):

    m ← lerp(m, g, 1 − β1)            torch's lerp: m + w·(g − m) for w < ½, else g − (g − m)·(1 − w)
    v ← v·β2 + (1 − β2)·g·g
    m, v stored (rounded to nearest when the states are bf16; the update uses the fp32 values)
    u ← (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)  (+ wd·p)
    p ← p + (−lr)·u

The parameter and its gradient are fp32; the states fp32 or bf16. With a gradient scale s (a
0-d fp32 tensor on the device: gradient clipping's coefficient), g is first rounded to g·s in
fp32, as clipping's in-place multiplication would make it, without a pass of its own; the
stored gradient is left as it was.

Given a slot for it, the kernel also finds the new parameter's amax, max |p| (NaN if p holds
NaN), as it writes p: each program reduces its block's magnitudes as int32 bit patterns (for
non-negative floats their order as integers is their order as floats, and every NaN pattern
lies above +inf's) and takes the maximum into the slot atomically. A per-tensor quantizer of the
weight then needs no pass of its own to find it (QuantizedLinear.set_weight_amax). Given a
slot per column of a 2-D parameter, a tiled kernel makes the same update and finds each
column's amax the same way, for a copy of the weight with one scale per column (fp8_rowwise's
input-gradient weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cast import cdiv

BLOCK = 2048
# _adamw_columns_kernel's tile: rows, columns, row steps a program, warps; on the H200 it ran
# at 97% of the flat kernel's rate over a Llama-3-8B layer's weights (docs/kernels-notes.md v28)
COLUMNS_TILE = (32, 64, 2, 4)


@triton.jit
def _update(p, g, m, v, s_ptr, lr, w1, b2, w2, eps, wd, bc1, bc2, DECAY: tl.constexpr, SCALED: tl.constexpr):
    """The formula above on loaded fp32 values: (new p, new m, new v)."""
    if SCALED:
        g = g * tl.load(s_ptr)
    if w1 < 0.5:  # torch's lerp, both branches as it writes them
        m = m + w1 * (g - m)
    else:
        m = g - (g - m) * (1.0 - w1)
    v = v * b2
    v = v + w2 * g * g
    denom = tl.sqrt_rn(tl.div_rn(v, bc2)) + eps
    u = tl.div_rn(tl.div_rn(m, bc1), denom)
    if DECAY:
        u = u + wd * p
    return p + (-lr) * u, m, v


@triton.jit
def _step(p_ptr, g_ptr, m_ptr, v_ptr, offs, mask, s_ptr, lr, w1, b2, w2, eps, wd, bc1, bc2,
          STATE_BF16: tl.constexpr, DECAY: tl.constexpr, SCALED: tl.constexpr):
    """Load p, g, m, v at offs, update them, store p, m, v; returns the new p's magnitudes as
    bits (sign cleared: ordered as the magnitudes, NaN above +inf), 0 where masked off."""
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p, m, v = _update(p, g, m, v, s_ptr, lr, w1, b2, w2, eps, wd, bc1, bc2, DECAY, SCALED)
    if STATE_BF16:
        tl.store(m_ptr + offs, m.to(tl.bfloat16), mask=mask)
        tl.store(v_ptr + offs, v.to(tl.bfloat16), mask=mask)
    else:
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
    tl.store(p_ptr + offs, p, mask=mask)
    return tl.where(mask, p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0)


@triton.jit
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, s_ptr, amax_ptr, n, lr, w1, b2, w2, eps, wd, bc1, bc2,
                  BLOCK: tl.constexpr, STATE_BF16: tl.constexpr, DECAY: tl.constexpr, SCALED: tl.constexpr,
                  AMAX: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = _step(p_ptr, g_ptr, m_ptr, v_ptr, offs, offs < n, s_ptr, lr, w1, b2, w2, eps, wd, bc1, bc2,
                 STATE_BF16, DECAY, SCALED)
    if AMAX:
        tl.atomic_max(amax_ptr, tl.max(bits, axis=0))


@triton.jit
def _adamw_columns_kernel(p_ptr, g_ptr, m_ptr, v_ptr, s_ptr, amax_ptr, col_ptr, R, C, lr, w1, b2, w2, eps, wd,
                          bc1, bc2, TILE_R: tl.constexpr, TILE_C: tl.constexpr, STEPS: tl.constexpr,
                          STATE_BF16: tl.constexpr, DECAY: tl.constexpr, SCALED: tl.constexpr,
                          AMAX: tl.constexpr):
    """The update of an (R, C) parameter by tiles, TILE_C columns by STEPS × TILE_R rows a
    program, keeping each column's largest magnitude (as bits) as it writes p: one atomic
    maximum a column into col_ptr, and, with AMAX, the program's into amax_ptr."""
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    col_ok = cols < C
    top = tl.program_id(0).to(tl.int64) * (STEPS * TILE_R)
    best = tl.zeros((TILE_C,), dtype=tl.int32)
    for step in range(STEPS):
        rows = top + step * TILE_R + tl.arange(0, TILE_R)
        bits = _step(p_ptr, g_ptr, m_ptr, v_ptr, rows[:, None] * C + cols[None, :],
                     (rows < R)[:, None] & col_ok[None, :], s_ptr, lr, w1, b2, w2, eps, wd, bc1, bc2,
                     STATE_BF16, DECAY, SCALED)
        best = tl.maximum(best, tl.max(bits, axis=0))
    tl.atomic_max(col_ptr + cols, best, mask=col_ok)
    if AMAX:
        tl.atomic_max(amax_ptr, tl.max(best, axis=0))


def supported(p: torch.Tensor, state_dtype: torch.dtype) -> bool:
    """A contiguous fp32 parameter with a contiguous fp32 gradient."""
    g = p.grad
    return (p.dtype == torch.float32 and p.is_contiguous() and g is not None and g.is_contiguous()
            and g.dtype == torch.float32 and g.device == p.device
            and state_dtype in (torch.float32, torch.bfloat16))


def _check_bits(name: str, bits: torch.Tensor | None, n: int, p: torch.Tensor) -> None:
    if bits is not None and (bits.numel() != n or bits.dtype != torch.int32 or bits.device != p.device
                             or not bits.is_contiguous()):
        raise ValueError(f"{name} must be {n} contiguous int32 value{'s' if n != 1 else ''} on {p.device}, "
                         f"not {tuple(bits.shape)} {bits.dtype} on {bits.device}")


def adamw_step(p: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
               grad_scale: torch.Tensor | None = None, amax_bits: torch.Tensor | None = None,
               column_bits: torch.Tensor | None = None, tile: tuple[int, int, int, int] | None = None) -> None:
    """One AdamW update of `p` (in place, with its `.grad` times `grad_scale` if given: a 0-d
    fp32 tensor on p's device), the states updated in place; the three tensors' version
    counters move on, as an in-place torch operation would move them.

    amax_bits: a one-element int32 tensor on p's device holding 0 (or a smaller amax's bits),
    into which the kernel puts the bits of the new p's amax: `amax_bits.view(torch.float32)`
    is then max |p| (NaN if p holds NaN; 0 for an empty p).

    column_bits: for a 2-D p of C columns, C int32 values on p's device holding 0 (or smaller
    amaxes' bits), into which the kernel puts each column's amax the same way
    (`column_bits.view(torch.float32)` is max |p| over dim 0): the amaxes of a quantized copy
    of p with one scale per column (fp8_rowwise's input-gradient weight). The update then runs
    by (rows × columns) tiles (`tile`: rows, columns, row steps a program, warps; default
    COLUMNS_TILE); its values are the same bits either way."""
    n = p.numel()
    if n == 0:
        return
    if grad_scale is not None and (grad_scale.numel() != 1 or grad_scale.dtype != torch.float32
                                   or grad_scale.device != p.device):
        raise ValueError(f"grad_scale must be one fp32 value on {p.device}, not {tuple(grad_scale.shape)} "
                         f"{grad_scale.dtype} on {grad_scale.device}")
    _check_bits("amax_bits", amax_bits, 1, p)
    if column_bits is not None:
        if p.dim() != 2:
            raise ValueError(f"column_bits are for a 2-D parameter, not one of shape {tuple(p.shape)}")
        _check_bits("column_bits", column_bits, p.shape[1], p)
    # the scalars as the multi-tensor ops receive them: computed in double, used in fp32
    scalars = (lr, 1 - beta1, beta2, 1 - beta2, eps, weight_decay, 1 - beta1**step, 1 - beta2**step)
    flags = dict(STATE_BF16=exp_avg.dtype == torch.bfloat16, DECAY=weight_decay != 0, SCALED=grad_scale is not None,
                 AMAX=amax_bits is not None, enable_fp_fusion=False)
    s = p.grad if grad_scale is None else grad_scale
    if column_bits is None:
        _adamw_kernel[(cdiv(n, BLOCK),)](
            p, p.grad, exp_avg, exp_avg_sq, s, exp_avg if amax_bits is None else amax_bits, n, *scalars,
            BLOCK=BLOCK, **flags)
    else:
        tr, tc, steps, warps = tile or COLUMNS_TILE
        (R, C) = p.shape
        _adamw_columns_kernel[(cdiv(R, tr * steps), cdiv(C, tc))](
            p, p.grad, exp_avg, exp_avg_sq, s, column_bits if amax_bits is None else amax_bits, column_bits,
            R, C, *scalars, TILE_R=tr, TILE_C=tc, STEPS=steps, num_warps=warps, **flags)
    # the kernel wrote through raw pointers, which autograd's version counters do not see:
    # count the writes, so that whatever keys on a tensor's version (QuantizedLinear's weight
    # cache, autograd's check of saved tensors) sees the new values as new
    for t in (p, exp_avg, exp_avg_sq):
        torch.autograd.graph.increment_version(t)
