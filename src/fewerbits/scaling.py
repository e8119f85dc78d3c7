"""Scales: how the amax of a block becomes its decode scale (dequantized = data × scale).

fp32, rule "amax" (per tensor, row, 1x128, 128x128):

    scale = amax / max_elem            one fp32 division; elements are cast(x / scale)
    clamped below at fp32's smallest normal, so an all-zero block gets the smallest scale

Power-of-two rules (E8M0 for OCP MX; also allowed for fp32 scales), emax_elem the exponent of
the element format's largest binade (8 e4m3, 15 e5m2, 4 e3m2, 2 e2m3, 2 e2m1):

    floor   2^(floor(log2 amax) − emax_elem)        OCP MX v1.0. The block max lands in the top
                                                    binade; values above max_elem saturate
    ceil    2^(ceil(log2 amax) − emax_elem)
    even    as floor, after rounding amax to the element's mantissa width (half to even)
    rceil   2^ceil(log2(amax / max_elem))           cuBLAS / Transformer Engine / the MXFP8
                                                    pre-training recipe: nothing saturates.
                                                    Computed as TE does: v = amax × fp32(1/max_elem)
                                                    in fp32, then the exponent of v rounded up

The exponent is clamped to the scale format's range ([−127, 127] for E8M0, [−126, 127] for
fp32); amax = 0 therefore gives the smallest scale and the block stays zero. Elements are
cast(x / scale), exact because the scale is a power of two.

Two-level E4M3 + fp32 (NVFP4; arXiv 2509.25149, bit-compatible with Transformer Engine's
reference quantizer), for element max m_e (6) and scale max m_s (448), all in fp32:

    s_enc   = min(m_s · m_e / amax_tensor, FLT_MAX);  1.0 if amax_tensor is 0, inf or NaN
    s_dec   = 1 / s_enc                               the stored per-tensor decode scale
    scale_b = e4m3(clamp(amax_b × (s_enc × fp32(1/m_e)), ±448))   round half to even
    enc_b   = min(1 / (scale_b × s_dec), FLT_MAX)     elements are cast(x × enc_b)
    dequantized = (data × scale_b) × s_dec

Under every rule, a block whose amax is NaN or ±inf gets a NaN scale, so the whole block
dequantizes to NaN: the failure stays visible instead of being clipped to a finite value.
"""

from __future__ import annotations

import torch

from .formats import FORMATS, FloatFormat
from .rounding import device_constant, exp2, exponent_of, round_to_format

FP32 = FORMATS["fp32"]
FLT_MAX = torch.finfo(torch.float32).max


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return device_constant(("f32", float(value)), lambda: torch.tensor(value, dtype=torch.float32), like.device)


def _one_over(x: torch.Tensor) -> torch.Tensor:
    """1 / x correctly rounded, for fp32 x, compiled or not. Written `1.0 / x`, torch takes a
    reciprocal, which inductor emits on a GPU as an approximate division (the division-rounding
    option compile_model sets covers divisions, not reciprocals): compiled NVFP4 then scaled
    some elements by an enc one ulp off eager mode's, and 42 of 65,536 codes of one bf16 matrix
    came out different on the H200. A division by x is correctly rounded in both."""
    return _f32(1.0, x) / x


def _reciprocal_f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """fp32(1 / value), the division done in fp32 as a kernel would."""
    return _one_over(_f32(value, like))


_NAN_BITS = 0x7FC00000  # the fp32 NaN torch writes for torch.nan


