"""The element pass of quantization as one Triton kernel: scale, round, encode, pack.

    X (R, C), any strides ─┐                        one program = one TILE_R × TILE_C tile
    factor (R/br, C/bc) ───┼─► v = x / scale  (or x × enc, two-level)      correctly rounded
    noise (R, C) int32 ────┘   code = round_to_codes(v)   nearest-even, or noise < fraction
                               fp4: two codes per byte, low nibble first ─► out (R, C or C/2)

    ┌──────── TILE_C ────────┐
    │ b0 │ b1 │ b2 │ b3 │ … │  blocks of bc columns (and br rows) share one factor, looked up
    └────┴────┴────┴────┴───┘  by (row // br, col // bc): any block shape, any layout of X

Bit for bit the reference (`quantize.element_codes`, `rounding.round_to_codes`): the same fp32
arithmetic in the same order — the binade from the exponent field, the units as |v| · 2^(M−e)
(exact), round half to even from floor and the exact fraction, the code as
(e + bias − 1) · 2^M + units, saturated — and the stochastic noise is the reference's own
int32 draw, passed in (kernels/rowblock.py computes it from the reference's seed instead,
`_seed_noise`). Scales and amaxes are computed by the reference code before the kernel.
`_round_values` (the values kernel's elements, no codes) rounds to nearest another way to the
same values: one fp32 addition of a power of two whose spacing is the quantum. FP8 codes
rounded to nearest on a GPU that converts fp32 to FP8 itself (NVIDIA from sm_89) come from that
conversion, which saturates (`_native_fp8_codes`, four elements in a few PTX instructions), and
the values kernel's FP8 values from it and the conversion back (`_native_fp8_values`): the same
bits (tests/test_kernels.py checks both against the reference on the GPU).
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ..formats import FloatFormat
from ..rounding import NATIVE_FP8


@triton.jit
def _round_units(v, noise, M: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, STOCHASTIC: tl.constexpr):
    """(neg, nan, finite, e, r) of a tile of scaled values: the sign bit, NaN, finite, the binade
    e (clamped to [EMIN, EMAX + 1]) and |v| · 2^(M − e) rounded to an integer r ≤ 2^(M + 1)
    (half to even, or up where the noise is below the fraction); non-finite v round as 0."""
    neg = v.to(tl.int32, bitcast=True) < 0
    nan = v != v
    mag = tl.abs(v)
    finite = mag < float("inf")
    mag = tl.where(finite, mag, 0.0)
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, EMIN), EMAX + 1)
    units = mag * ((M - e + 127) << 23).to(tl.float32, bitcast=True)  # |v| · 2^(M − e): exact
    units = tl.minimum(units, 2.0 ** (M + 2))  # beyond this everything saturates anyway
    low = tl.floor(units)
    frac = units - low
    if STOCHASTIC:
        up = noise.to(tl.float32) * (1.0 / 16777216.0) < frac
    else:
        up = (frac > 0.5) | ((frac == 0.5) & ((low.to(tl.int32) & 1) == 1))
    r = tl.minimum(low + up.to(tl.float32), 2.0 ** (M + 1))
    return neg, nan, finite, e, r


@triton.jit
def _round_codes(v, noise, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr,
                 EMAX: tl.constexpr, MAX_CODE: tl.constexpr, BITS: tl.constexpr, HAS_NAN: tl.constexpr,
                 NAN_CODE: tl.constexpr, IS_INT: tl.constexpr, STOCHASTIC: tl.constexpr,
                 NATIVE_MAX: tl.constexpr = 0.0):
    """The element codes of a tile of scaled values (as int32: sign bit, exponent field,
    mantissa; two's complement for integers). FP8 rounded to nearest on a GPU that converts to
    it (NATIVE_MAX, the format's max, from `format_constants`) takes the GPU's conversion
    (`_native_fp8_codes`); another floating-point format with subnormals, rounded to nearest,
    takes the values path's one addition (`_nearest_sum`) and the code from the sum's fp32
    bits (`_nearest_codes`)."""
    if NATIVE_MAX > 0 and not STOCHASTIC:
        return _native_fp8_codes(v, E, HAS_NAN, NAN_CODE)
    if not STOCHASTIC and not IS_INT and EMIN == 1 - BIAS:
        return _nearest_codes(v, E, M, BIAS, EMIN, MAX_CODE, HAS_NAN, NAN_CODE)
    neg, nan, finite, e, r = _round_units(v, noise, M, EMIN, EMAX, STOCHASTIC)
    code = (e + (BIAS - 1)) * (1 << M) + r.to(tl.int32)
    code = tl.where(finite, code, MAX_CODE)
    code = tl.minimum(tl.maximum(code, 0), MAX_CODE)
    if IS_INT:
        code = tl.where(neg, -code, code) & ((1 << BITS) - 1)
    else:
        code = code | (neg.to(tl.int32) << (E + M))
    if HAS_NAN:
        code = tl.where(nan, NAN_CODE | (neg.to(tl.int32) << (E + M)), code)
    return code


@triton.jit
def _nearest_sum(v, M: tl.constexpr, EMIN: tl.constexpr, MAX_BITS: tl.constexpr):
    """(s, c) that round a tile of scaled values to nearest (half to even), saturated, on the grid
    of a floating-point format with M mantissa bits, subnormals below 2^EMIN and the largest
    finite value whose fp32 bits are MAX_BITS:

    - a = min(|v|, max), as the integer minimum of the bits (±inf, and NaN, whose bits lie
      past inf's, give max on every backend, where a float minimum's NaN is not portable);
    - c = 2^(e − M + 23), as int32 bits, e the binade of a clamped below at EMIN: c's ulp is the
      quantum 2^(e − M), and a < 2^(e + 1), at most 2^(M + 1) quanta against c's 2^23, keeps
      a + c in c's binade, so s = fp32(a + c) is c plus a rounded to a multiple of the quantum,
      half to even (c is an even number of quanta);
    - s − c is the rounded magnitude, exactly, and s's bits minus c's its count of quanta.

    (a comes from v's bits, so no fused multiply-add can take in the product that made v.)
    Against the binade clamped on both sides and c subtracted before the code is read (the form
    before), six SASS instructions an element fewer in the one-read kernel's FP4 and FP6 codes
    and one in its values, compiled for sm_90 (docs/kernels-notes.md, v59)."""
    a = tl.minimum(v.to(tl.int32, bitcast=True) & 0x7FFFFFFF, MAX_BITS)
    c = tl.maximum(a & 0x7F800000, (EMIN + 127) << 23) + ((23 - M) << 23)
    return a.to(tl.float32, bitcast=True) + c.to(tl.float32, bitcast=True), c


@triton.jit
def _nearest_magnitude(v, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr):
    """(code, mag): |v| rounded to nearest (half to even) and saturated on the grid of a
    floating-point format with subnormals whose largest finite code is MAX_CODE, by one fp32
    addition (`_nearest_sum`): its code without the sign bit, and its value.

    In the binade e (clamped below at EMIN) the sum's bits less c's are the rounded magnitude in
    quanta 2^(e − M), k, and the code of k quanta of binade e is (e + BIAS − 1) · 2^M + k —
    subnormals (e = EMIN = 1 − BIAS) and normals alike, k = 2^(M + 1) giving the next binade's
    first code — where (e + BIAS − 1) · 2^M is c's bits shifted right by 23 − M less the same
    of the smallest c. The value is s − c, exactly. (±inf and NaN give max's code and value.)"""
    MAX_BITS: tl.constexpr = (((MAX_CODE >> M) - BIAS + 127) << 23) | ((MAX_CODE & ((1 << M) - 1)) << (23 - M))
    C_MIN: tl.constexpr = (EMIN + 127 + 23 - M) << 23
    s, c = _nearest_sum(v, M, EMIN, MAX_BITS)
    code = s.to(tl.int32, bitcast=True) - c + ((c >> (23 - M)) - (C_MIN >> (23 - M)))
    return code, s - c.to(tl.float32, bitcast=True)


@triton.jit
def _nearest_codes(v, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr,
                   MAX_CODE: tl.constexpr, HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr):
    """`_round_codes` rounding to nearest, for a floating-point format with subnormals: the code
    of |v| rounded and saturated by one fp32 addition (`_nearest_magnitude`), then the sign bit,
    and NaN's code where the format has one."""
    bits = v.to(tl.int32, bitcast=True)
    code, _ = _nearest_magnitude(v, M, BIAS, EMIN, MAX_CODE)
    sign = (bits >> (31 - E - M)) & (1 << (E + M))  # v's sign bit where the code's goes
    code = code | sign
    if HAS_NAN:
        code = tl.where(v != v, NAN_CODE | sign, code)
    return code


@triton.jit
def _native_fp8_codes(v, E: tl.constexpr, HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr):
    """`_round_codes` rounding to nearest for FP8 E4M3 (E = 4) or E5M2 by the GPU's conversion
    from fp32 (on sm_89 and later `cvt.rn.satfinite`, two elements an instruction, where
    `_nearest_codes` takes about twenty): round half to even with subnormals, as the reference
    rounds; past ±max (±inf included) the conversion saturates, as the reference does. A NaN
    converts to a NaN code without its sign, so the reference's NaN code, sign kept, is put in
    after. ±0 and values that round to zero keep their sign, as the reference's codes.

    Four elements in one piece of PTX: two conversions, their signs' bytes by `prmt` (mode 8 of
    a selector nibble repeats the chosen byte's top bit), an AND that keeps those top bits, one
    OR: each code takes its element's sign bit, which it has already unless the element is a
    NaN (whose E4M3 code is then the reference's; an E5M2 byte whose low seven bits are 0x7F
    can only be a NaN's and becomes the reference's 0x7E): seven to eight SASS instructions an
    element fewer than an element-by-element form (a clamp, the conversion, a select for NaN,
    the codes taken out of the conversion's pairs and packed again for the store;
    docs/kernels-notes.md, v53 and v57)."""
    # the NaN codes it puts in are the formats' own (formats.py)
    tl.static_assert(HAS_NAN and NAN_CODE == (0x7F if E == 4 else 0x7E))
    if E == 4:
        cvt: tl.constexpr = "cvt.rn.satfinite.e4m3x2.f32"
        fix: tl.constexpr = ""
    else:
        cvt: tl.constexpr = "cvt.rn.satfinite.e5m2x2.f32"
        fix: tl.constexpr = """
        and.b32 t, $0, 0x7f7f7f7f;
        add.u32 t, t, 0x01010101;
        and.b32 t, t, 0x80808080;
        shr.u32 t, t, 7;
        xor.b32 $0, $0, t;"""
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 w, s, t;
        """ + cvt + """ lo, $2, $1;
        """ + cvt + """ hi, $4, $3;
        mov.b32 w, {lo, hi};
        prmt.b32 s, $1, $2, 0xfb;
        prmt.b32 t, $3, $4, 0xfb00;
        prmt.b32 s, s, t, 0x7610;
        and.b32 s, s, 0x80808080;
        or.b32 $0, w, s;""" + fix + """
        }""",
        "=r,r,r,r,r", [v], dtype=tl.uint8, is_pure=True, pack=4).to(tl.int32)


@triton.jit
def _native_fp8_values(v, E: tl.constexpr):
    """`_round_values` rounding to nearest for FP8 E4M3 (E = 4) or E5M2 by the GPU's
    conversions, two elements at a time: to the codes (`cvt.rn.satfinite`, as
    `_native_fp8_codes`), back to fp16 (every FP8 value is an fp16 value, so exactly), then to
    fp32. Past ±max and at ±inf: ±max; ±0 and values that round to zero: a zero of their
    sign; NaN: NaN. In MXFP8's values kernel about nine SASS instructions an element fewer
    than the fp32 addition's way (docs/kernels-notes.md, v53)."""
    if E == 4:
        cvt: tl.constexpr = "cvt.rn.satfinite.e4m3x2.f32"
        back: tl.constexpr = "cvt.rn.f16x2.e4m3x2"
    else:
        cvt: tl.constexpr = "cvt.rn.satfinite.e5m2x2.f32"
        back: tl.constexpr = "cvt.rn.f16x2.e5m2x2"
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 c, lo, hi;
        .reg .b32 h;
        """ + cvt + """ c, $3, $2;
        """ + back + """ h, c;
        mov.b32 {lo, hi}, h;
        cvt.f32.f16 $0, lo;
        cvt.f32.f16 $1, hi;
        }""",
        "=r,=r,r,r", [v], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _bf16x2(a, b, OP: tl.constexpr, EMULATED: tl.constexpr = False):
    """One PTX instruction OP on int32 words a and b read as two 16-bit lanes each (bf16x2 or
    u16x2; sm_90), word by word; EMULATED (Triton's interpreter, which runs no PTX): the same
    lane by lane in fp32 and integer arithmetic."""
    if EMULATED:
        return _bf16x2_emulated(a, b, OP)
    return tl.inline_asm_elementwise(OP + " $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bf16x2_emulated(a, b, OP: tl.constexpr):
    """`_bf16x2` lane by lane: `max.u16x2` on the lanes as integers; the bf16x2 operations on the
    lanes widened to fp32, the result rounded to bf16 (nearest even). That is the instruction's
    one rounding for the operands `_nearest_lanes` gives it: their products and sums are exact
    in fp32, or (a product deep in fp32's subnormals, a sum with a far below c's ulp) round there
    without changing the bf16 result. `min` of a NaN and a number is the number, as PTX's."""
    if OP == "max.u16x2":
        return tl.maximum(a & 0xFFFF, b & 0xFFFF) | (tl.maximum((a >> 16) & 0xFFFF, (b >> 16) & 0xFFFF) << 16)
    lo = _lane_op((a << 16).to(tl.float32, bitcast=True), (b << 16).to(tl.float32, bitcast=True), OP)
    hi = _lane_op((a & -65536).to(tl.float32, bitcast=True), (b & -65536).to(tl.float32, bitcast=True), OP)
    return _to_bf16(lo).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF | \
        (_to_bf16(hi).to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _lane_op(x, y, OP: tl.constexpr):
    """OP of `_bf16x2` on fp32 x and y, unrounded."""
    if OP == "mul.rn.bf16x2":
        return x * y
    elif OP == "add.rn.bf16x2":
        return x + y
    elif OP == "sub.rn.bf16x2":
        return x - y
    else:
        tl.static_assert(OP == "min.bf16x2")
        return tl.where(x != x, y, tl.where(y != y, x, tl.minimum(x, y)))


@triton.jit
def _two_lanes(low, high):
    """fp32 low and high that bf16 holds exactly (their low 16 bits 0), as the two bf16 halves of
    an int32 word, low in the low half."""
    return ((low.to(tl.int32, bitcast=True) >> 16) & 0xFFFF) | (high.to(tl.int32, bitcast=True) & -65536)


@triton.jit
def _in_both_lanes(v):
    """fp32 v that bf16 holds exactly (its low 16 bits 0), as bf16 in both halves of an int32 word."""
    return _two_lanes(v, v)


@triton.jit
def _nearest_lanes(w, f2, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr,
                   MAX_CODE: tl.constexpr, CODES: tl.constexpr, EMULATED: tl.constexpr = False):
    """The elements of bf16 words w (two elements a word, the first in the low half) times
    their block's factor 2^−k (f2: the word of two bf16 2^−k), rounded to nearest (half to even)
    and saturated on the grid of a floating-point format with subnormals, two at a time by the
    GPU's bf16x2 instructions (sm_90): where CODES, the codes as two 16-bit lanes (each the
    code with its sign bit); else the rounded values, still under the factor, as two bf16.

    `_nearest_magnitude`'s one addition in bf16 lanes: x · 2^−k is exact (a bf16 times a power
    of two, unless below bf16's normal range, where the element rounds to a zero of its sign in
    every format here), a = min(|x · 2^−k|, max) (a NaN lane gives max), c = 2^(e − M + 7) with
    e the binade of a clamped below at EMIN, so that c's ulp is the quantum 2^(e − M) and a + c,
    rounded to nearest even by the bf16 addition, stays in c's binade: s − c is a rounded to a
    multiple of the quantum, exactly, and s's bits less c's its count of quanta. No lane
    borrows from or carries into the other: s ≥ c, c's low seven bits are 0 and every code is
    below 2^8. Non-finite elements occur only in blocks whose scale is NaN, which the caller
    replaces. (EMULATED: the bf16x2 instructions emulated, `_bf16x2`.)"""
    MAX16: tl.constexpr = (((MAX_CODE >> M) - BIAS + 127) << 7) | ((MAX_CODE & ((1 << M) - 1)) << (7 - M))
    LANE: tl.constexpr = 65537  # a 16-bit constant times this is the constant in both lanes
    # |x| · 2^−k, |x · 2^−k| as rounding to nearest is symmetric: from the |x| the caller's amax
    # took already, not masked after the product (an ALU instruction a word: v67)
    a = _bf16x2(w & 0x7FFF7FFF, f2, "mul.rn.bf16x2", EMULATED)
    a = _bf16x2(a, tl.full(a.shape, MAX16 * LANE, tl.int32), "min.bf16x2", EMULATED)
    c = _bf16x2(a & 0x7F807F80, tl.full(a.shape, ((EMIN + 127) << 7) * LANE, tl.int32), "max.u16x2", EMULATED)
    c = c + ((7 - M) << 7) * LANE
    s = _bf16x2(a, c, "add.rn.bf16x2", EMULATED)
    if CODES:  # k quanta of binade e: code (e + BIAS − 1) · 2^M + k, as `_nearest_magnitude`
        code = s - c + (c >> (7 - M)) - ((EMIN + 127 + 7 - M) << M) * LANE
        return code | ((w >> (15 - E - M)) & ((1 << (E + M)) * LANE))  # each lane's sign bit
    return _bf16x2(s, c, "sub.rn.bf16x2", EMULATED) | (w & -2147450880)  # the sign bits, 0x80008000


@triton.jit
def _round_values(v, noise, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                  MAX_CODE: tl.constexpr, MAX_VALUE: tl.constexpr, HAS_NAN: tl.constexpr, STOCHASTIC: tl.constexpr,
                  E: tl.constexpr = 0, NATIVE_MAX: tl.constexpr = 0.0):
    """The values `_round_codes`' codes decode to, for a floating-point element format, without
    the codes: ±min(r · 2^(e − M), max) (exact: r is an integer of at most M + 2 bits), ±max
    where v is not finite, NaN for NaN where the format has one — a code past the largest
    finite one is a value past max, which the code's saturation turns into max.

    Rounding to nearest takes a shorter way to the same value: the magnitude saturated, then
    one fp32 addition and subtraction (`_nearest_magnitude`'s value, the codes' own rounding);
    FP8 where the GPU converts to it (NATIVE_MAX, as `_round_codes`), its conversions
    (`_native_fp8_values`)."""
    if NATIVE_MAX > 0 and not STOCHASTIC:
        return _native_fp8_values(v, E)
    bits = v.to(tl.int32, bitcast=True)
    if STOCHASTIC:
        _, _, finite, e, r = _round_units(v, noise, M, EMIN, EMAX, STOCHASTIC)
        mag = tl.minimum(r * ((e - M + 127) << 23).to(tl.float32, bitcast=True), MAX_VALUE)
        mag = tl.where(finite, mag, MAX_VALUE)
    else:
        _, mag = _nearest_magnitude(v, M, BIAS, EMIN, MAX_CODE)  # past max, ±inf and NaN: max
    # the sign put in as a bit: a select between mag and −mag may lose the sign of a zero
    # (on the H200 it did), and −0 is what the reference's codes give
    val = (mag.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)
    if HAS_NAN:
        val = tl.where(v != v, float("nan"), val)
    return val


@triton.jit
def _load_noise(noise_ptr, rows, cols, inside, snr, snc, STOCHASTIC: tl.constexpr):
    """A tile of the int32 stochastic-rounding noise (0 when rounding to nearest)."""
    noise = 0
    if STOCHASTIC:
        noise = tl.load(noise_ptr + rows[:, None] * snr + cols[None, :] * snc, mask=inside, other=0)
    return noise


@triton.jit
def _mix32(x):
    """rounding.mix32 (lowbias32) on uint32: the products wrap modulo 2^32."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _seed_noise(seed_ptr, rows, cols, C):
    """rounding.noise_bits of the seed at *seed_ptr for the elements (rows, cols) of an (R, C)
    matrix (int32 on [0, 2^24)): element i = row · C + col, modulo 2^32 — computed in uint32,
    whose products and sums wrap modulo 2^32 as the index's reduction would (no 64-bit product)."""
    seed = tl.load(seed_ptr).to(tl.uint32)
    i = rows.to(tl.uint32) * tl.cast(C, tl.uint32) + cols.to(tl.uint32)
    return (_mix32(i ^ seed) >> 8).to(tl.int32)


@triton.jit
def _to_bf16(values):
    """fp32 to bf16, nearest even on the bit pattern (the same on a GPU and in the interpreter);
    NaN becomes the positive quiet NaN."""
    b = values.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    b = tl.where(values != values, 0x7FC0, b)
    return b.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _encode_store(v, noise, out_ptr, rows, cols, inside, R, C, CP, sor,
                  TILE_R: tl.constexpr, TILE_C: tl.constexpr, STOCHASTIC: tl.constexpr, PACK: tl.constexpr,
                  E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr,
                  EMAX: tl.constexpr, MAX_CODE: tl.constexpr, BITS: tl.constexpr, HAS_NAN: tl.constexpr,
                  NAN_CODE: tl.constexpr, IS_INT: tl.constexpr, NATIVE_MAX: tl.constexpr = 0.0):
    """Round a tile of scaled values to codes (with this noise where STOCHASTIC) and store them
    (fp4: two a byte; fp6 with PACK 3: sixteen in three 32-bit words). CP is the output's row
    length in its own elements (bytes: (C + 1) // 2 for fp4; words: 3C / 16 for PACK 3), given as
    an argument rather than computed here: Triton then knows it to be a multiple of 16 where it
    is, hence that a thread's neighbouring bytes in a row are kept or masked off together, and
    stores them with one instruction. Computed from C, it knew neither and stored fp4 codes a
    byte at a time, which took MXFP4's codes about twice as long on the H200
    (docs/kernels-notes.md, v50)."""
    code = _round_codes(v, noise, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT, STOCHASTIC,
                        NATIVE_MAX)
    _store_codes(code, out_ptr, rows, cols, inside, R, CP, sor, TILE_R, TILE_C, PACK)


@triton.jit
def _store_codes(code, out_ptr, rows, cols, inside, R, CP, sor, TILE_R: tl.constexpr, TILE_C: tl.constexpr,
                 PACK: tl.constexpr):
    """Store a (TILE_R, TILE_C) tile of codes (int32) at (rows, cols), as `_encode_store` packs them."""
    if PACK == 2:  # two codes a byte, the first in the low nibble; padding columns are code 0
        lo, hi = tl.split(tl.reshape(code, (TILE_R, TILE_C // 2, 2)))
        pairs = tl.program_id(1) * (TILE_C // 2) + tl.arange(0, TILE_C // 2)
        keep = (rows < R)[:, None] & (pairs < CP)[None, :]
        tl.store(out_ptr + rows[:, None] * sor + pairs[None, :], (lo | (hi << 4)).to(tl.uint8), mask=keep)
    elif PACK == 3:  # fp6, C a multiple of 16: sixteen codes in three 32-bit words, the bytes of
        # codes.pack (code j at bits 6j … 6j + 5 of its group's little-endian bit string); out_ptr
        # is the packed codes' int32 view, sor its row stride and CP its row length in words
        tl.static_assert(TILE_C % 32 == 0, "fp6 words are stored two groups of 16 codes at a time")
        G: tl.constexpr = TILE_C // 16
        H: tl.constexpr = G // 2
        c = tl.reshape(code.to(tl.uint32), (TILE_R, G, 2, 2, 2, 2))  # code 8a + 4b + 2c + d at [a, b, c, d]
        l0, l1, l2, l3 = _quarters(c)  # the codes ≡ 0, 1, 2, 3 (mod 4), by a and b
        c0, c4, c8, c12 = _quarters(l0)
        c1, c5, c9, c13 = _quarters(l1)
        c2, c6, c10, c14 = _quarters(l2)
        c3, c7, c11, c15 = _quarters(l3)
        w0 = c0 | (c1 << 6) | (c2 << 12) | (c3 << 18) | (c4 << 24) | (c5 << 30)
        w1 = (c5 >> 2) | (c6 << 4) | (c7 << 10) | (c8 << 16) | (c9 << 22) | (c10 << 28)
        w2 = (c10 >> 4) | (c11 << 2) | (c12 << 8) | (c13 << 14) | (c14 << 20) | (c15 << 26)
        # Two neighbouring groups' six words as the words 6p … 6p + 7 of a (TILE_R, H, 8) tile,
        # the last two masked off, so that a thread stores them eight bytes at a time. Stored a
        # word at a time (a warp's words 12 bytes apart), they took twice as long on the H200
        # (docs/kernels-notes.md, v52).
        e0, o0 = tl.split(tl.reshape(w0, (TILE_R, H, 2)))  # the even group's word, the odd one's
        e1, o1 = tl.split(tl.reshape(w1, (TILE_R, H, 2)))
        e2, o2 = tl.split(tl.reshape(w2, (TILE_R, H, 2)))
        z = tl.zeros_like(e0)
        # word 4i + 2j + k at [i, j, k]: the first join makes i, the last k
        t = tl.join(tl.join(tl.join(e0, o1), tl.join(e2, z)), tl.join(tl.join(e1, o2), tl.join(o0, z)))
        m = tl.arange(0, 8)[None, None, :]
        words = (tl.program_id(1) * H + tl.arange(0, H))[None, :, None] * 6 + m
        keep = (rows < R)[:, None, None] & (words < CP) & (m < 6)
        tl.store(out_ptr + rows[:, None, None] * sor + words, tl.reshape(t, (TILE_R, H, 8)), mask=keep)
    else:
        tl.store(out_ptr + rows[:, None] * sor + cols[None, :], code.to(tl.uint8), mask=inside)


@triton.jit
def _quarters(t):
    """The four tensors t[..., i, j] for (i, j) = (0, 0), (0, 1), (1, 0), (1, 1): t's entries along
    its last two dimensions, both of size 2, in row-major order."""
    a, b = tl.split(t)
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, b0, a1, b1


NATIVE_FP8_CAPABILITY = (8, 9)  # the first NVIDIA compute capability with cvt to FP8 (sm_89)


def native_fp8_on(fmt: FloatFormat, capability: tuple[int, int]) -> bool:
    """Whether kernels compiled for an NVIDIA GPU of this compute capability round to this
    format's codes and values by the GPU's conversions: the FP8 formats whose compiled codes
    come from torch's conversion too (`rounding.NATIVE_FP8`), from NATIVE_FP8_CAPABILITY on
    (Ada, Hopper, Blackwell)."""
    return fmt.name in NATIVE_FP8 and tuple(capability) >= NATIVE_FP8_CAPABILITY


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of an NVIDIA GPU; None for anything else: Triton's interpreter,
    whose conversion is emulated, or ROCm, whose FP8 are other formats of the same names."""
    if device.type != "cuda" or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(device)


def native_fp8(fmt: FloatFormat, device: torch.device | None) -> bool:
    """Whether the kernels round to this format's codes and values by the GPU's conversions
    (`_native_fp8_codes`, `_native_fp8_values`: the reference's bits) on this device
    (`native_fp8_on` its compute capability)."""
    capability = _capability(torch.device(device)) if device is not None else None
    return capability is not None and native_fp8_on(fmt, capability)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for a positive b: a launch grid's size, as triton.cdiv gives it without the host's
    time of its wrapper (a few µs a call, two calls a launch)."""
    return -(-a // b)


@functools.cache
def format_constants(fmt: FloatFormat, device: torch.device | None = None) -> MappingProxyType:
    """The element format as the kernels' compile-time constants; with the device the kernel
    runs on, NATIVE_MAX: the format's max where `native_fp8` holds, else 0. (Made once per
    format and device and shared by every caller, so read-only: callers unpack it.)"""
    return MappingProxyType(dict(
        E=fmt.exp_bits, M=fmt.man_bits, BIAS=fmt.bias, EMIN=fmt.emin, EMAX=fmt.emax, MAX_CODE=fmt.max_code,
        BITS=fmt.bits, HAS_NAN=fmt.has_nan, NAN_CODE=fmt.nan_code or 0, IS_INT=fmt.is_integer,
        NATIVE_MAX=float(fmt.max) if native_fp8(fmt, device) else 0.0))


@triton.jit
def _cast_kernel(x_ptr, f_ptr, noise_ptr, out_ptr, R, C, CP, sxr, sxc, sfr, sfc, snr, snc, sor, br, bc,
                 TILE_R: tl.constexpr, TILE_C: tl.constexpr, MULTIPLY: tl.constexpr,
                 STOCHASTIC: tl.constexpr, PACK: tl.constexpr, E: tl.constexpr, M: tl.constexpr,
                 BIAS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
                 BITS: tl.constexpr, HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr, IS_INT: tl.constexpr,
                 NATIVE_MAX: tl.constexpr):
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    inside = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxc, mask=inside, other=0.0).to(tl.float32)
    f = tl.load(f_ptr + (rows // br)[:, None] * sfr + (cols // bc)[None, :] * sfc, mask=inside, other=1.0)
    if MULTIPLY:
        v = x * f  # two-level: x × enc
    else:
        v = tl.div_rn(x, f)  # x / scale, correctly rounded
    v = tl.where(tl.abs(f) < float("inf"), v, 0.0)  # a NaN scale: the block keeps zero codes
    noise = _load_noise(noise_ptr, rows, cols, inside, snr, snc, STOCHASTIC)
    _encode_store(v, noise, out_ptr, rows, cols, inside, R, C, CP, sor, TILE_R, TILE_C,
                  STOCHASTIC, PACK, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT, NATIVE_MAX)


def cast_codes(X: torch.Tensor, factor: torch.Tensor, br: int, bc: int, fmt: FloatFormat, *,
               multiply: bool, noise: torch.Tensor | None, pack: bool,
               tile_r: int = 16, tile_c: int = 128) -> torch.Tensor:
    """Codes (uint8) of X scaled blockwise: (R, C), or (R, ceil(C/2)) packed for 4-bit formats."""
    R, C = X.shape
    pack = pack and fmt.bits == 4
    out = torch.empty(R, (C + 1) // 2 if pack else C, dtype=torch.uint8, device=X.device)
    if X.numel() == 0:
        return out
    factor = factor.float()
    grid = (cdiv(R, tile_r), cdiv(C, tile_c))
    n = noise if noise is not None else X  # never read without STOCHASTIC
    _cast_kernel[grid](
        X, factor, n, out, R, C, out.shape[1], X.stride(0), X.stride(1), factor.stride(0), factor.stride(1),
        n.stride(0), n.stride(1), out.stride(0), br, bc,
        TILE_R=tile_r, TILE_C=tile_c, MULTIPLY=multiply, STOCHASTIC=noise is not None,
        PACK=2 if pack else 1, **format_constants(fmt, X.device),
    )
    return out
