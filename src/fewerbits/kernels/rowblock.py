"""Quantization with 1 × bc or square bc × bc blocks (MX, NVFP4 1x16 and 16x16, FP8 1x128 and
128x128) in one read: amax, scale, codes.

    X (R, C), any dtype and strides
        │ one program = TILE_R rows × TILE_C columns = TILE_R × (TILE_C / bc) whole blocks
        │ (2-D blocks: TILE_R = br, so the tile holds TILE_C / bc whole blocks)
        ▼
    ┌─ block ─┬─ block ─┬─ … ┐   amax per block (over real elements: padding loads as 0;
    │ bc cols │ bc cols │    │   NaN anywhere makes the block's amax NaN)
    └─────────┴─────────┴────┘
        │ scale rule (as scaling.py): fp32 amax/max · floor · ceil · even · rceil · NVFP4
        ▼
    scales (R, C/bc) fp32      codes = round_to_codes(x / scale or x × enc)   fp4 packed 2/byte

The arithmetic is the reference's, step for step, so the bits are the reference's: the rules
read exponents from the fp32 bit fields (a subnormal amax lands below every scale format's
smallest exponent and is clamped exactly as the reference clamps it), rceil rounds the
exponent of amax × fp32(1/max) up as Transformer Engine does, NVFP4 computes s_enc, s_dec and
its multiplier from the tensor-wide amax the launcher passes (the first program stores s_dec),
stochastic rounding computes each element's noise from the reference's seed
(rounding.noise_bits), and elements go through cast.py's `_encode_store` — or, for values,
`_round_values`, which gives the values the codes decode to without making the codes.

With a Hadamard transform whose size is the block's (mxfp4's 32, nvfp4's 16), the kernel
transforms each block of the tile first, in hadamard.py's order of float32 operations, so the
values are those of quantizing `Hadamard.transform(X)`; NVFP4's tensor amax of the transformed
matrix comes from `_hadamard_amax_kernel`, a read-only pass of the same transform, unless the
caller gives it: `two_amaxes` finds a tensor's plain amax and that of its transposed transform
in one read, for the two operands made of one input or gradient.

A bf16 row read of MX blocks rounded to nearest without a transform is worked two elements a
32-bit word, as loaded, by the GPU's bf16x2 instructions (`lanes_possible`,
`cast._nearest_lanes`; sm_90 on), and so is a column read loaded two rows a word, whose lanes
are two rows' blocks: the same bits in fewer instructions. NVFP4 along bf16 rows takes them
too, each product made in fp32 and rounded to odd in bf16 first. Along rows, FP4's and FP6's
codes and NVFP4's values are loaded 16 bytes at a time as pieces of whole blocks, so that each
thread holds whole blocks, makes their scales alone and packs their codes (`row_read_whole`).
Values along bf16 rows under a transform or rounded stochastically hold whole blocks a thread
in an fp32 tile instead (`row_read_whole_fp32`): the transform's stages, the amax and the scale
in the thread.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ..codes import code_table, pack as pack_codes
from ..quantize import check_amax
from ..scaling import nan_where_not_finite, two_level_tensor_scales
from ..schemes import Scheme
from .cast import (_bf16x2, _capability, _encode_store, _in_both_lanes, _nearest_lanes, _nearest_magnitude,
                   _round_codes, _round_values, _seed_noise, _store_codes, _to_bf16, _two_lanes, cdiv,
                   format_constants)

RULES = {"amax": 0, "floor": 1, "ceil": 2, "even": 3, "rceil": 4, "two_level": 5}


@triton.jit
def _pow2(k):
    """2^k as fp32 for integer k in [−127, 127] (2^−127 is subnormal)."""
    return tl.where(k > -127, (k + 127) << 23, 1 << 22).to(tl.float32, bitcast=True)


@triton.jit
def _load_fp32(ptrs, mask, X_BF16: tl.constexpr):
    """Elements as fp32, 0 where masked off. bf16 (passed as its int16 bits, `_bits`) is widened
    by hand, exact for subnormals everywhere (Triton's interpreter converts bf16 subnormals
    wrongly)."""
    if X_BF16:
        x = (tl.load(ptrs, mask=mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _hadamard_blocks(x, signs, h_scale, N: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
                     BY_SPLIT: tl.constexpr = False, DOWN: tl.constexpr = False):
    """hadamard.py's transform of every BC-block of an fp32 tile of N blocks whose last axes hold
    a block's elements in order — (TILE_R, NB, BC), or (NB, TILE_R, K, V), block element V·k + e
    at [.., .., k, e] — or, DOWN, of the (BC, N) tile whose columns are the blocks, in
    hadamard.py's order: the signs (`signs`, broadcast to a block's axes), the butterfly stages
    s = 1, 2, 4, … (the pair (i, i + s) becomes (sum, difference), each one float32 addition),
    then × fp32(1/√BC).

    Two forms of a stage, the same additions: compiled, a reduction over an axis of two (by
    `_add`, not tl.sum, whose interpreted form starts from +0 and so turns −0 + −0 into +0),
    which keeps the tile in registers (and lane shuffles where a block spans threads); BY_SPLIT,
    the pair taken apart by tl.split and put back by tl.join, for Triton's interpreter, which
    runs a reduction by `_add` one element at a time (~50× slower) but these as whole arrays.
    (Compiled, the split form moves the tile through shared memory, with barriers:
    scripts/kernel_sass.py.)"""
    x = x * signs
    AXIS: tl.constexpr = 1 if DOWN else 2  # the pair's axis in the tile seen as 4-D below
    if DOWN:
        pm = (1 - 2 * tl.arange(0, 2)).to(tl.float32)[None, :, None, None]  # +1, −1
    else:
        pm = (1 - 2 * tl.arange(0, 2)).to(tl.float32)[None, None, :, None]
    for st in tl.static_range(STAGES):  # BC = 2^STAGES; stage st pairs i and i + 2^st
        if DOWN:
            y = tl.reshape(x, (BC >> (st + 1), 2, 1 << st, N))
        else:
            y = tl.reshape(x, (N, BC >> (st + 1), 2, 1 << st))
        if BY_SPLIT and DOWN:  # the pair's axis last, split: y_i and y_{i+2^st}
            a, b = tl.split(tl.permute(y, (0, 2, 3, 1)))
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2)), x.shape)
        elif BY_SPLIT:
            a, b = tl.split(tl.permute(y, (0, 1, 3, 2)))
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), x.shape)
        else:
            total = tl.reduce(y, AXIS, _add, keep_dims=True)  # y_i + y_{i+2^st}
            diff = tl.reduce(y * pm, AXIS, _add, keep_dims=True)  # y_i − y_{i+2^st}
            x = tl.reshape(tl.where(pm > 0, total, diff), x.shape)
    return x * h_scale


QUOTIENT_LOW = tl.constexpr(2.0 ** -64)  # `_quotient` returns the quotient for |x · p| in [LOW, HIGH)
QUOTIENT_HIGH = tl.constexpr(2.0 ** 64)


@triton.jit
def _divisor(s):
    """(p, m, y) for `_quotient`'s division by s, a positive normal fp32 scale (a NaN or inf s
    gives NaNs, which the caller masks): p = 2^(127 − E), s's binade's reciprocal (exact, by a
    division, as v22 of docs/kernels-notes.md makes powers of two), m = s · p ∈ [1, 2) its
    significand (exact), y = fp32(1 / m), correctly rounded."""
    p = tl.div_rn(1.0, (s.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True))
    m = s * p
    return p, m, tl.div_rn(1.0, m)


@triton.jit
def _quotient(x, p, m, y):
    """fp32(x / s), correctly rounded — tl.div_rn's bits — from `_divisor(s)`, by a product and
    an fma correction with no branch (div_rn's checks and slow path cost the one-read rows
    about 40% of their time on the H200, against a bare product; docs/kernels-notes.md v30):

    - xs = x · p, so that xs / m = x / s exactly (p is a power of two; xs is exact unless |xs|
      is under 2^−126 or past fp32's range, which the last line takes care of);
    - q = fp32(xs · y), then q + fp32(xs − m·q) · y (one fma inside another): Markstein's
      correction (P. Markstein, IBM J. Res. Dev. 34(1), 1990; the scheme of a reciprocal known
      in advance: J.-M. Muller, LIP research report 2002-30).
    - Where 2^−64 ≤ |xs| < 2^64 every intermediate is a normal number, so multiplying xs by a
      power of two multiplies every step's result by it: the bits follow from those of xs's
      significand. scripts/verify_quotient.py checked all 2^46 pairs of significands (xs and m
      in [1, 2)) on an H200 against div_rn: no pair differs.
    - Outside that range the quotient is xs itself (|xs/m| is under 2^−64, or 2^63 and over):
      every element format rounds both to the same code (±0 with x's sign, or saturated), as
      does stochastic rounding, whose noise cannot lift a value under 2^−24 of the smallest
      subnormal's ulp. x NaN gives NaN; x ±inf gives ±inf."""
    xs = x * p
    q = xs * y
    q = tl.fma(tl.fma(-m, q, xs), y, q)
    a = tl.abs(xs)
    return tl.where((a >= QUOTIENT_LOW) & (a < QUOTIENT_HIGH), q, xs)


@triton.jit
def _u16x2_max(a, b):
    """`max.u16x2` of two words (two 16-bit lanes each, compared as unsigned integers)."""
    return _bf16x2(a, b, "max.u16x2")


@triton.jit
def _lane_max(m, EMULATED: tl.constexpr, AXIS: tl.constexpr = 2):
    """The largest of each 16-bit lane (unsigned) of a tile of words along its axis AXIS, as a
    word: by `max.u16x2`, one instruction for both lanes, in and across threads (splitting the
    lanes first took about two integer instructions a word more, on the ALU pipe that bounds
    FP4's codes on the H200: docs/kernels-notes.md, v67); EMULATED (Triton's interpreter, which
    runs no PTX): each lane's own maximum."""
    if EMULATED:
        return tl.max(m & 0xFFFF, axis=AXIS) | (tl.max((m >> 16) & 0xFFFF, axis=AXIS) << 16)
    return tl.reduce(m, AXIS, _u16x2_max)


@triton.jit
def _over_block(t, WHOLE: tl.constexpr):
    """A (TILE_R, NB) tile of per-block numbers broadcast over each block's elements: as (TILE_R,
    NB, 1) for a (TILE_R, NB, ·) tile, or, whole blocks a thread (WHOLE), as (NB, TILE_R, 1, 1)
    for the (NB, TILE_R, K, ·) tile."""
    if WHOLE:
        b = tl.trans(t)[:, :, None, None]
    else:
        b = t[:, :, None]
    return b


@triton.jit
def _whole_tile(rows, NB: tl.constexpr, BC: tl.constexpr, X_BF16: tl.constexpr):
    """(piece, rows, columns) of a row read's fp32 tile of whole blocks, (NB, TILE_R, K, V), for the
    program's blocks along axis 1 of the grid: piece k of a block holds its elements V·k … V·k +
    V − 1 (16 bytes of bf16 or fp32, one load), `piece` a block's element index at [.., .., k, e]
    (1, 1, K, V); rows (1, TILE_R, 1, 1); columns (NB, 1, K, V)."""
    V: tl.constexpr = 8 if X_BF16 else 4
    K: tl.constexpr = BC // V
    piece = (V * tl.arange(0, K))[None, None, :, None] + tl.arange(0, V)[None, None, None, :]
    cols = ((tl.program_id(1) * NB + tl.arange(0, NB)) * BC)[:, None, None, None] + piece
    return piece, rows[None, :, None, None], cols


@triton.jit
def _fp6_bits(c, s):
    """Code bits c placed at bit s of a 32-bit word: c << s for s in [0, 32) (bits past 31
    dropped), c >> −s for s in (−6, 0) (the high bits of a code that began in the word before),
    else 0."""
    left = tl.where((s >= 0) & (s < 32), c << tl.minimum(tl.maximum(s, 0), 31), 0)
    return left | tl.where((s < 0) & (s > -6), c >> tl.minimum(tl.maximum(-s, 0), 31), 0)


@triton.jit
def _store_fp6_blocks(code, out_ptr, rows, blocks, R, CP, sor, K: tl.constexpr):
    """Store the FP6 codes of whole 1 × 32 blocks, an (NB, TILE_R, K, 4) tile of words of two
    codes each (block, row, piece k, word j: codes 8k + 2j and 8k + 2j + 1 of the block, in the
    low and high lanes), as `codes.pack` packs them: code c of a block at bits 6c … 6c + 5 of its
    24 bytes, six little-endian words from word 6 · block of the row (out_ptr: int32, sor and CP
    the row stride and length in words). Word t of a block is a sum over its codes of their bits
    in it (disjoint, so a sum is an OR), made within the thread that holds the block and put at
    the tile's place 4k + j = t, so that nothing changes layout; rows (1, TILE_R, 1, 1) and
    blocks (NB,) index the tile."""
    place = 4 * tl.arange(0, K)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
    low = code & 0x3F
    high = (code >> 16) & 0x3F
    words = tl.zeros_like(code)
    for t in tl.static_range(6):
        at = 12 * place - 32 * t  # where the word's low code starts in word t
        word = tl.sum(tl.sum(_fp6_bits(low, at) | _fp6_bits(high, at + 6), axis=3), axis=2)
        words = tl.where(place == t, word[:, :, None, None], words)
    cols = (6 * blocks)[:, None, None, None] + place
    tl.store(out_ptr + rows * sor + cols, words, mask=(rows < R) & (place < 6) & (cols < CP))


@triton.jit
def _rows_of_lanes(t, TILE_R: tl.constexpr, NB: tl.constexpr):
    """The (TILE_R, NB) tile t of a pair read (PAIRS: the even rows, then the odd ones) as its
    even rows and its odd rows, (TILE_R / 2, NB) each: the words' low lanes' and high lanes'."""
    return tl.split(tl.permute(tl.reshape(t, (2, TILE_R // 2, NB)), (1, 2, 0)))


@triton.jit
def _block_scale(amax, elem_max, rcp_max, tensor_scales_ptr, enc_numerator, s_dec_ptr, RULE: tl.constexpr,
                 KMIN: tl.constexpr, KMAX: tl.constexpr, EMAX_ELEM: tl.constexpr, M: tl.constexpr):
    """(scale, factor, code) of blocks with these amaxes under the scale rule RULE: the fp32
    scale, what the elements are multiplied by (or, for an fp32 scale, divided by), and the
    scale's code where it is stored as one (E8M0, NVFP4's E4M3); NaN scale and factor where the
    amax is not finite."""
    finite = amax < float("inf")  # False for inf and NaN
    abits = amax.to(tl.int32, bitcast=True)
    afield = (abits >> 23) & 0xFF
    code = afield  # replaced below by the code of a scale stored as one (E8M0, E4M3)

    if RULE == 0:  # fp32: amax / max, at least fp32's smallest normal
        scale = tl.maximum(tl.div_rn(amax, elem_max), 1.1754943508222875e-38)
        factor = scale
    elif RULE == 5:  # NVFP4: E4M3 block scale under the tensor's s_enc; elements × enc
        # the tensor level from the tensor's amax, as scaling.two_level_tensor_scales: s_enc =
        # min(fp32(448 · 6) / amax, FLT_MAX), 1 where that is degenerate (amax 0, inf or NaN);
        # s_dec = 1 / s_enc; the block multiplier s_enc · fp32(1 / 6)
        t_amax = tl.load(tensor_scales_ptr)
        q = tl.div_rn(enc_numerator, t_amax)
        s_enc = tl.where(q > 3.4028234663852886e38, 3.4028234663852886e38, q)  # NaN stays NaN
        degenerate = (t_amax == 0.0) | ~(s_enc < float("inf")) | (s_enc == 0.0)
        s_enc = tl.where(degenerate, 1.0, s_enc)
        s_dec = tl.div_rn(1.0, s_enc)
        mult = s_enc * rcp_max
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(s_dec_ptr, s_dec)
        # the block's amax × the multiplier to E4M3, half to even with subnormals, saturated at
        # 448 (an overflow to inf as well): its code and value by one fp32 addition, as the FP4
        # elements'. A floor and a float-to-integer conversion (quarter-rate on Hopper) and the
        # fraction's comparisons took 1.8 SASS instructions an element more in NVFP4's codes
        # along bf16 rows, compiled for sm_90 (docs/kernels-notes.md, v63)
        # (E4M3 as formats.py's fp8_e4m3 has it: 3 mantissa bits, bias 7, smallest binade −6,
        # largest finite code 126; literals, as Triton's interpreter takes no constexpr global
        # in integer arithmetic; a wrong one fails NVFP4's kernel tests)
        code, scale = _nearest_magnitude(amax * mult, 3, 7, -6, 126)
        factor = tl.minimum(tl.div_rn(1.0, scale * s_dec), 3.4028234663852886e38)
        code = tl.where(finite, code, 0x7F)
    else:  # powers of two: the exponent k of the scale 2^k
        if RULE == 1:  # floor: 2^(floor(log2 amax) − emax)
            k = afield - 127 - EMAX_ELEM
        elif RULE == 2:  # ceil: 2^(ceil(log2 amax) − emax)
            k = afield - 127 + ((abits & 0x7FFFFF) != 0).to(tl.int32) - EMAX_ELEM
        elif RULE == 3:  # even: amax rounded to the element's mantissa width, then floor
            drop: tl.constexpr = 23 - M
            rounded = (abits + ((1 << (drop - 1)) - 1) + ((abits >> drop) & 1)) & ~((1 << drop) - 1)
            k = ((rounded >> 23) & 0xFF) - 127 - EMAX_ELEM
        else:  # rceil: v = amax × fp32(1/max), its exponent rounded up (as TE)
            vbits = (amax * rcp_max).to(tl.int32, bitcast=True)
            vfield = (vbits >> 23) & 0xFF
            mant = vbits & 0x7FFFFF
            bump = (mant > 0) & ~((vfield == 0) & (mant <= 0x400000))
            k = vfield - 127 + bump.to(tl.int32)
        k = tl.minimum(tl.maximum(k, KMIN), KMAX)
        scale = _pow2(k)
        # 1 / 2^k, once a block: exact (2^−127 included, a subnormal), so the elements' product
        # by it below is their quotient by the scale, correctly rounded
        factor = tl.div_rn(1.0, scale)
        code = tl.where(finite, k + 127, 0xFF)  # the E8M0 code
    scale = tl.where(finite, scale, float("nan"))
    factor = tl.where(finite, factor, float("nan"))
    return scale, factor, code


@triton.jit(do_not_specialize=["row_stride"])
def _rowblock_kernel(x_ptr, seed_ptr, out_ptr, scale_ptr, R, C, CP, sxr, sxc, sor, ssr, row_stride,
                     elem_max, rcp_max, tensor_scales_ptr, amax_ptr, signs_ptr, h_scale, enc_numerator, s_dec_ptr,
                     BC: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, RULE: tl.constexpr,
                     KMIN: tl.constexpr, KMAX: tl.constexpr, EMAX_ELEM: tl.constexpr,
                     STOCHASTIC: tl.constexpr, PACK: tl.constexpr, E: tl.constexpr, M: tl.constexpr,
                     BIAS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
                     BITS: tl.constexpr, HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr, IS_INT: tl.constexpr,
                     SCALE_CODES: tl.constexpr, AMAX_MODE: tl.constexpr,
                     X_BF16: tl.constexpr, BR: tl.constexpr, elem_table, VALUES: tl.constexpr,
                     MAX_VALUE: tl.constexpr, H_STAGES: tl.constexpr, AS_ROWS: tl.constexpr,
                     NATIVE_MAX: tl.constexpr, H_SPLIT: tl.constexpr = False, FP64_QUOTIENT: tl.constexpr = False,
                     CODES_3D: tl.constexpr = False, TRANSPOSED: tl.constexpr = False,
                     NATIVE_BF16: tl.constexpr = False, PAIRS: tl.constexpr = False,
                     LANES: tl.constexpr = 0, WHOLE: tl.constexpr = False, TILE_STORE: tl.constexpr = False):
    # TRANSPOSED: x is the transpose T of the matrix quantized, whose square blocks are T's
    # blocks transposed (`square_column_read_transposed`); codes, scales and noise are placed
    # by that matrix's coordinates, (column, row) of T
    tl.static_assert(not TRANSPOSED or (CODES_3D and PACK == 1 and not VALUES and BR == BC),
                     "a transposed read stores byte codes of square blocks from the 3D tile")
    NB: tl.constexpr = TILE_C // BC
    # the tile as (TILE_R, NB, BC): rows, blocks, a block's columns; a block's amax and its
    # factor broadcast back along the last axis, with no reshape between (a reshape can make
    # the compiler move the tile through shared memory)
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    if PAIRS:  # rows loaded two at a time (below): the tile's first half holds the even rows,
        # its second half the odd ones
        half = tl.arange(0, TILE_R) // (TILE_R // 2)
        rows = tl.program_id(0) * TILE_R + 2 * (tl.arange(0, TILE_R) - half * (TILE_R // 2)) + half
    rows3 = rows[:, None, None]
    cols3 = ((tl.program_id(1) * NB + tl.arange(0, NB)) * BC)[None, :, None] + tl.arange(0, BC)[None, None, :]
    inside3 = (rows3 < R) & (cols3 < C)
    # AS_ROWS: the row stride (1: a column read) from an argument the compiler does not
    # specialize; not seeing that the rows are contiguous, it lays the tile out as for a row
    # read (`column_read_as_rows`), loading element by element (or, PAIRS, two rows' elements
    # at a time)
    if PAIRS:  # a column read laid out as rows (`pairs_possible`): rows 2p and 2p + 1,
        # neighbours in memory, loaded as one int32 (bf16) or int64 (fp32), row 2p in its low
        # half: half as many loads as one element each. The even rows then the odd ones make the
        # tile (on the H200 faster than rows 2p and 2p + 1 side by side: docs/kernels-notes.md, v64)
        tl.static_assert(AS_ROWS and TILE_R % 2 == 0)
        pairs3 = (tl.program_id(0) * (TILE_R // 2) + tl.arange(0, TILE_R // 2))[:, None, None]
        if X_BF16:
            w = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + pairs3 * row_stride + cols3 * (sxc // 2),
                        mask=(2 * pairs3 < R) & (cols3 < C), other=0)
            if not LANES:  # (LANES: the words worked as they are, a row's block in each lane)
                x = tl.join((w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True))
        else:
            w = tl.load(x_ptr.to(tl.pointer_type(tl.int64)) + pairs3 * row_stride + cols3 * (sxc // 2),
                        mask=(2 * pairs3 < R) & (cols3 < C), other=0)
            x = tl.join(w.to(tl.int32).to(tl.float32, bitcast=True),
                        (w >> 32).to(tl.int32).to(tl.float32, bitcast=True))
        if not LANES:
            x = tl.reshape(tl.permute(x, (3, 0, 1, 2)), (TILE_R, NB, BC))
    elif LANES:  # a bf16 row read as words of two neighbouring elements (`lanes_possible`): word
        # j of a block holds its columns 2j (low half) and 2j + 1, worked two at a time below by
        # the GPU's bf16x2 instructions (LANES 1) or, in Triton's interpreter, their emulation (2)
        tl.static_assert(X_BF16 and not AS_ROWS and BR == 1 and AMAX_MODE == 0 and H_STAGES == 0
                         and not STOCHASTIC and RULE >= 1 and RULE <= 5)
        wcols = ((tl.program_id(1) * NB + tl.arange(0, NB)) * (BC // 2))[None, :, None] + \
            tl.arange(0, BC // 2)[None, None, :]
        wrows = rows3
        if WHOLE:  # the tile as (NB, TILE_R, K, 4) words, piece k of a block its words 4k … 4k + 3
            # (16 bytes, one load): Triton lays the K pieces out in the same thread (each one more
            # load of its 16 bytes) and spreads the blocks, then the rows, over a warp's threads, so
            # a thread holds whole blocks, whose amaxes, scales and factors it makes alone, once
            # (`row_read_whole`)
            tl.static_assert(BC % 8 == 0 and (VALUES or PACK == 2 or (PACK == 3 and BC == 32)))
            K: tl.constexpr = BC // 8
            wcols = ((tl.program_id(1) * NB + tl.arange(0, NB)) * (BC // 2))[:, None, None, None] + \
                (4 * tl.arange(0, K))[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
            wrows = rows[None, :, None, None]
        winside = (wrows < R) & (wcols < C // 2)
        w = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + wrows * (sxr // 2) + wcols, mask=winside, other=0)
    elif WHOLE:  # whole blocks a thread without lanes (`row_read_whole_fp32`): the tile as (NB, TILE_R,
        # K, V) fp32, piece k of a block its elements V·k … V·k + V − 1 (16 bytes of bf16 or fp32,
        # one load); as the lanes' words above, Triton keeps a block's K pieces in one thread and
        # spreads the blocks, then the rows, over a warp's threads, so the transform's stages, the
        # block's amax, scale and factor stay in the thread. rows3, cols3 and inside3 name the
        # 4-D tile's coordinates from here on
        tl.static_assert(not AS_ROWS and not PAIRS and BR == 1 and AMAX_MODE == 0 and VALUES and RULE >= 1
                         and not TRANSPOSED)
        piece, rows3, cols3 = _whole_tile(rows, NB, BC, X_BF16)
        inside3 = (rows3 < R) & (cols3 < C)
        x = _load_fp32(x_ptr + rows3 * sxr + cols3 * sxc, inside3, X_BF16)
    else:
        offsets = rows3 * (row_stride if AS_ROWS else sxr) + cols3 * sxc
        x = _load_fp32(x_ptr + offsets, inside3, X_BF16)
    if not LANES:
        xbits = x.to(tl.int32, bitcast=True)
    if H_STAGES > 0:  # the blocks transformed first (C a multiple of BC: no padding in a block)
        if WHOLE:
            signs = tl.load(signs_ptr + piece)
        else:
            signs = tl.load(signs_ptr + tl.arange(0, BC))[None, None, :]
        x = _hadamard_blocks(x, signs, h_scale, TILE_R * NB, BC, H_STAGES, H_SPLIT)
        xbits = x.to(tl.int32, bitcast=True)

    # ---- amax of each block: (TILE_R, NB) -------------------------------------------------
    if LANES and PAIRS:  # a lane's blocks are a row's: the low lanes' largest |x| bit pattern and
        # the high lanes' (the high half of the largest word), widened to fp32's, in the tile's
        # order of rows (the even ones, then the odd ones)
        tl.static_assert(X_BF16 and AS_ROWS and AMAX_MODE == 0 and H_STAGES == 0 and not STOCHASTIC
                         and RULE >= 1 and RULE <= 4)
        mag = _lane_max(w & 0x7FFF7FFF, LANES == 2)
        low = mag << 16
        high = mag & -65536
        amax = tl.reshape(tl.permute(tl.join(low, high), (2, 0, 1)), (TILE_R, NB)).to(tl.float32, bitcast=True)
    elif LANES:  # the larger |x| bit pattern of each word's two, widened to fp32's (NaN above inf)
        if WHOLE:  # a piece's words, then the pieces, all in the thread; as (TILE_R, NB)
            mag = tl.trans(_lane_max(_lane_max(w & 0x7FFF7FFF, LANES == 2, 3), LANES == 2, 2))
        else:
            mag = _lane_max(w & 0x7FFF7FFF, LANES == 2)
        amax = (tl.maximum(mag & 0xFFFF, mag >> 16) << 16).to(tl.float32, bitcast=True)
    elif WHOLE:  # a piece's elements, then the pieces, all in the thread; as (TILE_R, NB)
        amax = tl.trans(tl.max(tl.max(xbits & 0x7FFFFFFF, axis=3), axis=2)).to(tl.float32, bitcast=True)
    elif AMAX_MODE == 0:  # BR × BC blocks: reduced here, as the largest |x| bit pattern — for
        # non-negative floats the integer order is the float order, and every NaN pattern is
        # above inf's, so a NaN anywhere makes the block's amax a NaN, in one reduction
        amax_bits = tl.max(xbits & 0x7FFFFFFF, axis=2)
        if BR > 1:  # the tile's rows are one block row: reduce over them too
            amax_bits = tl.broadcast_to(tl.max(amax_bits, axis=0)[None, :], (TILE_R, NB))
        amax = amax_bits.to(tl.float32, bitcast=True)
    else:  # one block per row (1) or one for the tensor (2): the amax comes from amax_ptr
        a_row = tl.load(amax_ptr + rows * (1 if AMAX_MODE == 1 else 0), mask=rows < R, other=0.0)
        amax = tl.broadcast_to(a_row[:, None], (TILE_R, NB))
    scale, factor, code = _block_scale(amax, elem_max, rcp_max, tensor_scales_ptr, enc_numerator, s_dec_ptr,
                                       RULE, KMIN, KMAX, EMAX_ELEM, M)

    blocks = tl.program_id(1) * NB + tl.arange(0, NB)
    srows = rows
    if AMAX_MODE == 0:
        scale_mask = (rows < R)[:, None] & (blocks * BC < C)[None, :]
        if BR > 1:  # one scale row per tile, stored from its first row
            srows = rows // BR
            scale_mask = scale_mask & ((rows % BR) == 0)[:, None]
    else:  # one scale per row (or one in all): the first column of tiles stores it
        keep = (rows < R) if AMAX_MODE == 1 else (rows == 0)
        scale_mask = keep[:, None] & (blocks == 0)[None, :]
        blocks = blocks * 0
    if TRANSPOSED:
        scale_offsets = blocks[None, :] * ssr + srows[:, None]
    else:
        scale_offsets = srows[:, None] * ssr + blocks[None, :]
    if SCALE_CODES:  # E8M0 or E4M3: store the code
        tl.store(scale_ptr + scale_offsets, code.to(tl.uint8), mask=scale_mask)
    else:
        tl.store(scale_ptr + scale_offsets, scale, mask=scale_mask)

    # ---- elements --------------------------------------------------------------------------
    if LANES and PAIRS:  # two rows a word (`_nearest_lanes`): each lane by its own block's 2^−k,
        # and a block whose scale is NaN takes code 0 (values: NaN) in its lane alone; the lanes
        # then split into the tile's rows, the even ones first, and stored
        f_low, f_high = _rows_of_lanes(factor, TILE_R, NB)
        s_low, s_high = _rows_of_lanes(scale, TILE_R, NB)
        f2 = _two_lanes(f_low, f_high)
        keep = (tl.where(s_low == s_low, 0xFFFF, 0) | tl.where(s_high == s_high, -65536, 0))[:, :, None]
        if VALUES:
            elems = _nearest_lanes(w, f2[:, :, None], E, M, BIAS, EMIN, MAX_CODE, False, LANES == 2)
            out = _bf16x2(elems, _two_lanes(s_low, s_high)[:, :, None], "mul.rn.bf16x2", LANES == 2)
            out = (out & keep) | (0x7FC07FC0 & ~keep)
            out = tl.reshape(tl.permute(tl.join(out & 0xFFFF, (out >> 16) & 0xFFFF), (3, 0, 1, 2)), (TILE_R, NB, BC))
            tl.store(out_ptr.to(tl.pointer_type(tl.int16)) + rows3 * sor + cols3, out.to(tl.int16), mask=inside3)
        else:
            code = _nearest_lanes(w, f2[:, :, None], E, M, BIAS, EMIN, MAX_CODE, True, LANES == 2) & keep
            code = tl.reshape(tl.permute(tl.join(code & 0xFFFF, code >> 16), (3, 0, 1, 2)), (TILE_R, TILE_C))
            cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
            _store_codes(code, out_ptr, rows, cols, (rows < R)[:, None] & (cols < C)[None, :], R, CP, sor,
                         TILE_R, TILE_C, PACK)
    elif LANES:  # two elements a word (`_nearest_lanes`), by the block's 2^−k and 2^k as bf16 —
        # exact, 2^−127 a bf16 subnormal — in both halves of a word; a block whose scale is NaN
        # takes code 0 (values: NaN) in every element, as below
        # (NVFP4 makes its products in fp32 below, then takes the lanes under a factor of 1.0)
        f_w, s_w = _over_block(factor, WHOLE), _over_block(scale, WHOLE)  # over the words of a block
        f2 = tl.full(w.shape, 0x3F803F80, tl.int32) if RULE == 5 else _in_both_lanes(f_w)
        finite = s_w == s_w
        if RULE == 5:  # NVFP4: factor is no power of two, so each element's product by it is made
            # in fp32, as the reference makes it, and rounded to odd in bf16 (truncated, its last
            # bit set where a dropped bit is): FP4's rounding to nearest of that bf16, eight
            # significant bits against FP4's two, is that of the fp32 product (docs/kernels-notes.md, v68)
            v_lo = ((w << 16).to(tl.float32, bitcast=True) * f_w).to(tl.int32, bitcast=True)
            v_hi = ((w & -65536).to(tl.float32, bitcast=True) * f_w).to(tl.int32, bitcast=True)
            w = ((v_lo >> 16) & 0xFFFF) | (v_hi & -65536) | (((v_lo & 0xFFFF) + 0xFFFF) >> 16) | \
                (((v_hi & 0xFFFF) + 0xFFFF) & 0x10000)
        if VALUES:
            elems = _nearest_lanes(w, f2, E, M, BIAS, EMIN, MAX_CODE, False, LANES == 2)
            out = tl.where(finite, _bf16x2(elems, _in_both_lanes(s_w), "mul.rn.bf16x2", LANES == 2), 0x7FC07FC0)
            tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + wrows * (sor // 2) + wcols, out, mask=winside)
        else:
            code = tl.where(finite, _nearest_lanes(w, f2, E, M, BIAS, EMIN, MAX_CODE, True, LANES == 2), 0)
            if WHOLE and PACK == 2:  # FP4: word j's two codes are packed byte j of the row, stored from the tile
                tl.store(out_ptr + wrows * sor + wcols, ((code | (code >> 12)) & 0xFF).to(tl.uint8), mask=winside)
            elif WHOLE:  # FP6, blocks of 32: a block's codes are six packed words, made in the thread
                _store_fp6_blocks(code, out_ptr, wrows, tl.program_id(1) * NB + tl.arange(0, NB), R, CP, sor, K)
            else:  # the codes back in the tile's order, then stored as `_encode_store` stores them
                code = tl.reshape(tl.join(code & 0xFFFF, code >> 16), (TILE_R, TILE_C))
                cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
                _store_codes(code, out_ptr, rows, cols, (rows < R)[:, None] & (cols < C)[None, :], R, CP, sor,
                             TILE_R, TILE_C, PACK)
    else:
        f, s3 = _over_block(factor, WHOLE), _over_block(scale, WHOLE)  # over a block's elements
        if RULE == 0 and TILE_R * NB == 1:  # an fp32 scale, one block a program (the one-read rows):
            # its one scale's `_divisor`, then the correctly rounded quotients by `_quotient`
            p, m, y = _divisor(factor)
            v = _quotient(x, p[:, :, None], m[:, :, None], y[:, :, None])
        elif RULE == 0 and BR == TILE_R and NB == 1:  # one square block a program (128x128): its scale,
            # equal in every row of `factor`, taken as one number first (a NaN scale's quotients
            # are replaced below), so that `_divisor` runs once and not in each thread per row
            p, m, y = _divisor(tl.max(tl.max(factor, axis=1), axis=0))
            v = _quotient(x, p, m, y)
        elif RULE == 0 and FP64_QUOTIENT:  # the quotient as x times the block's fp64 reciprocal,
            # rounded once to fp32: div_rn's bits for quotients in fp32's normal range, and below it
            # the same codes (`scaling.exact_reciprocal` proves both), in a widening, a product and
            # a narrowing an element where div_rn takes a reciprocal and its corrections
            r = 1.0 / factor.to(tl.float64)
            v = (x.to(tl.float64) * r[:, :, None]).to(tl.float32)
        elif RULE == 0:  # the correctly rounded quotient. (`_quotient` made the tiles of several
            # blocks 6–7% slower on the H200, docs/kernels-notes.md v30)
            v = tl.div_rn(x, f)
        else:  # the product: by NVFP4's enc, or by 2^−k, a power of two's exact reciprocal. (v is
            # added to only through its absolute value, when the values kernel rounds it to
            # nearest, so no fma can take in the product. 2^−k made
            # from −k by integer arithmetic instead of this division gave wrong E8M0 codes on the
            # H200 for the first block of a tile: docs/kernels-notes.md, v22)
            v = x * f
        if not VALUES:  # a block whose scale is NaN (its amax not finite) takes code 0 for every
            # element; its values need no such step: whatever its elements round to, they are
            # multiplied by that NaN scale below (docs/kernels-notes.md, v61)
            v = tl.where(tl.abs(f) < float("inf"), v, 0.0)
        if VALUES:  # the dequantized values instead of the codes: code value × block scale, to bf16
            noise = 0
            if STOCHASTIC:
                noise = _seed_noise(seed_ptr, rows3, cols3, C)
            if IS_INT:  # the codes, then their values from the table
                code = _round_codes(v, noise, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT,
                                    STOCHASTIC)
                elems = tl.load(elem_table + code)
            else:
                elems = _round_values(v, noise, M, BIAS, EMIN, EMAX, MAX_CODE, MAX_VALUE, HAS_NAN, STOCHASTIC, E,
                                      NATIVE_MAX)
            values = elems * s3
            if NATIVE_BF16:  # the GPU's conversion (two elements an instruction on NVIDIA from sm_80),
                # rounding half to even as `_to_bf16` does, but a NaN to the canonical 0x7FFF where
                # torch and `_to_bf16` give 0x7FC0. Values are NaN exactly in the blocks whose scale
                # is (elements are finite where the scale is, and so are the scales' values), so
                # those blocks take 0x7FC0 by a select on the converted tile (docs/kernels-notes.md,
                # v60: three to four SASS instructions an element fewer than `_to_bf16`)
                nan16 = tl.full((1, 1, 1), 0x7FC0, tl.uint16).to(tl.bfloat16, bitcast=True)
                out = tl.where(s3 == s3, values.to(tl.bfloat16), nan16)
            else:
                out = _to_bf16(values)
            if TILE_STORE:  # whole blocks a thread, stored from the tile put back as (TILE_R, TILE_C):
                # Triton moves it through shared memory to the layout of a row's neighbouring
                # elements in neighbouring threads (`whole_tile_store`)
                tl.static_assert(WHOLE and not LANES)
                out = tl.reshape(tl.permute(out, (1, 0, 2, 3)), (TILE_R, TILE_C))
                cols = (tl.program_id(1) * TILE_C + tl.arange(0, TILE_C))[None, :]
                tl.store(out_ptr + rows[:, None] * sor + cols, out, mask=(rows < R)[:, None] & (cols < C))
            else:
                tl.store(out_ptr + rows3 * sor + cols3, out, mask=inside3)
        elif PACK == 1 and CODES_3D:  # a byte a code, stored from the (TILE_R, NB, BC) tile itself:
            # the loads and the store then share one layout (along rows, 16 neighbouring elements a
            # thread, the store's 16 bytes), so the tile does not go through shared memory to be
            # stored, and a thread's work per block (the amax's shuffles, the scale, its reciprocal)
            # serves 16 of its elements where a bf16 row read gave it 8 (docs/kernels-notes.md, v56)
            noise = 0
            if STOCHASTIC:
                if TRANSPOSED:  # element (c, r) of an R-column matrix
                    noise = _seed_noise(seed_ptr, cols3, rows3, R)
                else:
                    noise = _seed_noise(seed_ptr, rows3, cols3, C)
            code = _round_codes(v, noise, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT, STOCHASTIC,
                                NATIVE_MAX)
            if TRANSPOSED:  # stored down the tile's columns, which are the codes' rows
                tl.store(out_ptr + cols3 * sor + rows3, code.to(tl.uint8), mask=inside3)
            else:
                tl.store(out_ptr + rows3 * sor + cols3, code.to(tl.uint8), mask=inside3)
        else:
            v = tl.reshape(v, (TILE_R, TILE_C))
            cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
            inside = (rows < R)[:, None] & (cols < C)[None, :]
            noise = 0
            if STOCHASTIC:
                noise = _seed_noise(seed_ptr, rows[:, None], cols[None, :], C)
            _encode_store(v, noise, out_ptr, rows, cols, inside, R, C, CP, sor, TILE_R, TILE_C,
                          STOCHASTIC, PACK, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT,
                          NATIVE_MAX)


@triton.jit
def _column_whole_kernel(x_ptr, seed_ptr, out_ptr, scale_ptr, R, C, sxc, sor, ssr, elem_max, rcp_max, tensor_scales_ptr,
                         signs_ptr, h_scale, enc_numerator, s_dec_ptr, BC: tl.constexpr, TILE_R: tl.constexpr,
                         RULE: tl.constexpr, KMIN: tl.constexpr, KMAX: tl.constexpr, EMAX_ELEM: tl.constexpr,
                         PACK: tl.constexpr, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr,
                         EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, BITS: tl.constexpr,
                         HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr, IS_INT: tl.constexpr,
                         MAX_VALUE: tl.constexpr, NATIVE_MAX: tl.constexpr, SCALE_CODES: tl.constexpr,
                         X_BF16: tl.constexpr, H_STAGES: tl.constexpr, H_SPLIT: tl.constexpr = False,
                         NATIVE_BF16: tl.constexpr = False, VEC: tl.constexpr = 8,
                         STOCHASTIC: tl.constexpr = False):
    """The values (bf16; rounded to nearest, or stochastically with `_rowblock_kernel`'s noise)
    and block scales of the 1 × BC blocks of the (R, C) matrix X given as a column read — X[r, c]
    at r + c·sxc, a transposed view — with its blocks down memory's rows (`column_read_whole`).
    A program reads one column of blocks, X's columns c₀ … c₀ + BC − 1 (BC of memory's rows),
    over TILE_R of its rows (neighbours in memory, VEC of them a thread), as a (BC, TILE_R) fp32
    tile. With VEC ≥ 2 Triton keeps the tile's axis 0 in each thread, so that a block's transform
    stages (H_STAGES), amax, scale and factor are made by one thread with no lane shuffles; with
    VEC 1 it spreads a block over 4 threads (8 elements each, for BC = 32) joined by shuffles.
    The values go to the row-major (R, C) out, a block's BC in a row, the scales (codes where
    SCALE_CODES) to the (R, C / BC) scale_ptr. The arithmetic is `_rowblock_kernel`'s, so the
    bits are its own and the reference's."""
    tl.static_assert(RULE >= 1 and not IS_INT)
    # VEC of a thread's rows a load: the contiguity Triton is told, from which it lays the tile
    # out (fewer than 16 bytes' worth keeps the registers of a thread's VEC · BC elements and the
    # work on them from spilling)
    rows = tl.max_contiguous(tl.program_id(0) * TILE_R + tl.arange(0, TILE_R), VEC)
    block = tl.program_id(1)
    cols = block * BC + tl.arange(0, BC)
    inside = (cols < C)[:, None] & (rows < R)[None, :]
    x = _load_fp32(x_ptr + cols[:, None] * sxc + rows[None, :], inside, X_BF16)
    if H_STAGES > 0:  # (C a multiple of BC: no padding in a block)
        signs = tl.load(signs_ptr + tl.arange(0, BC))[:, None]
        x = _hadamard_blocks(x, signs, h_scale, TILE_R, BC, H_STAGES, H_SPLIT, DOWN=True)
    amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0).to(tl.float32, bitcast=True)
    scale, factor, code = _block_scale(amax, elem_max, rcp_max, tensor_scales_ptr, enc_numerator, s_dec_ptr,
                                       RULE, KMIN, KMAX, EMAX_ELEM, M)
    if SCALE_CODES:
        tl.store(scale_ptr + rows * ssr + block, code.to(tl.uint8), mask=rows < R)
    else:
        tl.store(scale_ptr + rows * ssr + block, scale, mask=rows < R)
    noise = 0
    if STOCHASTIC:
        noise = _seed_noise(seed_ptr, rows[None, :], cols[:, None], C)
    elems = _round_values(x * factor[None, :], noise, M, BIAS, EMIN, EMAX, MAX_CODE, MAX_VALUE, HAS_NAN, STOCHASTIC,
                          E, NATIVE_MAX)
    values = elems * scale[None, :]
    if NATIVE_BF16:  # as `_rowblock_kernel`'s: a block whose scale is NaN takes 0x7FC0
        nan16 = tl.full((1, 1), 0x7FC0, tl.uint16).to(tl.bfloat16, bitcast=True)
        out = tl.where((scale == scale)[None, :], values.to(tl.bfloat16), nan16)
    else:
        out = _to_bf16(values)
    tl.store(out_ptr + rows[None, :] * sor + cols[:, None], out, mask=inside)


@triton.jit(do_not_specialize=["row_stride"])
def _hadamard_amax_kernel(x_ptr, amax_bits_ptr, R, C, sxr, sxc, row_stride, signs_ptr, h_scale, BC: tl.constexpr,
                          TILE_R: tl.constexpr, TILE_C: tl.constexpr, STAGES: tl.constexpr, X_BF16: tl.constexpr,
                          AS_ROWS: tl.constexpr, H_SPLIT: tl.constexpr = False, WHOLE: tl.constexpr = False):
    """The amax of the Hadamard-transformed (R, C) matrix, as the largest |x| bit pattern (NaN
    above inf), by an atomic max of each tile's into *amax_bits_ptr (int32, starting at 0); a
    column read laid out as a row read where AS_ROWS (as `_rowblock_kernel`); WHOLE: a row read
    as `_rowblock_kernel`'s fp32 tile of whole blocks, (NB, TILE_R, K, V), so that a block's
    stages run in one thread (`hadamard_amax_whole`)."""
    NB: tl.constexpr = TILE_C // BC
    rows = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    if WHOLE:
        tl.static_assert(not AS_ROWS)
        piece, rows3, cols3 = _whole_tile(rows, NB, BC, X_BF16)
        signs = tl.load(signs_ptr + piece)
    else:
        rows3 = rows[:, None, None]
        cols3 = ((tl.program_id(1) * NB + tl.arange(0, NB)) * BC)[None, :, None] + tl.arange(0, BC)[None, None, :]
        signs = tl.load(signs_ptr + tl.arange(0, BC))[None, None, :]
    inside3 = (rows3 < R) & (cols3 < C)
    x = _load_fp32(x_ptr + rows3 * (row_stride if AS_ROWS else sxr) + cols3 * sxc, inside3, X_BF16)
    x = _hadamard_blocks(x, signs, h_scale, TILE_R * NB, BC, STAGES, H_SPLIT)
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if WHOLE:
        bits = tl.max(bits, axis=3)
    bits = tl.max(tl.max(tl.max(bits, axis=2), axis=1), axis=0)
    tl.atomic_max(amax_bits_ptr, bits)


@triton.jit
def _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, k: tl.constexpr, X_BF16: tl.constexpr):
    """Row r + k of X over `cols` as fp32 (0 past its end) — and as its |x| bit pattern — then
    times sign k of the transform."""
    inside = cols < tl.where(r + k < R, C, 0)
    x = _load_fp32(x_ptr + (r + k) * sxr + cols * sxc, inside, X_BF16)
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, x * tl.load(signs_ptr + k)


@triton.jit
def _pair(a, b):
    """One butterfly step: (a + b, a − b)."""
    return a + b, a - b


@triton.jit
def _bits_max(a, b, c, d):
    return tl.maximum(tl.maximum(a, b), tl.maximum(c, d))


@triton.jit
def _abs_bits(x):
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _two_amaxes_kernel(x_ptr, amax_bits_ptr, R, C, sxr, sxc, signs_ptr, h_scale, TILE_C: tl.constexpr,
                       GROUPS: tl.constexpr, X_BF16: tl.constexpr):
    """Two amaxes of the (R, C) matrix X in one read, as largest |x| bit patterns (NaN above
    inf) by atomic maxima into amax_bits_ptr[0:2] (int32, starting at 0): of X, and of the
    16-point Hadamard transform of Xᵀ's rows — of every block of 16 rows of X down each column.

    A program reads GROUPS blocks of 16 rows over TILE_C columns, one row at a time as a vector
    (rows past R load as 0: the transform's zero padding), so each thread holds whole columns
    and the butterfly is hadamard.py's, pair by pair in registers: the signs, the stages
    s = 1, 2, 4, 8, each replacing rows (i, i + s) by (sum, difference). The product by
    fp32(1/4) comes after the maximum: multiplying by a positive number and rounding is
    monotone, so the largest product is the product of the largest."""
    cols = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    plain = tl.zeros((TILE_C,), dtype=tl.int32)
    transformed = tl.zeros((TILE_C,), dtype=tl.int32)
    for g in range(GROUPS):
        r = (tl.program_id(0) * GROUPS + g) * 16
        a0, x0 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 0, X_BF16)
        a1, x1 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 1, X_BF16)
        a2, x2 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 2, X_BF16)
        a3, x3 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 3, X_BF16)
        a4, x4 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 4, X_BF16)
        a5, x5 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 5, X_BF16)
        a6, x6 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 6, X_BF16)
        a7, x7 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 7, X_BF16)
        a8, x8 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 8, X_BF16)
        a9, x9 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 9, X_BF16)
        a10, x10 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 10, X_BF16)
        a11, x11 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 11, X_BF16)
        a12, x12 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 12, X_BF16)
        a13, x13 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 13, X_BF16)
        a14, x14 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 14, X_BF16)
        a15, x15 = _row(x_ptr, r, cols, R, C, sxr, sxc, signs_ptr, 15, X_BF16)
        plain = tl.maximum(plain, tl.maximum(_bits_max(a0, a1, a2, a3), _bits_max(a4, a5, a6, a7)))
        plain = tl.maximum(plain, tl.maximum(_bits_max(a8, a9, a10, a11), _bits_max(a12, a13, a14, a15)))
        # stage 1: pairs (i, i + 1)
        x0, x1 = _pair(x0, x1)
        x2, x3 = _pair(x2, x3)
        x4, x5 = _pair(x4, x5)
        x6, x7 = _pair(x6, x7)
        x8, x9 = _pair(x8, x9)
        x10, x11 = _pair(x10, x11)
        x12, x13 = _pair(x12, x13)
        x14, x15 = _pair(x14, x15)
        # stage 2: pairs (i, i + 2)
        x0, x2 = _pair(x0, x2)
        x1, x3 = _pair(x1, x3)
        x4, x6 = _pair(x4, x6)
        x5, x7 = _pair(x5, x7)
        x8, x10 = _pair(x8, x10)
        x9, x11 = _pair(x9, x11)
        x12, x14 = _pair(x12, x14)
        x13, x15 = _pair(x13, x15)
        # stage 4: pairs (i, i + 4)
        x0, x4 = _pair(x0, x4)
        x1, x5 = _pair(x1, x5)
        x2, x6 = _pair(x2, x6)
        x3, x7 = _pair(x3, x7)
        x8, x12 = _pair(x8, x12)
        x9, x13 = _pair(x9, x13)
        x10, x14 = _pair(x10, x14)
        x11, x15 = _pair(x11, x15)
        # stage 8: pairs (i, i + 8)
        x0, x8 = _pair(x0, x8)
        x1, x9 = _pair(x1, x9)
        x2, x10 = _pair(x2, x10)
        x3, x11 = _pair(x3, x11)
        x4, x12 = _pair(x4, x12)
        x5, x13 = _pair(x5, x13)
        x6, x14 = _pair(x6, x14)
        x7, x15 = _pair(x7, x15)
        m = tl.maximum(_bits_max(_abs_bits(x0), _abs_bits(x1), _abs_bits(x2), _abs_bits(x3)),
                       _bits_max(_abs_bits(x4), _abs_bits(x5), _abs_bits(x6), _abs_bits(x7)))
        m = tl.maximum(m, tl.maximum(_bits_max(_abs_bits(x8), _abs_bits(x9), _abs_bits(x10), _abs_bits(x11)),
                                     _bits_max(_abs_bits(x12), _abs_bits(x13), _abs_bits(x14), _abs_bits(x15))))
        transformed = tl.maximum(transformed, m)
    tl.atomic_max(amax_bits_ptr, tl.max(plain, axis=0))
    largest = tl.max(transformed, axis=0).to(tl.float32, bitcast=True) * h_scale
    tl.atomic_max(amax_bits_ptr + 1, largest.to(tl.int32, bitcast=True) & 0x7FFFFFFF)


def two_amaxes(X: torch.Tensor, hadamard, *, tile_c: int = 512, groups: int = 8,
               num_warps: int = 4) -> torch.Tensor:
    """fp32 [amax of X, amax of `hadamard.transform(X.t())`] of the (R, C) matrix X, NaN
    propagating, in one read: NVFP4's two tensor amaxes of a tensor quantized along its rows
    and, under the weight-gradient GEMM's 16-point transform, along its columns. A program reads
    `groups` blocks of 16 rows over `tile_c` columns; the default was the fastest or within 1%
    of it on the H200 among 40 such tiles, for bf16 8192 x 14336, 14336 x 8192, 8192 x 4096
    and 4096 x 8192 (docs/kernels-notes.md, v73: 0.0750 → 0.0723 ms on 8192 x 14336, 77% of
    the copy rate's read against 94% for the plain amax alone)."""
    if hadamard.size != 16:
        raise ValueError(f"two_amaxes takes a 16-point Hadamard transform (NVFP4's block), not {hadamard.size}")
    R, C = X.shape
    bits = torch.zeros(2, dtype=torch.int32, device=X.device)
    if X.numel():
        grid = (cdiv(R, 16 * groups), cdiv(C, tile_c))
        _two_amaxes_kernel[grid](_bits(X), bits, R, C, X.stride(0), X.stride(1), hadamard.signs_tensor(X.device),
                                 hadamard.scale, TILE_C=tile_c, GROUPS=groups, X_BF16=X.dtype == torch.bfloat16,
                                 num_warps=num_warps)
    return bits.view(torch.float32)


def _interpreted(X: torch.Tensor) -> bool:
    """Whether a kernel over X runs in Triton's interpreter (a tensor not on a GPU): the
    Hadamard butterfly's interpreted form (`_hadamard_blocks`, BY_SPLIT)."""
    return X.device.type != "cuda"


def _bits(X: torch.Tensor) -> torch.Tensor:
    """bf16 input as its int16 bit patterns (the kernel widens them); other dtypes as they are."""
    return X.view(torch.int16) if X.dtype == torch.bfloat16 else X


@functools.cache
def _reciprocal_of_max(value: float) -> float:
    """fp32(1 / value), the division done in fp32 (as scaling.py's rceil does it)."""
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(value, dtype=torch.float32))


def supported(scheme: Scheme) -> bool:
    """1 × bc or bc × bc blocks with bc a power of two from 16 to 128."""
    br, bc = scheme.block
    return br in (1, bc) and bc in (16, 32, 64, 128)


def hadamard_fusable(scheme: Scheme, hadamard, C: int) -> bool:
    """Whether the kernel can apply `hadamard` (hadamard.py) to the rows of an (R, C) matrix
    itself: 1 × bc blocks with bc the transform's size, and C a multiple of it."""
    br, bc = scheme.block
    return hadamard is not None and br == 1 and bc == hadamard.size and C % bc == 0


def _column_read(X: torch.Tensor) -> bool:
    """Whether X is a transposed view: its rows contiguous, its columns not."""
    return X.dim() == 2 and X.stride(0) == 1 and X.stride(1) != 1


def column_read_as_rows(X: torch.Tensor, scheme: Scheme, hadamard=None) -> bool:
    """Whether the kernel lays out a column read of X — a transposed view: every weight-gradient
    operand, and the weight of dgrad — as it lays out a row read: a block's elements along
    lanes, 8 consecutive ones a thread, loaded one by one (bf16 two rows at a time,
    `column_read_in_pairs`); otherwise a thread holds
    consecutive rows (the direction contiguous in memory, loaded 16 bytes at a time), and each
    block's reductions and scale arithmetic run across lanes and warps. Chosen by timing on
    the H200: the row layout for the values and the codes of 1 × bc blocks read along columns
    (docs/kernels-notes.md, v21, one layer's operands, two runs: mxfp8's gradient values
    0.42–0.45 → 0.40–0.42 ms, NVFP4's transformed gradient values 2.0–2.1 → 1.1–1.5 ms, and
    with NVFP4's tensor-amax pass of the transform laid out the same way, its two passes 1.44 →
    0.60 ms; v25, the FP8 1x128 codes of a 14336 × 8192 column read with `default_tile`: 244 →
    187 µs), except where the kernel applies a 32-point Hadamard transform (mxfp4's weight
    gradients), which it made slower (1.40 → 1.94 ms): there the values are copied to rows
    first (`column_read_transposed_first`) and the codes keep the memory's order."""
    br, bc = scheme.block
    return br == 1 and _column_read(X) and not (hadamard is not None and bc == 32)


def pairs_possible(X: torch.Tensor, tile_r: int) -> bool:
    """Whether the kernel can load a column read of bf16 or fp32 X two rows at a time (PAIRS),
    in tiles of tile_r rows: X's rows 2p and 2p + 1 one aligned int32 (bf16) or int64 (fp32)
    for every p."""
    return (X.dtype in (torch.bfloat16, torch.float32) and _column_read(X) and X.shape[0] % 2 == 0
            and X.stride(1) % 2 == 0 and X.data_ptr() % (2 * X.element_size()) == 0 and tile_r % 2 == 0)


def column_read_in_pairs(X: torch.Tensor, scheme: Scheme, tile_r: int) -> bool:
    """Whether a column read of X laid out as rows (`column_read_as_rows`) loads its rows two at a
    time, as one int32 (`pairs_possible`): for bf16, except FP6 elements. Chosen by timing on
    the H200 (docs/kernels-notes.md, v64; bf16 8192 x 14336 read down its columns): FP8 1x128
    codes 0.1107 → 0.1063 ms, MXFP8 codes 0.1094 → 0.1011, NVFP4 codes 0.2070 → 0.1964, the
    values of MXFP8 0.1457 → 0.1415, MXFP4 0.1469 → 0.1437, NVFP4 0.2297 → 0.2164 and, under
    its transform with stochastic rounding (wgrad's gradients), 0.3859 → 0.3540; MXFP4 codes
    the same; MXFP6 codes slower, 0.1297 → 0.1456, so FP6 (its values not timed) keeps one
    element a load — unless the read is worked two rows a word (`column_read_in_lanes`), which
    loads in pairs whatever the format."""
    return X.dtype == torch.bfloat16 and scheme.elem.bits != 6 and pairs_possible(X, tile_r)


LANES_CAPABILITY = (9, 0)  # PTX's bf16x2 multiply, add and subtract and u16x2 maximum: sm_90 on


def lanes_possible(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None, stochastic: bool = False,
                   capability: tuple[int, int] | None = None) -> bool:
    """Whether the kernel can work X two elements a 32-bit word (LANES, `cast._nearest_lanes`):
    bf16 on an NVIDIA GPU of compute capability 9.0 on (X's, or `capability` where given) or in
    Triton's interpreter (X not on a GPU), which emulates the GPU's bf16x2 instructions; read
    along rows (a unit column stride, an even row stride, a start aligned to four bytes, an even
    number of columns: a word holds two neighbours of a block) or down columns two rows a word
    (`pairs_possible`: a word holds two rows' elements, so two blocks); in 1 × bc blocks with
    power-of-two scales (`Scheme.pow2`: E8M0, or fp32 under a power-of-two rule) of
    floating-point elements with subnormals, or NVFP4's two-level scales along rows (each product
    made in fp32 and rounded to odd in bf16 first), rounded to nearest without a transform; their
    values, or FP4 and FP6 codes."""
    elem = scheme.elem
    if capability is None and _interpreted(X):
        device = True
    else:
        capability = capability or _capability(X.device)
        device = capability is not None and tuple(capability) >= LANES_CAPABILITY
    rows = X.dim() == 2 and X.stride(1) == 1 and X.stride(0) % 2 == 0 and X.shape[1] % 2 == 0 and X.data_ptr() % 4 == 0
    return (device and X.dtype == torch.bfloat16 and (rows or (pairs_possible(X, 2) and not scheme.two_level))
            and scheme.block[0] == 1 and scheme.block[1] % 2 == 0
            and (scheme.pow2 or scheme.two_level) and not elem.is_integer
            and elem.emin == 1 - elem.bias and hadamard is None and not stochastic and (values or elem.bits in (4, 6)))


def row_read_in_lanes(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None, stochastic: bool = False,
                      capability: tuple[int, int] | None = None) -> bool:
    """Whether a row read of X is worked two elements a word (`lanes_possible`) by default: on a
    GPU, not in Triton's interpreter, whose runs then take the path a GPU of compute capability
    below 9.0 takes (tests ask for the lanes there by name). On the H200, bf16 8192 x 14336 read
    along rows (docs/kernels-notes.md, v68): NVFP4 codes 0.1316 → 0.1150 ms with the tensor amax
    given, 0.1935 → 0.1775 with its pass; NVFP4 values the same (0.1455 ms either way)."""
    return (capability is not None or not _interpreted(X)) and not _column_read(X) and \
        lanes_possible(X, scheme, values, hadamard, stochastic, capability)


def whole_possible(X: torch.Tensor, scheme: Scheme, values: bool) -> bool:
    """Whether a row read of X worked two elements a word (`lanes_possible`) can hold whole blocks
    a thread (`row_read_whole`): its values, FP4 codes, or the FP6 codes of 1 × 32 blocks along
    rows of a multiple of 16 elements (packed as words by the thread, `_store_fp6_blocks`)."""
    fp6 = scheme.elem.bits == 6 and scheme.block[1] == 32 and X.shape[1] % 16 == 0
    return not _column_read(X) and (values or scheme.elem.bits == 4 or fp6)


def row_read_whole(X: torch.Tensor, scheme: Scheme, values: bool) -> bool:
    """Whether a row read worked two elements a word (`row_read_in_lanes`) loads each block as
    pieces of 16 bytes, one load each, so that a thread holds whole blocks (WHOLE): a block's
    amax, scale and factor are then made by one thread, once, where a block spread over two
    (NVFP4) or four (MX) threads had each of them make it, after shuffles. Where `whole_possible`,
    the default for the codes and for NVFP4's values. On the H200, bf16 8192 x 14336 read along
    rows (docs/kernels-notes.md, v69, v70; `WHOLE_TILES`): MXFP4 codes 0.0879 → 0.0773 ms, MXFP6
    E2M3 codes 0.1139 → 0.0890, NVFP4 codes 0.1154 → 0.1006, NVFP4 values 0.1468 → 0.1332; MXFP4
    values slower (0.1338 → 0.1385 in their fastest tile), so MX values keep a block over four
    threads."""
    return whole_possible(X, scheme, values) and (not values or scheme.two_level)


def whole_fp32_possible(X: torch.Tensor, scheme: Scheme, values: bool) -> bool:
    """Whether a row read of X not worked in lanes can hold whole blocks a thread in an fp32 tile
    (WHOLE without LANES, `row_read_whole_fp32`): the values of 1 × bc blocks with power-of-two
    or NVFP4's two-level scales (not an fp32 scale's quotient), X bf16 or fp32 and not a column
    read, under a Hadamard transform or not, rounded to nearest or stochastically."""
    return (values and scheme.block[0] == 1 and rule_of(scheme) != "amax"
            and X.dtype in (torch.bfloat16, torch.float32) and not _column_read(X))


def row_read_whole_fp32(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None,
                        stochastic: bool = False) -> bool:
    """Whether a row read not worked in lanes holds whole blocks a thread (`whole_fp32_possible`) by
    default: a block's Hadamard stages, amax, scale and factor then run in one thread, with no lane
    shuffles, where a block over two (NVFP4) or four (MX) threads exchanged them. For bf16 values
    of 1 × 16 and 1 × 32 blocks (the tiles timed) under a transform or rounded stochastically. On
    the H200, bf16 8192 x 14336 read along rows (docs/kernels-notes.md, v71, v72;
    `WHOLE_FP32_TILES`): NVFP4 values under the 16-point transform 0.1739 → 0.1469 ms with the
    tensor amax given, 0.2740 → 0.2433 with its pass, and with stochastic rounding 0.2941 → 0.2410;
    MXFP4 values under the 32-point transform with stochastic rounding 0.2921 → 0.2437, rounded to
    nearest 0.1710 → 0.1342 (stored from the tile in rows and columns, `whole_tile_store`; stored
    from the tile of whole blocks, 0.1831 in its fastest tile); without a transform, stochastic:
    NVFP4 0.2616 → 0.2227, MXFP8 E4M3 0.2398 → 0.2216, MXFP4 0.2312 → 0.2226. fp32 input was slower
    (MXFP4 under its transform, 4096 x 14336: 0.1008 → 0.1911, stored from the tile of whole
    blocks), so it is not taken by default."""
    return (whole_fp32_possible(X, scheme, values) and X.dtype == torch.bfloat16
            and scheme.block[1] in WHOLE_FP32_TILES and (stochastic or hadamard is not None))


def whole_tile_store(scheme: Scheme, stochastic: bool) -> bool:
    """Whether values made with whole blocks a thread in an fp32 tile (`row_read_whole_fp32`) are
    stored from the tile put back in rows and columns (TILE_STORE), which Triton moves through
    shared memory so that neighbouring threads store a row's neighbouring elements, instead of
    from the tile itself, where each thread stores its block's pieces of 16 bytes, 2·bc bytes
    apart from its neighbour's. Chosen by timing on the H200 (docs/kernels-notes.md, v72; bf16
    read along rows, 4 × 512 tiles): MXFP4 under its 32-point transform rounded to nearest,
    8192 x 14336 0.1710 → 0.1342 ms (66% → 84% of the copy rate), 8192 x 4096 0.0526 → 0.0418;
    NVFP4 under its 16-point transform slower with it (0.2431 → 0.2462 ms); rounded
    stochastically (v73), MXFP4 0.6–1.5% faster with it, MXFP8 E4M3 1–3% and NVFP4 about 5%
    slower: 1 × 32 blocks rounded to nearest."""
    return scheme.block[1] == 32 and not stochastic


def column_read_in_lanes(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None, stochastic: bool = False,
                         capability: tuple[int, int] | None = None) -> bool:
    """Whether a column read of X is worked two rows a word (`lanes_possible`, its rows loaded in
    pairs) by default: as `row_read_in_lanes` decides for rows. On the H200, bf16 read down the
    columns of 8192 x 14336 (docs/kernels-notes.md, v66): MXFP4 codes 0.1265 → 0.0891 ms, MXFP6
    E2M3 codes 0.1275 → 0.1231, MXFP6 E2M3 values 0.1484 → 0.1406, MXFP4 values 0.1443 → 0.1422,
    MXFP8 values the same."""
    return (capability is not None or not _interpreted(X)) and _column_read(X) and \
        lanes_possible(X, scheme, values, hadamard, stochastic, capability)


def column_read_transposed_first(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None) -> bool:
    """Whether the kernel reads a row-major copy of a column read of X instead of X itself: the
    values of 1 × bc blocks under a Hadamard transform of 32 points (mxfp4's weight-gradient
    operands), the one column read that neither layout of the kernel (`column_read_as_rows`)
    takes near the speed of a row read, where they are not made with whole blocks down the
    memory's rows (`column_read_whole`, which `quantize_rowblocks` asks first: bf16 X). The
    copy is made by the tiled transpose kernel (kernels/transpose.py) and freed when the kernel is
    done; timings in docs/kernels-notes.md (v22)."""
    br, bc = scheme.block
    return values and br == 1 and _column_read(X) and hadamard is not None and bc == 32


def column_whole_possible(X: torch.Tensor, scheme: Scheme, values: bool) -> bool:
    """Whether the values of a column read of X can be made with whole blocks down the memory's
    rows (`_column_whole_kernel`): 1 × bc blocks of floating-point elements with
    power-of-two or NVFP4's two-level scales, X bf16 or fp32, rounded to nearest or
    stochastically, under a Hadamard transform of the block's size or none."""
    return (values and _column_read(X) and scheme.block[0] == 1 and rule_of(scheme) != "amax"
            and not scheme.elem.is_integer and X.dtype in (torch.bfloat16, torch.float32))


def column_read_whole(X: torch.Tensor, scheme: Scheme, values: bool, hadamard=None, stochastic: bool = False) -> bool:
    """Whether a column read's values are made with whole blocks down the memory's rows
    (`column_whole_possible`) by default: bf16 values of 1 × 32 blocks under the 32-point
    transform (mxfp4's weight-gradient operands, the gradient rounded stochastically, the input
    to nearest), which otherwise read a copy of X in rows (`column_read_transposed_first`). On
    the H200, bf16 X read down its columns, 8192 x 14336 (docs/kernels-notes.md, v75): rounded to
    nearest 0.2560 ms through the copy, 0.1614 with whole blocks down the columns; stochastically
    0.3653 → 0.2877. Every other case timed there was slower with them at its best tile, or
    within 2%: NVFP4 under its transform 0.1645 → 0.2134 (nearest), 0.2655 → 0.2913
    (stochastic); MXFP4 without one 0.1407 → 0.1566; MXFP8 0.1399 → 0.1574 (nearest),
    0.2524 → 0.2489 (stochastic, 32 rows at 1 warp)."""
    return (column_whole_possible(X, scheme, values) and X.dtype == torch.bfloat16
            and hadamard is not None and scheme.block[1] == 32)


# Whole blocks down a column read's memory rows (`_column_whole_kernel`), by rounding (stochastic
# or not): (rows, warps) of a program's tile, one column of blocks wide, the fastest of those timed
# on the H200 (docs/kernels-notes.md, v75). Rounded to nearest, 2 rows a thread: whole 32-element
# blocks in a thread, 111 registers (sm_90, triton 3.6.0: scripts/kernel_sass.py). Stochastically,
# 1 row a thread, for which Triton spreads a block over 4 threads, 8 elements each, joined by lane
# shuffles: 80 registers, faster than 2 rows of whole blocks a thread (168 registers).
COLUMN_WHOLE_TILES = {False: (64, 1), True: (128, 4)}


def square_column_read_transposed(X: torch.Tensor, scheme: Scheme, values: bool = False) -> bool:
    """Whether the kernel reads a column read of X — a transposed view: dgrad's weight, under
    128x128 blocks — as the row read of X.t(), the tensor as stored, and stores its codes and
    scales transposed: a square block of X is a block of X.t() transposed, with the same amax,
    scale and codes, so the bits are those of reading X. For byte codes of fp32-scale blocks
    (FP8 128x128), the codes stored from the 3D tile. Chosen by timing on the H200
    (docs/kernels-notes.md, v58): the FP8 128x128 codes of bf16 8192 x 14336 read down its
    columns 0.183 → 0.135 ms (8 warps), of fp32 14336 x 4096 0.097 → 0.077 ms (4 warps; 8
    took 0.116)."""
    br, bc = scheme.block
    return (br == bc > 1 and _column_read(X) and not values and scheme.elem.bits == 8
            and rule_of(scheme) == "amax")


def default_tile() -> tuple[int, int, int]:
    """(rows, columns, warps) of a 1 × bc-block tile: 32 × 128 at 4 warps, for values and codes,
    row reads and column reads (laid out as rows). On the H200 it was the fastest or within 2%
    of the fastest tile timed for MXFP8's and NVFP4's values (1–16% faster than the tiles
    before it: docs/kernels-notes.md, v24) and for FP8 1x128 and MXFP8 codes (5–13% faster
    than 16 × 128, and than 16 × 256 at 8 warps for column reads: v25, before the GPU's own FP8
    conversion, v35; v58 found no faster tile for these column reads). A square-block tile is
    one block row, with 8 warps from 64 × 128 elements up, else 4 (and 4 for fp32 read
    transposed, v58). Since v38 the codes of blocks with an fp32 scale (FP8 1x128) read along
    rows take `FP32_SCALE_ROW_TILE` instead (`tile_of` makes these choices)."""
    return 32, 128, 4


# FP8 1x128 codes read along rows: since the GPU converts to FP8 itself (v35), 16 rows a
# program were 5–9% faster than 32 on the H200 (bf16 8192 x 14336: 0.160 → 0.151 ms; fp32
# 4096 x 14336: 0.089 → 0.080 ms; docs/kernels-notes.md, v38); column reads keep 32 rows
FP32_SCALE_ROW_TILE = (16, 128, 4)


# A row read in lanes with whole blocks a thread (`row_read_whole`), by (bc, values): the fastest
# tile of 17 timed on the H200 for bf16 8192 x 14336 (docs/kernels-notes.md, v69, v70): MX codes
# 8 x 256 at 2 warps (a block a thread; for MXFP4 16 x 256 at 4 warps within 1%), NVFP4 codes
# 16 x 256 at 2 warps (four blocks a thread; 8 x 256 at 1 warp the same), NVFP4 values 8 x 256
# at 4 warps (MX values, not whole by default, take `default_tile` when asked for whole blocks)
WHOLE_TILES = {(32, False): (8, 256, 2), (16, False): (16, 256, 2), (16, True): (8, 256, 4)}


# Whole blocks a thread in an fp32 tile (`row_read_whole_fp32`), by bc: a block a thread, in tiles
# of 4 rows and 512 columns. On the H200, bf16 8192 x 14336, the fastest or within 1% of the
# fastest of the 34 (bc 16) or 25 (bc 32) tiles timed in every case `row_read_whole_fp32` takes;
# on 8192 x 4096 likewise among the five fastest of those (docs/kernels-notes.md, v71)
WHOLE_FP32_TILES = {16: (4, 512, 4), 32: (4, 512, 2)}


def tile_of(X: torch.Tensor, scheme: Scheme, values: bool = False, as_rows: bool = False,
            transposed: bool = False, lanes: bool = False, whole: bool = False) -> tuple[int, int, int | None]:
    """(rows, columns, warps) of the tile `quantize_rowblocks` quantizes X in by default, given its
    layout choices (`column_read_as_rows`, `square_column_read_transposed`, `row_read_in_lanes`,
    `column_read_in_lanes`, `row_read_whole`):
    `WHOLE_TILES` for a row read with whole blocks a thread; `default_tile`;
    `FP32_SCALE_ROW_TILE` for the codes of 1 × bc fp32-scale blocks not laid out as rows;
    `LANES_CODES_TILE` for codes of a row read worked two elements a word,
    `LANES_COLUMN_FP4_CODES_TILE` for FP4 codes of a column read so worked; a square-block tile is
    one block row, its warps None (the launch's `warps_for` its size) except 4 for fp32 read
    transposed."""
    br = scheme.block[0]
    if whole and not lanes:
        return WHOLE_FP32_TILES.get(scheme.block[1], default_tile())
    if whole:
        return WHOLE_TILES.get((scheme.block[1], values), default_tile())
    if lanes and not values and not as_rows:
        return LANES_CODES_TILE
    if lanes and not values and scheme.elem.bits == 4:
        return LANES_COLUMN_FP4_CODES_TILE
    if br > 1:
        return br, default_tile()[1], 4 if transposed and X.element_size() == 4 else None
    if not values and rule_of(scheme) == "amax" and not as_rows:
        return FP32_SCALE_ROW_TILE
    return default_tile()


# FP4 and FP6 codes of bf16 rows worked two elements a word: 16 × 256 elements, 2 warps. On the
# H200 the fastest of 31 tiles (8–64 rows, 64–256 columns, 2–8 warps) for MXFP4 and MXFP6 E2M3
# on 8192 x 14336 and 8192 x 4096 (MXFP4 0.0979 → 0.0932 ms and 0.0309 → 0.0301, MXFP6 0.1211
# → 0.1123 and 0.0370 → 0.0360 against `default_tile`'s; docs/kernels-notes.md, v65)
LANES_CODES_TILE = (16, 256, 2)
# FP4 codes of bf16 read down columns two rows a word: 64 × 128 elements, 4 warps, the fastest of
# the same 31 tiles on the H200 for MXFP4 on 8192 x 14336 and 8192 x 4096 read down their
# columns (0.1031 → 0.0895 ms and 0.0321 → 0.0297 against `default_tile`'s); for MXFP6 E2M3
# `default_tile` was within 2% of the fastest, 64 × 128 at 4 warps 9–14% slower than it, so
# FP6 keeps it (docs/kernels-notes.md, v66)
LANES_COLUMN_FP4_CODES_TILE = (64, 128, 4)


def warps_for(tile_r: int, tile_c: int) -> int:
    """A launch's warps where the caller names none: 8 from 64 × 128 elements a tile up, else 4."""
    return 8 if tile_r * tile_c >= 64 * 128 else 4


def quantize_rowblocks(X: torch.Tensor, scheme: Scheme, seed: torch.Tensor | None, *,
                       tile_r: int | None = None, tile_c: int | None = None, values: bool = False, hadamard=None,
                       num_warps: int | None = None, as_rows: bool | None = None,
                       transpose_first: bool | None = None, tensor_amax: torch.Tensor | None = None,
                       fp64: bool | None = None, transposed: bool | None = None, pairs: bool | None = None,
                       lanes: bool | None = None, whole: bool | None = None, whole_down: bool | None = None):
    """(codes, stored block scales, per-tensor decode scale or None) of the (R, C) matrix X.

    Codes and scales are stored as QuantizedTensor stores them: codes packed (fp4 two a byte,
    fp6 four in three bytes), scales as uint8 codes for E8M0 / E4M3, else fp32.
    values=True: instead of the codes, the (R, C) bf16 matrix of the dequantized values
    without the per-tensor scale — `dequantize_matrix(bf16, tensor_scale=False)` of the
    codes, bit for bit, where those values are exact in bf16 (the caller's condition).
    hadamard: a `Hadamard` the kernel applies to every block first (`hadamard_fusable`), as
    quantizing `hadamard.transform(X)` would.
    as_rows: lay a column read out as a row read (default: `column_read_as_rows`; the
    bits are the same either way).
    transpose_first: read a row-major copy of X made by the tiled transpose kernel (default:
    `column_read_transposed_first`; the same bits again).
    tile_r, tile_c, num_warps: the tile one program quantizes and its warps (default: `tile_of`;
    a square-block tile is one block row whatever tile_r says).
    fp64: divide by fp32 scales as products by fp64 reciprocals (default: `fp64_quotient`; the
    same bits either way).
    transposed: read a column read of square blocks as the row read of X.t() (default:
    `square_column_read_transposed`; the same bits again).
    pairs: load a column read laid out as rows two rows at a time (default: `column_read_in_pairs`;
    the same bits again).
    lanes: work a row read two elements a word, or a column read laid out as rows two rows a word
    (loaded in pairs) (default: `row_read_in_lanes`, `column_read_in_lanes`; the same bits again).
    whole: a row read in lanes with whole blocks in each thread (default: `row_read_whole`), or,
    not in lanes, the values of a row read with whole blocks a thread in an fp32 tile (default:
    `row_read_whole_fp32`); the same bits again.
    whole_down: the values of a column read with whole blocks down the memory's rows
    (default: `column_read_whole`; tile_r rows, one column of blocks, a program: default
    `COLUMN_WHOLE_TILES`, by rounding); the same bits again.
    tensor_amax: NVFP4's tensor amax (fp32, 0-d) where the caller has it already — that of X,
    or of its transform under `hadamard` (`two_amaxes`) — instead of a pass over X for it.
    """
    R, C = X.shape
    elem, (br, bc) = scheme.elem, scheme.block
    if hadamard is not None and not hadamard_fusable(scheme, hadamard, C):
        raise ValueError(f"a Hadamard transform of size {hadamard.size} cannot be fused into {scheme.name} "
                         f"blocks of {br}x{bc} over {C} columns")
    stochastic = seed is not None
    if whole_down is None:  # (not where the caller asks for a layout of `_rowblock_kernel`)
        whole_down = (transpose_first is not True and as_rows is None and not (pairs or lanes or whole)
                      and column_read_whole(X, scheme, values, hadamard, stochastic))
    elif whole_down and (transpose_first or as_rows is not None or lanes or whole or pairs
                         or not column_whole_possible(X, scheme, values)):
        raise ValueError("whole_down: the values of a bf16 or fp32 column read (not copied to rows first, not laid "
                         "out as rows, in lanes, pairs or whole blocks along rows) of 1 x bc blocks of floating-point "
                         "elements with power-of-two or two-level scales")
    if transpose_first is None:
        transpose_first = not whole_down and column_read_transposed_first(X, scheme, values, hadamard)
    if transpose_first and X.numel():
        from .transpose import transpose

        X = transpose(X.t())  # X.contiguous(), by tiles
    nb = -(-C // bc)
    scale_codes = scheme.scale_fmt.bits <= 8
    scales = torch.empty(-(-R // br), nb, dtype=torch.uint8 if scale_codes else torch.float32, device=X.device)
    if as_rows is None:
        as_rows = column_read_as_rows(X, scheme, hadamard)
    if transposed is None:
        transposed = square_column_read_transposed(X, scheme, values)
    if lanes is None:
        lanes = not whole_down and (
            row_read_in_lanes(X, scheme, values, hadamard, stochastic)
            or as_rows and pairs is not False and column_read_in_lanes(X, scheme, values, hadamard, stochastic))
    elif lanes and not (lanes_possible(X, scheme, values, hadamard, stochastic)
                        and (as_rows or not _column_read(X)) and pairs is not False):
        raise ValueError("lanes: a bf16 row read (an even number of columns, an even row stride, a start aligned to "
                         "four bytes) or column read laid out as rows and loaded in pairs (`pairs_possible`), on an "
                         "NVIDIA GPU of compute capability 9.0 or later (or in Triton's interpreter), of MX "
                         "floating-point (or NVFP4, read along rows) values or FP4/FP6 codes rounded to nearest, "
                         "without a transform")
    if whole is None:
        whole = not whole_down and (row_read_whole(X, scheme, values) if lanes else
                                    not as_rows and row_read_whole_fp32(X, scheme, values, hadamard, stochastic))
    elif whole and not (whole_possible(X, scheme, values) if lanes else
                        not as_rows and whole_fp32_possible(X, scheme, values)):
        raise ValueError("whole: a row read worked two elements a word (lanes), of values, FP4 codes or the FP6 "
                         "codes of 1 x 32 blocks over a multiple of 16 columns; or not in lanes, a bf16 or fp32 "
                         "row read of the values of 1 x bc blocks with power-of-two or two-level scales")
    if whole_down:  # one column of blocks a program
        (rows, warps), cols = COLUMN_WHOLE_TILES[stochastic], bc
    else:
        rows, cols, warps = tile_of(X, scheme, values, as_rows, transposed, lanes, whole)
    if br > 1:  # a square-block tile is one block row
        tile_r = br
    tile_r, tile_c, num_warps = tile_r or rows, tile_c or cols, num_warps or warps
    pack = elem.bits == 4 and not values
    # fp6: the kernel packs whole groups of sixteen codes into three 32-bit words where C is a
    # multiple of 16 (and the tile's width of 32); otherwise it writes a byte a code, which
    # `codes.pack` packs after it
    words = elem.bits == 6 and not values and C % 16 == 0 and tile_c % 32 == 0
    if values:
        codes = torch.empty(R, C, dtype=torch.bfloat16, device=X.device)
    else:
        width = (C + 1) // 2 if pack else 3 * C // 4 if words else C
        codes = torch.empty(R, width, dtype=torch.uint8, device=X.device)
    finish = pack_codes if elem.bits == 6 and not values and not words else lambda c, _: c
    s_dec, given_amax = None, tensor_amax
    tensor_amax = scales  # not read unless two-level
    if scheme.two_level:  # the tensor's amax (the kernel takes the tensor level from it, as
        # scaling.py does), and the decode scale s_dec the kernel stores
        if X.numel() == 0:  # as the reference: the tensor level of an amax of 0
            return codes, scales, two_level_tensor_scales(X.new_zeros(()), elem, scheme.scale_fmt)[1]
        if given_amax is not None:
            tensor_amax = given_amax.reshape(())
        elif hadamard is None:  # the max of |x| in one reduction: exact, NaN propagating
            tensor_amax = amax_by_kernel(X)
        else:  # the max over the transformed blocks, by the transform's own kernel
            tensor_amax = hadamard_amax(X, hadamard, as_rows=as_rows)
        s_dec = torch.empty((), dtype=torch.float32, device=X.device)
    if X.numel() == 0:
        return finish(codes, elem), scales, s_dec
    if whole_down:
        constants = _scheme_constants(scheme, rule_of(scheme), X.device)
        _column_whole_kernel[(cdiv(R, tile_r), nb)](
            _bits(X), seed if seed is not None else scales, codes, scales, R, C, X.stride(1), codes.stride(0), scales.stride(0),
            tensor_scales_ptr=tensor_amax, signs_ptr=hadamard.signs_tensor(X.device) if hadamard is not None else scales,
            h_scale=hadamard.scale if hadamard is not None else 1.0, s_dec_ptr=s_dec if s_dec is not None else scales,
            BC=bc, TILE_R=tile_r, SCALE_CODES=scale_codes, X_BF16=X.dtype == torch.bfloat16,
            H_STAGES=bc.bit_length() - 1 if hadamard is not None else 0,
            H_SPLIT=hadamard is not None and _interpreted(X), NATIVE_BF16=not _interpreted(X),
            VEC=max(tile_r // (32 * num_warps), 1), STOCHASTIC=stochastic, num_warps=num_warps, **constants)
        return codes, scales, s_dec
    if pairs is None:  # (a column read in lanes is loaded in pairs)
        pairs = as_rows and (lanes or column_read_in_pairs(X, scheme, tile_r))
    elif pairs and not (as_rows and pairs_possible(X, tile_r)):
        raise ValueError("pairs: a bf16 or fp32 column read laid out as rows, with an even number of rows, an "
                         "even column stride and a start aligned to two elements, in tiles of an even number "
                         "of rows")
    _launch(X, seed, codes.view(torch.int32) if words else codes, scales, scheme, rule_of(scheme), tensor_amax,
            scales, bc, 0, scale_codes, tile_r, tile_c, br, values, hadamard, s_dec, num_warps, as_rows, fp64,
            transposed, pairs, lanes, whole)
    return finish(codes, elem), scales, s_dec


HADAMARD_AMAX_WHOLE_TILE = (16, 512, 4)


def hadamard_amax_whole(X: torch.Tensor, as_rows: bool = False) -> bool:
    """Whether the pass for the amax of X's transform (`hadamard_amax`) reads X as an fp32 tile of
    whole blocks (WHOLE) by default, in `HADAMARD_AMAX_WHOLE_TILE`: a bf16 or fp32 row read."""
    return not as_rows and not _column_read(X) and X.dtype in (torch.bfloat16, torch.float32)


def hadamard_amax(X: torch.Tensor, hadamard, *, tile_r: int | None = None, tile_c: int | None = None,
                  num_warps: int | None = None, as_rows: bool | None = None,
                  whole: bool | None = None) -> torch.Tensor:
    """fp32 amax (0-d, NaN propagating) of X (R, C) with every 1 × hadamard.size block of its rows
    transformed (`hadamard.transform` of each block; C a multiple of the size): NVFP4's tensor
    amax under the transform, in one read. as_rows: a column read (a transposed view) laid out
    as rows (default: for a column read); whole: `hadamard_amax_whole`; tile_r, tile_c,
    num_warps: the tile a program reads (default: `HADAMARD_AMAX_WHOLE_TILE` for whole blocks,
    else `default_tile`)."""
    R, C = X.shape
    bc = hadamard.size
    if C % bc:
        raise ValueError(f"a {bc}-point transform of each block of a row needs a multiple of {bc} columns, not {C}")
    if as_rows is None:
        as_rows = _column_read(X)
    if whole is None:
        whole = hadamard_amax_whole(X, as_rows)
    elif whole and not hadamard_amax_whole(X, as_rows):
        raise ValueError("whole: a bf16 or fp32 row read")
    rows, cols, warps = HADAMARD_AMAX_WHOLE_TILE if whole else default_tile()
    tile_r, tile_c, num_warps = tile_r or rows, tile_c or cols, num_warps or warps
    bits = torch.zeros((), dtype=torch.int32, device=X.device)
    if X.numel():
        _hadamard_amax_kernel[(cdiv(R, tile_r), cdiv(C, tile_c))](
            _bits(X), bits, R, C, X.stride(0), X.stride(1), X.stride(0), hadamard.signs_tensor(X.device),
            hadamard.scale, BC=bc, TILE_R=tile_r, TILE_C=tile_c, STAGES=bc.bit_length() - 1,
            X_BF16=X.dtype == torch.bfloat16, AS_ROWS=as_rows, H_SPLIT=_interpreted(X), WHOLE=whole,
            num_warps=num_warps)
    return bits.view(torch.float32)


def _launch(X, seed, codes, scales, scheme: Scheme, rule: str, tensor_amax, amax, bc: int, amax_mode: int,
            scale_codes: bool, tile_r: int, tile_c: int, br: int = 1, values: bool = False, hadamard=None,
            s_dec=None, num_warps: int | None = None, as_rows: bool = False, fp64: bool | None = None,
            transposed: bool = False, pairs: bool = False, lanes: bool = False, whole: bool = False) -> None:
    """One launch of the kernel over X (R, C); `tensor_amax` (and `s_dec`, written) only by the
    two-level rule, `amax` only by the amax modes; fp64: the quotient by the fp64 reciprocal
    (default: `fp64_quotient`); transposed: X's square blocks read from X.t()
    (`square_column_read_transposed`), the launch over X.t() with X's codes and scales; pairs:
    `column_read_in_pairs`; lanes: two elements a word (`lanes_possible`, emulated in Triton's
    interpreter); whole: a row read with whole blocks a thread, in lanes (`row_read_whole`) or in
    an fp32 tile (`row_read_whole_fp32`)."""
    if transposed:
        X = X.t()
    R, C = X.shape
    elem = scheme.elem
    constants = _scheme_constants(scheme, rule, X.device)
    if codes.dtype == torch.int32:  # fp6 codes packed as words by the kernel (quantize_rowblocks)
        constants = {**constants, "PACK": 3}
    _rowblock_kernel[(cdiv(R, tile_r), cdiv(C, tile_c))](
        _bits(X), seed if seed is not None else scales, codes, scales, R, C, codes.shape[1], X.stride(0),
        X.stride(1), codes.stride(0), scales.stride(0), X.stride(0), tensor_scales_ptr=tensor_amax, amax_ptr=amax,
        signs_ptr=hadamard.signs_tensor(X.device) if hadamard is not None else scales,
        h_scale=hadamard.scale if hadamard is not None else 1.0, s_dec_ptr=s_dec if s_dec is not None else scales,
        BC=bc, TILE_R=tile_r, TILE_C=tile_c, STOCHASTIC=seed is not None, SCALE_CODES=scale_codes,
        AMAX_MODE=amax_mode, X_BF16=X.dtype == torch.bfloat16, BR=br,
        elem_table=code_table(elem, X.device) if values and elem.is_integer else X, VALUES=values,
        H_STAGES=bc.bit_length() - 1 if hadamard is not None else 0,
        AS_ROWS=as_rows, H_SPLIT=hadamard is not None and _interpreted(X),
        num_warps=num_warps or warps_for(tile_r, tile_c),
        FP64_QUOTIENT=rule == "amax" and (fp64_quotient(X, as_rows) if fp64 is None else fp64),
        # codes stored from the 3D tile where the blocks' scales are fp32 (FP8 1x128, 128x128,
        # per-row, per-tensor): on the H200 1x128 along bf16 rows 1.11x faster, 128x128 along
        # fp32 rows 1.07x, the one-read rows 1.09–1.13x, and 128x128 on bf16 1.17–1.29x (its
        # codes packed four at a time, which the 2D store made slower there); MX blocks were 0–2%
        # slower with it, so they keep the 2D store (docs/kernels-notes.md, v56 and v57)
        CODES_3D=rule == "amax", TRANSPOSED=transposed, NATIVE_BF16=values and not _interpreted(X), PAIRS=pairs,
        LANES=(2 if _interpreted(X) else 1) if lanes else 0, WHOLE=whole,
        TILE_STORE=whole and not lanes and values and whole_tile_store(scheme, seed is not None),
        **constants,
    )


@functools.cache
def _scheme_constants(scheme: Scheme, rule: str, device: torch.device) -> MappingProxyType:
    """The kernel's arguments that follow from the scheme, its rule and the device alone, made
    once: derived from the formats' descriptions, they took about a third of the host's time of
    a launch (docs/kernels-notes.md, v38), which the compiled steps pay for every cast. Shared
    by every launch, so read-only."""
    elem, fmt = scheme.elem, scheme.scale_fmt
    return MappingProxyType(dict(
        elem_max=float(elem.max), rcp_max=_reciprocal_of_max(elem.max), enc_numerator=float(fmt.max * elem.max),
        RULE=RULES[rule], KMIN=fmt.emin, KMAX=fmt.emax, EMAX_ELEM=elem.emax, PACK=2 if elem.bits == 4 else 1,
        MAX_VALUE=float(elem.max), **format_constants(elem, device)))


def rule_of(scheme: Scheme) -> str:
    """The kernel's scale rule (`RULES`) for a scheme."""
    return "two_level" if scheme.two_level else scheme.scale_rule


def fp64_quotient(X: torch.Tensor, as_rows: bool) -> bool:
    """Whether the kernel divides a tile of several fp32-scale blocks (FP8 1x128, per-row and
    per-tensor FP8 after their amax reduction) as x times each block's fp64 reciprocal, rounded
    once to fp32, rather than by div_rn: the same codes either way (`scaling.exact_reciprocal`).
    Chosen by timing on the H200 (docs/kernels-notes.md, v38): the product for 2-byte inputs and
    for column reads laid out as rows (FP8 1x128 codes of bf16 8192 x 14336: rows 0.151 → 0.149
    ms with 16-row tiles, columns 0.167 → 0.143 ms), div_rn for fp32 rows (fp32 4096 x 14336:
    0.080 ms against 0.084 by the product)."""
    return as_rows or X.element_size() == 2


def amax_supported(scheme: Scheme) -> bool:
    """One block per row or one for the tensor, fp32 scales (FP8 tensorwise, rowwise, delayed)."""
    return scheme.block in ((-1, -1), (1, -1)) and not scheme.two_level and scheme.scale_fmt.bits == 32


@triton.jit
def _column_codes_kernel(x_ptr, seed_ptr, out_ptr, scale_ptr, amax_ptr, R, C, sxc, sor, elem_max, rcp_max,
                         TILE_R: tl.constexpr, TILE_C: tl.constexpr, RULE: tl.constexpr, KMIN: tl.constexpr,
                         KMAX: tl.constexpr, EMAX_ELEM: tl.constexpr, STOCHASTIC: tl.constexpr, E: tl.constexpr,
                         M: tl.constexpr, BIAS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                         MAX_CODE: tl.constexpr, BITS: tl.constexpr, HAS_NAN: tl.constexpr,
                         NAN_CODE: tl.constexpr, IS_INT: tl.constexpr, X_BF16: tl.constexpr,
                         NATIVE_MAX: tl.constexpr):
    """One-byte codes of an (R, C) matrix whose rows are contiguous (element (r, c) at
    r + c · sxc), one scale per row from its amax at amax_ptr[r]: a program loads a tile as
    memory holds it, (TILE_C, TILE_R), computes its codes in that layout — `_rowblock_kernel`'s
    arithmetic: `_block_scale`, then x / scale or x × 2^−k, `_round_codes` — and transposes
    the bytes on chip, so that it stores the codes' rows along their length."""
    r = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    c = tl.program_id(1) * TILE_C + tl.arange(0, TILE_C)
    inside = (c[:, None] < C) & (r[None, :] < R)
    offsets = c[:, None] * sxc + r[None, :]
    x = _load_fp32(x_ptr + offsets, inside, X_BF16)
    amax = tl.load(amax_ptr + r, mask=r < R, other=0.0)
    scale, factor, _ = _block_scale(amax, elem_max, rcp_max, amax_ptr, 0.0, amax_ptr, RULE, KMIN, KMAX,
                                    EMAX_ELEM, M)
    if tl.program_id(1) == 0:  # the first column of tiles stores the rows' scales
        tl.store(scale_ptr + r, scale, mask=r < R)
    f = factor[None, :]
    if RULE == 0:  # an fp32 scale: the correctly rounded quotient
        v = tl.div_rn(x, f)
    else:  # by 2^−k, exact
        v = x * f
    v = tl.where(tl.abs(f) < float("inf"), v, 0.0)
    noise = 0
    if STOCHASTIC:
        noise = _seed_noise(seed_ptr, r[None, :], c[:, None], C)
    code = _round_codes(v, noise, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT, STOCHASTIC,
                        NATIVE_MAX)
    # transposed as int32, then narrowed: 9% faster on the H200 than narrowing first (one
    # layer's operands, docs/kernels-notes.md v27)
    tl.store(out_ptr + r[:, None] * sor + c[None, :], tl.trans(code).to(tl.uint8), mask=tl.trans(inside))


@triton.jit
def _column_amax_kernel(x_ptr, bits_ptr, R, C, sxc, TILE_R: tl.constexpr, TILE_C: tl.constexpr,
                        STEPS: tl.constexpr):
    """The amax of each row of an (R, C) bf16 matrix whose rows are contiguous (element (r, c)
    at r + c · sxc), as fp32 bits (NaN above inf), by an atomic max of each program's into
    bits_ptr[r] (int32, starting at 0). A program reads STEPS tiles of TILE_C columns × TILE_R
    rows as memory holds them and keeps an elementwise maximum of the bf16 magnitudes' bit
    patterns (as int16: ordered as the magnitudes, every NaN above inf), reduced once."""
    r = tl.program_id(0) * TILE_R + tl.arange(0, TILE_R)
    best = tl.zeros((TILE_C, TILE_R), dtype=tl.int16)
    for s in range(STEPS):
        c = (tl.program_id(1) * STEPS + s) * TILE_C + tl.arange(0, TILE_C)
        inside = (c[:, None] < C) & (r[None, :] < R)
        best = tl.maximum(best, tl.load(x_ptr + c[:, None] * sxc + r[None, :], mask=inside, other=0) & 0x7FFF)
    tl.atomic_max(bits_ptr + r, tl.max(best, axis=0).to(tl.int32) << 16, mask=r < R)


COLUMN_CODES_TILE = (128, 64, 4)  # (rows, columns, warps) of `_column_codes_kernel`
COLUMN_AMAX_TILE = (128, 16, 32)  # (rows, columns, steps) of `_column_amax_kernel`


def column_amaxes(X: torch.Tensor, *, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """fp32 amax of each row of the (R, C) bf16 matrix X whose rows are contiguous in memory (a
    column read), NaN propagating: `torch.linalg.vector_norm(X, inf, dim=1)`, in one read laid
    out for the transposed memory (17% faster than torch's reduction on the H200 over one
    layer's bf16 operands, docs/kernels-notes.md v27)."""
    if X.dtype != torch.bfloat16 or not _column_read(X):
        raise ValueError(f"column_amaxes takes a bf16 2-D view whose rows are contiguous, not {X.dtype} of "
                         f"strides {X.stride()}")
    R, C = X.shape
    tile_r, tile_c, steps = tile or COLUMN_AMAX_TILE
    bits = torch.zeros(R, dtype=torch.int32, device=X.device)
    if X.numel():
        _column_amax_kernel[(cdiv(R, tile_r), cdiv(C, tile_c * steps))](
            X.view(torch.int16), bits, R, C, X.stride(1), TILE_R=tile_r, TILE_C=tile_c, STEPS=steps)
    return bits.view(torch.float32)


@triton.jit
def _tensor_amax_kernel(x_ptr, amax_bits_ptr, N, BLOCK: tl.constexpr, X_BF16: tl.constexpr):
    """The largest |x| bit pattern of x_ptr[0:N] (NaN above inf) by an atomic max into
    *amax_bits_ptr (int32, starting at 0): each program takes the blocks of BLOCK elements
    pid, pid + programs, … in turn and keeps their maximum, so there is one atomic a program.
    bf16 (as int16 bits) is compared as its 15 magnitude bits, then shifted to fp32's place."""
    programs = tl.num_programs(0)
    offsets = tl.arange(0, BLOCK)
    best = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in tl.range(tl.program_id(0) * BLOCK, N, programs * BLOCK):
        at = start + offsets
        if X_BF16:
            bits = tl.load(x_ptr + at, mask=at < N, other=0).to(tl.int32) & 0x7FFF
        else:
            bits = tl.load(x_ptr + at, mask=at < N, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        best = tl.maximum(best, bits)
    top = tl.max(best, axis=0)
    tl.atomic_max(amax_bits_ptr, (top << 16) if X_BF16 else top)


# `_tensor_amax_kernel`'s BLOCK, warps and programs an SM at most, by dtype: 16 KiB a block for
# both; the fastest of six on an H200 (docs/kernels-notes.md, v55)
TENSOR_AMAX_TILE = {torch.bfloat16: (8192, 4, 4), torch.float32: (4096, 4, 8)}


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def amax_by_kernel(X: torch.Tensor, *, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """fp32 max of |x| over X (0-d), NaN where X holds a NaN: `torch.linalg.vector_norm(X,
    inf).float()`, for bf16 and fp32 by `_tensor_amax_kernel` over X's memory where X's
    elements fill it (contiguous, or the transposed view of a contiguous matrix), else by
    torch. A NaN comes back as the NaN pattern of largest magnitude in X, not necessarily
    torch's NaN; the callers treat every NaN alike. X empty: 0. tile: (BLOCK, warps, programs
    an SM), for timing (default `TENSOR_AMAX_TILE[X.dtype]`)."""
    dense = X.is_contiguous() or (X.dim() == 2 and X.t().is_contiguous())
    n = X.numel()
    if X.dtype in (torch.bfloat16, torch.float32) and dense:
        block, warps, per_sm = tile or TENSOR_AMAX_TILE[X.dtype]
        programs = min(cdiv(n, block), _sm_count(X.device) * per_sm)
        if n + programs * block < 2**31:  # the kernel's offsets, up to its last step past n, are int32
            bits = torch.zeros((), dtype=torch.int32, device=X.device)
            if n:
                flat = (X if X.is_contiguous() else X.t()).reshape(-1)
                _tensor_amax_kernel[(programs,)](_bits(flat), bits, n, BLOCK=block,
                                                 X_BF16=X.dtype == torch.bfloat16, num_warps=warps)
            return bits.view(torch.float32)
    return torch.linalg.vector_norm(X, ord=float("inf")).float()


def column_codes_supported(X: torch.Tensor, scheme: Scheme) -> bool:
    """Whether `quantize_with_amax` quantizes X's rows by `_column_codes_kernel`: one block per
    row, X's rows contiguous in memory (a column read: fp8_rowwise's column-wise copies), codes
    of one byte each before any packing (not 4-bit)."""
    return scheme.block == (1, -1) and _column_read(X) and scheme.elem.bits != 4


LONG_ROW = 8192  # rows from this length up, to ONE_READ_MAX, are quantized in one read (`rows_in_one_read`)
ONE_READ_MAX = 16384  # a program holds one row of up to this many elements, padded to a power of two
ONE_READ_ROWS, ONE_READ_WARPS = 1, 8  # a program's rows and warps: on the H200 one row at 8 warps was faster
# than at 4 or 16, and than two rows at 16 (docs/kernels-notes.md v27)


def rows_in_one_read(X: torch.Tensor, scheme: Scheme, amax: torch.Tensor | None = None) -> bool:
    """Whether `quantize_with_amax` quantizes X with one scale per row by one program a row
    (ONE_READ_ROWS) that holds the whole row — its amax, scale and codes from one read, as
    `_rowblock_kernel` does a 1 × bc block — instead of a reduction and then the kernel: rows
    read along their length, LONG_ROW to ONE_READ_MAX elements long (fp8_rowwise's SwiGLU
    operands, 14336 in Llama-3-8B), one-byte codes, no amax override."""
    return (scheme.block == (1, -1) and amax is None and X.dim() == 2 and X.stride(-1) == 1
            and LONG_ROW <= X.shape[1] <= ONE_READ_MAX and scheme.elem.bits != 4)


def quantize_with_amax(X: torch.Tensor, scheme: Scheme, seed: torch.Tensor | None,
                       amax: torch.Tensor | None = None, *, tile_r: int = 16, tile_c: int = 128,
                       tensor_amax: torch.Tensor | None = None, columns: bool | None = None,
                       column_tile: tuple[int, int, int] | None = None, block_amaxes: torch.Tensor | None = None):
    """(codes, fp32 scales) of the (R, C) matrix X with one block per row or one for all.

    One reduction gives the amax (per row or of the tensor, NaN propagating), then one kernel
    applies the scale rule and writes scales and codes. `amax` (delayed scaling's) makes the
    scales and codes instead, as in the reference: the scale of a block whose own amax is not
    finite is then stored NaN, its codes kept (a format with a NaN code: the caller sends the
    others to the reference). `tensor_amax`: X's own amax,
    given (0-d fp32), where X is one block: no reduction then; `block_amaxes`: its rows' own
    amaxes (or the one block's), given (fp32, one per row): no reduction for them either.

    Long rows read along their length (`rows_in_one_read`) take one program a row, in one read.
    Rows contiguous in memory (a transposed view, `column_codes_supported`) are quantized by
    `_column_codes_kernel`, which reads the tile as memory holds it and transposes the codes on
    chip, after `column_amaxes` where X is bf16 (columns=False: torch's reduction and the row
    kernel instead, the same bits; column_tile: the codes kernel's tile, for timing).
    """
    R, C = X.shape
    elem = scheme.elem
    per_row = scheme.block == (1, -1)
    rule = scheme.scale_rule if scheme.pow2 else "amax"
    if not columns and rows_in_one_read(X, scheme, amax):  # a program a row: amax, scale, codes
        codes = torch.empty(R, C, dtype=torch.uint8, device=X.device)
        scales = torch.empty(R, 1, dtype=torch.float32, device=X.device)
        if X.numel():
            bc = triton.next_power_of_2(C)
            _launch(X, seed, codes, scales, scheme, rule, scales, scales, bc, 0, False, ONE_READ_ROWS, bc,
                    num_warps=ONE_READ_WARPS)
        return codes, scales
    if columns is None:
        columns = column_codes_supported(X, scheme)
    elif columns and not column_codes_supported(X, scheme):
        raise ValueError(f"the column kernel takes one-byte codes of a view whose rows are contiguous, not "
                         f"{scheme.name} of strides {X.stride()}")
    inf = float("inf")
    if block_amaxes is not None:
        actual = block_amaxes
    elif columns and X.dtype == torch.bfloat16:
        actual = column_amaxes(X)
    elif per_row:
        actual = torch.linalg.vector_norm(X, ord=inf, dim=1)
    elif tensor_amax is not None:
        actual = tensor_amax
    else:
        actual = amax_by_kernel(X)
    actual = own = actual.float().reshape(-1)
    if amax is not None:
        actual = check_amax(amax, own).expand(own.shape).contiguous()
    codes = torch.empty(R, (C + 1) // 2 if elem.bits == 4 else C, dtype=torch.uint8, device=X.device)
    scales = torch.empty(R if per_row else 1, 1, dtype=torch.float32, device=X.device)
    if columns:
        rows, cols, warps = column_tile or COLUMN_CODES_TILE
        k = _scheme_constants(scheme, rule, X.device)
        _column_codes_kernel[(cdiv(R, rows), cdiv(C, cols))](
            _bits(X), seed if seed is not None else scales, codes, scales, actual, R, C, X.stride(1),
            codes.stride(0), k["elem_max"], k["rcp_max"], TILE_R=rows, TILE_C=cols,
            RULE=k["RULE"], KMIN=k["KMIN"], KMAX=k["KMAX"], EMAX_ELEM=k["EMAX_ELEM"],
            STOCHASTIC=seed is not None, X_BF16=X.dtype == torch.bfloat16, **format_constants(elem, X.device),
            num_warps=warps)
    else:
        _launch(X, seed, codes, scales, scheme, rule, scales, actual, tile_c, 1 if per_row else 2, False, tile_r,
                tile_c)
    if amax is not None:
        scales = nan_where_not_finite(scales, own.reshape(scales.shape))
    return codes, scales