def nan_where_not_finite(scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """scale (fp32) where amax is finite, else NaN (the bits 0x7FC00000 every way).

    In a graph torch.compile traces, the NaN is made from scale's own bits (zeroed, then the
    NaN's bits set) instead of written as a constant. A NaN constant is unequal to itself, so
    the graph's common-subexpression pass took two Linears' casts of one tensor (q, k and v's
    input; gate and up's) for different casts, and the graph made, saved and transposed that
    tensor's codes once for each Linear (docs/kernels-notes.md, v31)."""
    if torch.compiler.is_compiling():
        nan = ((scale.view(torch.int32) & 0) | _NAN_BITS).view(torch.float32)
        return torch.where(torch.isfinite(amax), scale, nan)
    return torch.where(torch.isfinite(amax), scale, torch.nan)


def amax_scale(amax: torch.Tensor, elem: FloatFormat) -> torch.Tensor:
    """fp32 decode scale amax / max_elem (rule "amax"), float32."""
    if torch.compiler.is_compiling():
        quotient = divide_by_constant(amax.float(), elem.max)
    else:
        quotient = amax.float() / _f32(elem.max, amax)
    return nan_where_not_finite(quotient.clamp(min=FP32.min_normal), amax)


def divide_by_constant(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor correctly rounded to fp32 for fp32 x, where a compiler may rewrite the
    division as a product with the reciprocal: inductor does so on a GPU (torch 2.11), and
    amax × fp32(1/448) differs from amax / 448 in the last bit for some amaxes.

    The quotient is taken in fp64 and rounded once to fp32. Divided, it is correctly rounded
    (53 ≥ 2·24 + 2 bits: the double rounding is innocuous). Multiplied by fp64(1/d) instead,
    its relative error is under 2^-52, while for d = m·2^k with m odd, a/d is never an fp32
    rounding midpoint and lies at least 2^-26/m (relative) away from one; so for every element
    maximum (6, 7.5, 28, 448, 57344: m = 3, 15, 7, 7, 7) the fp32 result is the correctly
    rounded quotient either way (tests/test_quantize.py checks it over every binade;
    `exact_reciprocal` gives the argument for any fp32 divisor)."""
    return (x.double() / divisor).float()


def exact_reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """fp64 1 / scale, for compiled graphs' element pass: x · (1 / scale) in fp64, rounded once
    to fp32, is x / scale correctly rounded, for fp32 x and any fp32 scale (divide_by_constant's
    rewritten form is the case of a constant scale).

    Why the same fp32 number: let q = x / s exactly, with fp32 ulp 2^c. fp64's reciprocal and
    product err by under 2^-52 · q together. For q in fp32's normal range, a rounding midpoint
    m = (2M + 1) · 2^(c-1) (2^23 ≤ M < 2^24) is never q — x = m · s would need the odd factor
    2M + 1 > 2^24 in a 24-bit significand — and x − m · s is a nonzero multiple of 2^(e_s + c − 1)
    (e_s: the exponent of the last bit of s), so |q − m| > 2^(c − 25) > 2^-49 · q: the fp64
    product never crosses a midpoint, and rounds as q does. For a power-of-two scale the product
    is exact in fp64 (the reciprocal of the scale 2^127, 2^-127, is normal there, as it is not
    in fp32). A quotient below fp32's normal range may round differently by one unit of 2^-149,
    which every element format takes to the same code (zero), so the codes are the reference's
    bit for bit; tests/test_quantize.py checks values next to every kind of midpoint."""
    return 1.0 / scale.double()


def pow2_exponent(amax: torch.Tensor, elem: FloatFormat, rule: str) -> torch.Tensor:
    """Unclamped exponent k (int64) of the power-of-two scale 2^k for each amax (float32)."""
    positive = amax > 0
    a = torch.where(positive, amax.float(), 1.0)  # keep log2 finite; zeros are fixed below
    if rule == "rceil":
        v = (a * _reciprocal_f32(elem.max, amax)).double()  # the product is rounded in fp32
        e = exponent_of(v)
        k = e + (v > exp2(e)).to(e.dtype)
    else:
        a = a.double()
        if rule == "even":
            a = round_to_format(a, _unbounded(elem))
        e = exponent_of(a)
        if rule == "ceil":
            e = e + (a > exp2(e)).to(e.dtype)
        elif rule not in ("floor", "even"):
            raise ValueError(f"not a power-of-two rule: {rule!r}")
        k = e - elem.emax
    return torch.where(positive, k, torch.iinfo(torch.int32).min)


def _unbounded(elem: FloatFormat) -> FloatFormat:
    """A format with elem's mantissa width and an exponent range wide enough for any fp32."""
    return FloatFormat(f"{elem.name}_unbounded", 11, elem.man_bits, 1023, "ieee")


def pow2_scale(
    amax: torch.Tensor, elem: FloatFormat, rule: str, scale_fmt: FloatFormat
) -> torch.Tensor:
    """Power-of-two decode scales (float32: 2^-127 … 2^127 are all exact), exponent clamped to
    `scale_fmt`'s range."""
    k = pow2_exponent(amax, elem, rule).clamp(scale_fmt.emin, scale_fmt.emax)
    return nan_where_not_finite(exp2(k, torch.float32), amax)


def two_level_tensor_scales(
    tensor_amax: torch.Tensor, elem: FloatFormat, scale_fmt: FloatFormat
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4's per-tensor level: (s_enc, s_dec, the block multiplier s_enc · fp32(1/m_e))."""
    tensor_amax = tensor_amax.float()
    s_enc = torch.clamp(_f32(scale_fmt.max * elem.max, tensor_amax) / tensor_amax, max=FLT_MAX)
    degenerate = (tensor_amax == 0) | ~torch.isfinite(s_enc) | (s_enc == 0)
    s_enc = torch.where(degenerate, _f32(1.0, s_enc), s_enc)
    return s_enc, _one_over(s_enc), s_enc * _reciprocal_f32(elem.max, s_enc)


def two_level_scales(
    block_amax: torch.Tensor, tensor_amax: torch.Tensor, elem: FloatFormat, scale_fmt: FloatFormat
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 scales: (block scales on the E4M3 grid, per-tensor s_dec, per-block enc), float32."""
    _, s_dec, multiplier = two_level_tensor_scales(tensor_amax, elem, scale_fmt)
    raw = torch.clamp(block_amax.float() * multiplier, max=FLT_MAX)
    raw = raw.clamp(-scale_fmt.max, scale_fmt.max)
    block = round_to_format(raw, scale_fmt)  # exact in fp32 for E4M3
    block = nan_where_not_finite(block, block_amax)
    enc = torch.clamp(_one_over(block * s_dec), max=FLT_MAX)
    return block, s_dec, enc


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """amax over the (rows, cols) of each block of a (nbr, br, nbc, bc) view; NaN propagates."""
    if blocks.numel() == 0:
        return blocks.new_zeros(blocks.shape[0], blocks.shape[2])
    return blocks.abs().amax(dim=(1, 3))

