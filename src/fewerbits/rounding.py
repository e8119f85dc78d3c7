"""The reference cast: put every element of a tensor on a format's grid, in plain torch.

For a value x and a format with M mantissa bits, the grid spacing (quantum) at |x| is

    q = 2^(max(floor(log2 |x|), emin) − M)          emin: the format's lowest regular binade

so |x| = u · q with u a real number, and rounding means choosing an integer for u:

    nearest      round half to even                     (IEEE default; ties go to the even code)
    stochastic   floor(u) + [noise < u − floor(u)]      noise uniform on {0, 1, …, 2^24 − 1} / 2^24

Stochastic rounding rounds up with probability (x − lo) / (hi − lo), exactly whenever that
fraction is a multiple of 2^−24 (always for fp16/bf16/fp32 inputs landing in a normal binade of
the target; otherwise it is biased by less than 2^−24). The noise is counter-based: one seed is
drawn from an optional `torch.Generator` (so a seeded generator reproduces a draw bit for bit),
and element i of the tensor, in row-major order, gets the top 24 bits of

    mix((i mod 2^32) XOR seed)         mix: the 32-bit integer hash "lowbias32" of C. Wellons'
                                       hash-prospector (xorshift 16, × 0x7feb352d, xorshift 15,
                                       × 0x846ca68b, xorshift 16; a bijection of 32-bit words)

so a kernel computes each element's noise where it rounds it, from the seed and the element's
position, instead of reading a tensor of noise (`noise_bits` is the same function in torch).
One round of the hash: the seed is drawn uniformly from [0, 2^31), so each element's word
(i XOR seed) is uniform over 2^31 words and independent between draws, and the hash
decorrelates neighbouring positions; a second round (mix(mix(i) XOR seed), the definition
before v25 of docs/kernels-notes.md) cost the stochastic kernels 8–11% of their time on the
H200.

Then overflow: with `saturate=True` (the default) finite values above `max` and ±inf become
±max; with `saturate=False` they become ±inf (formats with inf) or NaN (fp8_e4m3). Formats with
neither (fp6, fp4, integers) cannot express an overflow, so `saturate=False` is an error there.

NaN stays NaN. For fp6, fp4 and the integers, which have no NaN code, the returned float32 is
still NaN (nothing is silently turned into a number) and `encode` refuses it; block-scaled
quantization instead stores a NaN *scale* for a block that holds NaN or ±inf (see quantize.py).
e8m0 is unsigned and has no zero: zero, negative values and NaN become NaN, positive values
below 2^−127 become 2^−127. Integers have no negative zero: −0.3 rounds to +0.

Every step above is exact in float32 for float32 (or bf16, fp16) inputs whenever the format's
grid spacings are float32 numbers, 2^-149 … 2^127 (every format here but e8m0): dividing by a
power of two, rounding to an integer and multiplying back lose nothing. Otherwise (float64
inputs, e8m0) the work is done in float64. `round_to_codes` goes from the rounded integer
straight to the bit code, (e + bias − 1) · 2^M + units, which also carries a mantissa that
rounded up into the next binade. The reference does not call `tensor.to(torch.float8_e4m3fn)`:
before torch 2.12 that cast gives NaN above 464 instead of saturating. Compiled graphs do,
after a clamp that makes it saturate (`native_fp8_codes`, the same bits).
"""

from __future__ import annotations

import math
import threading
from typing import Literal

import torch

from .formats import FloatFormat, get_format

Rounding = Literal["nearest", "stochastic"]
ROUNDINGS = ("nearest", "stochastic")
NOISE_BITS = 24  #: resolution of the stochastic-rounding noise
CHUNK_ELEMENTS = 1 << 18  #: elements per slice of the float64 work (see in_chunks)
NATIVE_FP8 = ("fp8_e4m3", "fp8_e5m2")  #: formats whose compiled codes come from torch's cast

_CONSTANTS: dict = {}


