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
weight then needs no pass of its own to find it (QuantizedLinear.set_weight_amax).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, s_ptr, amax_ptr, n, lr, w1, b2, w2, eps, wd, bc1, bc2,
                  BLOCK: tl.constexpr, STATE_BF16: tl.constexpr, DECAY: tl.constexpr, SCALED: tl.constexpr,
                  AMAX: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    if SCALED:
        g = g * tl.load(s_ptr)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if w1 < 0.5:  # torch's lerp, both branches as it writes them
        m = m + w1 * (g - m)
    else:
        m = g - (g - m) * (1.0 - w1)
    v = v * b2
    v = v + w2 * g * g
    if STATE_BF16:
        tl.store(m_ptr + offs, m.to(tl.bfloat16), mask=mask)
        tl.store(v_ptr + offs, v.to(tl.bfloat16), mask=mask)
    else:
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
    denom = tl.sqrt_rn(tl.div_rn(v, bc2)) + eps
    u = tl.div_rn(tl.div_rn(m, bc1), denom)
    if DECAY:
        u = u + wd * p
    p = p + (-lr) * u
    tl.store(p_ptr + offs, p, mask=mask)
    if AMAX:  # |p| as bits (sign cleared): ordered as the magnitudes, NaN above +inf
        bits = tl.where(mask, p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0)
        tl.atomic_max(amax_ptr, tl.max(bits, axis=0))


def supported(p: torch.Tensor, state_dtype: torch.dtype) -> bool:
    """A contiguous fp32 parameter with a contiguous fp32 gradient."""
    g = p.grad
    return (p.dtype == torch.float32 and p.is_contiguous() and g is not None and g.is_contiguous()
            and g.dtype == torch.float32 and g.device == p.device
            and state_dtype in (torch.float32, torch.bfloat16))


def adamw_step(p: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
               grad_scale: torch.Tensor | None = None, amax_bits: torch.Tensor | None = None) -> None:
    """One AdamW update of `p` (in place, with its `.grad` times `grad_scale` if given: a 0-d
    fp32 tensor on p's device), the states updated in place; the three tensors' version
    counters move on, as an in-place torch operation would move them.

    amax_bits: a one-element int32 tensor on p's device holding 0 (or a smaller amax's bits),
    into which the kernel puts the bits of the new p's amax: `amax_bits.view(torch.float32)`
    is then max |p| (NaN if p holds NaN; 0 for an empty p)."""
    n = p.numel()
    if n == 0:
        return
    if grad_scale is not None and (grad_scale.numel() != 1 or grad_scale.dtype != torch.float32
                                   or grad_scale.device != p.device):
        raise ValueError(f"grad_scale must be one fp32 value on {p.device}, not {tuple(grad_scale.shape)} "
                         f"{grad_scale.dtype} on {grad_scale.device}")
    if amax_bits is not None and (amax_bits.numel() != 1 or amax_bits.dtype != torch.int32
                                  or amax_bits.device != p.device):
        raise ValueError(f"amax_bits must be one int32 value on {p.device}, not {tuple(amax_bits.shape)} "
                         f"{amax_bits.dtype} on {amax_bits.device}")
    # the scalars as the multi-tensor ops receive them: computed in double, used in fp32
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        p, p.grad, exp_avg, exp_avg_sq, p.grad if grad_scale is None else grad_scale,
        exp_avg if amax_bits is None else amax_bits, n, lr, 1 - beta1,
        beta2, 1 - beta2, eps, weight_decay, 1 - beta1**step, 1 - beta2**step,
        BLOCK=BLOCK, STATE_BF16=exp_avg.dtype == torch.bfloat16, DECAY=weight_decay != 0,
        SCALED=grad_scale is not None, AMAX=amax_bits is not None, enable_fp_fusion=False,
    )
    # the kernel wrote through raw pointers, which autograd's version counters do not see:
    # count the writes, so that whatever keys on a tensor's version (QuantizedLinear's weight
    # cache, autograd's check of saved tensors) sees the new values as new
    for t in (p, exp_avg, exp_avg_sq):
        torch.autograd.graph.increment_version(t)