def device_constant(key, make, device: torch.device) -> torch.Tensor:
    """The tensor `make()` on `device`, built once per (key, device) and reused.

    Building a small tensor from Python values on a GPU is a host-to-device copy that waits
    for the whole stream; the hot paths (scale constants, code tables, Hadamard matrices) take
    their constants from here instead. Callers must not modify the result in place. While a
    graph is being traced the tensor is built afresh (the compiler folds it as a constant).
    A CUDA constant is built by another thread (`_built_apart`), so that one first asked for
    inside a compiled graph that CUDA graphs replay does not land in their memory pool.
    """
    if torch.compiler.is_compiling():
        return make().to(device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    found = _CONSTANTS.get((key, device))
    if found is None:
        found = _built_apart(make, device) if device.type == "cuda" else _built(make, device)
        _CONSTANTS[(key, device)] = found
    return found


def _built(make, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # usable by autograd later, whatever mode built it
        return make().to(device)


def _built_apart(make, device: torch.device) -> torch.Tensor:
    """`make()` on `device`, built by a thread of its own (on a CUDA device, on a stream of its
    own as well), finished before this returns; a CPU device is taken too, for the tests. Inductor's CUDA graphs (torch.compile's reduce-overhead) run a
    function's first calls with every allocation of the calling thread going to the graphs'
    pool, and fail when a tensor made there outlives the call without being an output ("tensor(s)
    in the cudagraph pool not tracked as outputs"): a cached constant would be one. Another
    thread allocates from the ordinary pool."""
    out: list = []

    def run():
        try:
            if device.type != "cuda":
                out.append(_built(make, device))
                return
            stream = torch.cuda.Stream(device)
            with torch.cuda.device(device), torch.cuda.stream(stream):
                out.append(_built(make, device))
            stream.synchronize()  # the copy done before any stream of the caller reads it
        except BaseException as e:  # raised again in the caller's thread
            out.append(e)

    thread = threading.Thread(target=run, name="fewerbits-constant")
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def check_float_tensor(x: torch.Tensor, what: str = "x") -> None:
    """TypeError unless `x` is a real floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.is_complex():
        raise TypeError(f"{what} must be a real floating-point tensor, got dtype {x.dtype}")


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")


# the two working dtypes: (integer view, mantissa bits, exponent bias)
_LAYOUT = {torch.float32: (torch.int32, 23, 127), torch.float64: (torch.int64, 52, 1023)}


def work_dtype(dtype: torch.dtype, fmt: FloatFormat) -> torch.dtype:
    """float32 where every rounding step for `fmt` is exact in it, float64 otherwise."""
    fits = fmt.emax + 1 - fmt.man_bits <= 127 and fmt.emin - fmt.man_bits >= -149
    return torch.float32 if fits and dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float64


def exponent_of(mag: torch.Tensor) -> torch.Tensor:
    """floor(log2 |v|) from the exponent field of a float32/float64 tensor (−bias for 0 and
    subnormals, which every caller clamps up to the format's emin)."""
    int_t, man, bias = _LAYOUT[mag.dtype]
    return ((mag.view(int_t) >> man) & (2 * bias + 1)) - bias


def exp2(k: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """2^k (float32 or float64) for integer k, built from the bit pattern: exact, subnormals too."""
    int_t, man, bias = _LAYOUT[dtype]
    k = k.to(int_t)
    normal = (k + bias) << man
    subnormal = torch.ones_like(k) << (k + bias - 1 + man).clamp(0, man - 1)
    return torch.where(k > -bias, normal, subnormal).view(dtype)


def draw_seed(device, generator: torch.Generator | None) -> torch.Tensor:
    """A stochastic-rounding seed: an int64 0-d tensor on `device`, uniform on [0, 2^31), drawn
    from `generator` (the device's default generator if None). It stays on the device."""
    return torch.randint(0, 1 << 31, (), generator=generator, device=device, dtype=torch.int64)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (see the module docstring) of int32 x, the 32-bit words as int32: products
    wrap modulo 2^32 and right shifts are made logical by masks. Works in place on x."""
    x ^= (x >> 16) & 0xFFFF
    x *= 0x7FEB352D
    x ^= (x >> 15) & 0x1FFFF
    x *= 0x846CA68B - (1 << 32)  # as an int32
    x ^= (x >> 16) & 0xFFFF
    return x


def noise_bits(seed: torch.Tensor, shape) -> torch.Tensor:
    """The noise of `seed` (from `draw_seed`) for a tensor of `shape`: int32 on [0, 2^24), element
    i in row-major order the top 24 bits of mix32((i mod 2^32) ^ seed)."""
    shape = tuple(shape)
    n = math.prod(shape)
    if n < 1 << 31:
        i = torch.arange(n, device=seed.device, dtype=torch.int32)
    else:  # i mod 2^32, as an int32
        i = ((torch.arange(n, device=seed.device) & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
        i = i.to(torch.int32)
    x = mix32(i ^ seed.to(torch.int32))
    return ((x >> (32 - NOISE_BITS)) & ((1 << NOISE_BITS) - 1)).reshape(shape)


def draw_noise(shape, device, generator: torch.Generator | None) -> torch.Tensor:
    """Stochastic-rounding noise as int32 on [0, 2^24) (noise value = bits / 2^24): the noise of
    one seed drawn from `generator`."""
    return noise_bits(draw_seed(device, generator), shape)


def in_chunks(fn, *tensors: torch.Tensor | None) -> torch.Tensor:
    """fn over flat slices of equally shaped tensors (None passes through), re-assembled.

    Elementwise float64 work on ~2^18 elements at a time stays in cache and avoids a page fault
    per temporary: about ten times faster on a CPU than one pass over a 4096x4096 tensor.
    """
    shape = tensors[0].shape
    flats = [t.reshape(-1) if t is not None else None for t in tensors]
    n = flats[0].numel()
    if n <= CHUNK_ELEMENTS or torch.compiler.is_compiling():  # a compiled graph fuses instead
        return fn(*flats).reshape(shape)
    parts = [
        fn(*(f[i : i + CHUNK_ELEMENTS] if f is not None else None for f in flats))
        for i in range(0, n, CHUNK_ELEMENTS)
    ]
    return torch.cat(parts).reshape(shape)


def _round_units(mag: torch.Tensor, fmt: FloatFormat, noise: torch.Tensor | None):
    """(binade e, rounded integer units, quantum) with |v| ≈ units · quantum, quantum = 2^(e − M)."""
    # Clamp the binade into [emin, emax + 1]: below emin the spacing is the subnormal one;
    # anything in binade emax + 1 or above overflows whatever it rounds to.
    e = exponent_of(mag).clamp(fmt.emin, fmt.emax + 1)
    quantum = exp2(e - fmt.man_bits, mag.dtype)
    units = mag / quantum  # exact: division by a power of two
    if noise is None:
        units = torch.round(units)  # half to even
    else:
        low = torch.floor(units)
        units = low + (noise.to(mag.dtype) * 2.0**-NOISE_BITS < units - low).to(mag.dtype)
    return e, units, quantum


def round_to_format(
    v: torch.Tensor,
    fmt: FloatFormat,
    *,
    noise: torch.Tensor | None = None,
    saturate: bool = True,
) -> torch.Tensor:
    """Round a float32/float64 tensor onto `fmt`'s grid (same dtype out; see `work_dtype`).

    noise: int32 bits from `draw_noise` (stochastic rounding), or None (round to nearest even).
    """
    _, units, quantum = _round_units(v.abs(), fmt, noise)
    r = units * quantum
    if not fmt.has_zero:  # e8m0: the smallest value stands in for everything below it
        r = r.clamp(min=fmt.min_subnormal)

    over = r > fmt.max  # includes |v| = inf; NaN compares False
    if saturate:
        r = torch.where(over, fmt.max, r)
    else:
        r = torch.where(over, torch.inf if fmt.has_inf else torch.nan, r)

    if fmt.is_integer:  # two's complement has no negative zero
        r = torch.where(r == 0, 0.0, torch.copysign(r, v))
    elif fmt.signed:
        r = torch.copysign(r, v)
    else:
        r = torch.where(v > 0, r, torch.nan)
    return torch.where(torch.isnan(v), v, r)  # NaN keeps its sign bit


def check_code_width(fmt: FloatFormat) -> None:
    if fmt.bits > 8:
        raise ValueError(
            f"{fmt.name} has {fmt.bits} bits; codes are uint8, for formats of at most 8 bits "
            f"(for {fmt.name}, cast and convert to its torch dtype instead)"
        )


def round_to_codes(v: torch.Tensor, fmt: FloatFormat, *, noise: torch.Tensor | None = None,
                   nan_free: bool = False) -> torch.Tensor:
    """uint8 codes of `v` rounded onto `fmt` (saturating): the codes of round_to_format(v).

    NaN becomes the format's NaN code; a format without one refuses NaN (ValueError).
    nan_free: the caller knows v holds no NaN (the quantizer's element pass: a block with NaN
    has a NaN scale and is zeroed first), so compiled graphs need not test for it.
    """
    check_code_width(fmt)
    if (noise is None and v.dtype == torch.float32 and fmt.name in NATIVE_FP8 and fmt.torch_dtype is not None
            and torch.compiler.is_compiling()):
        return native_fp8_codes(v, fmt, nan_free=nan_free)
    nan = torch.isnan(v)
    if not fmt.has_nan and not torch.compiler.is_compiling() and bool(nan.any()):
        raise ValueError(f"{fmt.name} has no NaN code, and the input holds NaN")
    mag = v.abs()
    finite = torch.isfinite(mag)
    e, units, _ = _round_units(torch.where(finite, mag, 0.0), fmt, noise)
    # magnitude code = (e + bias − 1) · 2^M + units: exponent field and mantissa at once
    units = units.clamp(max=2.0 ** (fmt.man_bits + 1))  # more than this overflows anyway
    code = (e + (fmt.bias - 1)) * (1 << fmt.man_bits) + units.to(e.dtype)
    code = torch.where(finite, code, fmt.max_code).clamp(0, fmt.max_code)  # saturate
    if fmt.is_integer:
        code = torch.where(torch.signbit(v), -code, code) & ((1 << fmt.bits) - 1)
    elif fmt.signed:
        code = code | (torch.signbit(v).to(code.dtype) << (fmt.exp_bits + fmt.man_bits))
    else:  # e8m0: zero and negative values have no code
        code = torch.where(v > 0, code, fmt.nan_code)
    if fmt.has_nan:
        nan_code = fmt.nan_code | (1 << (fmt.exp_bits + fmt.man_bits) if fmt.signed else 0)
        code = torch.where(nan & torch.signbit(v), nan_code, torch.where(nan, fmt.nan_code, code))
    return code.to(torch.uint8)


def native_fp8_codes(v: torch.Tensor, fmt: FloatFormat, *, nan_free: bool = False) -> torch.Tensor:
    """round_to_codes(v, fmt) for float32 v and an FP8 format, through torch's own conversion.

    The conversion rounds to nearest even, as the reference does; clamping to ±max first makes
    it saturate on every torch version, and NaN, whose sign a GPU's conversion may drop, gets
    the reference's code explicitly (unless the caller promises no NaN: the test and the
    selects cost a kernel that also writes the transposed codes as much as the rest of it,
    docs/kernels-notes.md v14). The same bits (tests/test_cast.py), in a few operations
    that a compiler fuses into its neighbours: compiled graphs take this path, whose cast is
    one instruction on the GPU instead of the reference's integer arithmetic.

    The clamp is written as two selects, `v > max` and `v < −max`, rather than `clamp`: the same
    values for every input (NaN fails both comparisons and passes unchanged, as clamp passes
    it), but inductor writes clamp's bounds as NaN-propagating maxima and minima, a comparison
    for NaN each, that a select does without: in the SASS of inductor's kernel for the SwiGLU's
    backward with its two gradients' casts (sm_90), 103 instructions an element → 88
    (docs/kernels-notes.md, v85).
    """
    code = torch.where(v > fmt.max, fmt.max, torch.where(v < -fmt.max, -fmt.max, v))
    code = code.to(fmt.torch_dtype).view(torch.uint8)
    if nan_free:
        return code
    sign_bit = 1 << (fmt.exp_bits + fmt.man_bits)
    nan_code = torch.where(torch.signbit(v), fmt.nan_code | sign_bit, fmt.nan_code).to(torch.uint8)
    return torch.where(torch.isnan(v), nan_code, code)


def cast(
    x: torch.Tensor,
    fmt: str | FloatFormat,
    *,
    rounding: Rounding = "nearest",
    saturate: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Round `x` onto the grid of `fmt`; returns a float32 tensor of x's shape.

    rounding: "nearest" (round half to even) or "stochastic" (up with probability
    (x − lo)/(hi − lo); reproducible with `generator`). saturate: finite overflow and ±inf go to
    ±max (default); otherwise to ±inf or NaN, for formats that have them. See the module
    docstring for NaN and for e8m0.
    """
    fmt = get_format(fmt)
    check_float_tensor(x)
    check_rounding(rounding)
    if not saturate and not (fmt.has_inf or fmt.has_nan):
        raise ValueError(
            f"{fmt.name} has neither inf nor NaN, so an overflow cannot be represented: "
            "use saturate=True"
        )
    noise = draw_noise(x.shape, x.device, generator) if rounding == "stochastic" else None
    dtype = work_dtype(x.dtype, fmt)

    def rounded(v, bits):
        return round_to_format(v.to(dtype), fmt, noise=bits, saturate=saturate).float()

    return in_chunks(rounded, x.detach(), noise)
