"""The reference cast against ml_dtypes, bit for bit: every bf16 pattern and > 1 M fp32 values."""

import numpy as np
import pytest
import torch

from fewerbits import FORMATS, cast, encode
from conftest import CAST_FORMATS, ORACLE, all_bf16_values, assert_same_bits, oracle_cast

N_RANDOM = 1_000_000
NONSATURATING = [n for n in CAST_FORMATS if FORMATS[n].has_inf or FORMATS[n].has_nan]


def check_against_oracle(x: np.ndarray, name: str, saturate: bool) -> None:
    """cast() and, for ≤ 8-bit formats, encode() of x agree with ml_dtypes bit for bit."""
    fmt = FORMATS[name]
    got = cast(torch.from_numpy(x), name, saturate=saturate).numpy()
    expected = oracle_cast(x, name, saturate)
    nan_in = np.isnan(x)
    if not fmt.has_nan:
        # no NaN code: ml_dtypes writes 0, fewerbits keeps NaN (documented); compare the rest
        assert np.isnan(got[nan_in]).all()
        x, got, expected = x[~nan_in], got[~nan_in], expected[~nan_in]
    assert_same_bits(got, expected, x)
    if fmt.bits <= 8 and saturate:
        codes = encode(torch.from_numpy(x), name).numpy()
        with np.errstate(invalid="ignore"):
            oracle_codes = np.clip(x, -fmt.max, fmt.max).astype(ORACLE[name]).view(np.uint8)
        finite = ~np.isnan(x)
        assert np.array_equal(codes[finite], oracle_codes[finite])
        assert all(np.isnan(fmt.decode_code(int(c))) for c in codes[~finite])


def folded_bf16(name: str) -> np.ndarray:
    """Every finite bf16 mantissa and sign, with the exponent folded into the format's range.

    Exponents run from three binades below the smallest subnormal to two above max, so every
    rounding case (ties included), the subnormal range, underflow and overflow are all hit.
    """
    fmt = FORMATS[name]
    bits = np.arange(1 << 16, dtype=np.uint32)
    sign = np.where(bits >> 15, -1.0, 1.0)
    exp_field = ((bits >> 7) & 0xFF).astype(np.int64)
    mant = (bits & 0x7F) / 128.0
    lo = fmt.emin - fmt.man_bits - 3
    span = fmt.emax + 3 - lo
    e = lo + exp_field % span
    return (sign * np.ldexp(1.0 + mant, e)).astype(np.float32)


@pytest.mark.parametrize(
    "name, saturate", [(n, True) for n in CAST_FORMATS] + [(n, False) for n in NONSATURATING]
)
def test_every_bf16_pattern(name, saturate):
    check_against_oracle(all_bf16_values(), name, saturate)


@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_every_bf16_pattern(saturate):
    """e8m0 (unsigned, no zero) against ml_dtypes, but for fp32 subnormals in (2^-127, 2^-126).

    There ml_dtypes (and torch's own float8_e8m0fnu cast) round every value above 2^-127 up to
    2^-126, although 2^-127 is nearer; fewerbits rounds to nearest, checked separately.
    """
    x = all_bf16_values()
    quirk = (np.abs(x) > 2.0**-127) & (np.abs(x) < 1.5 * 2.0**-127)
    check_against_oracle(x[~quirk], "e8m0", saturate)
    got = cast(torch.from_numpy(x[quirk & (x > 0)]), "e8m0")
    assert (got == 2.0**-127).all() and got.numel() > 0


@pytest.mark.parametrize("name", CAST_FORMATS)
def test_bf16_patterns_folded_into_range(name):
    x = folded_bf16(name)
    check_against_oracle(x, name, saturate=True)
    if name in NONSATURATING:
        check_against_oracle(x, name, saturate=False)


def grid_midpoints(name: str, rng) -> np.ndarray:
    """Exact ties between neighbouring values of the format, and fp32 neighbours of each tie."""
    fmt = FORMATS[name]
    if fmt.bits <= 8:
        grid = np.array(sorted(v for v in fmt.code_values() if np.isfinite(v) and v >= 0))
        top = fmt.max + 2.0 ** (fmt.emax - fmt.man_bits)  # the next grid value past max
        grid = np.append(grid, top)
    else:  # random grid values and their successors
        codes = rng.integers(0, 0x7F00 if name == "bf16" else 0x7C00, 200_000).astype(np.uint16)
        grid = codes.view(ORACLE[name]).astype(np.float64)
        succ = (codes + 1).view(ORACLE[name]).astype(np.float64)
        grid = np.concatenate([grid, succ])
        grid.sort()
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), (grid[:-1] + grid[1:]) / 2)  # exact ties
    near = [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))]
    both = np.concatenate(near)
    return np.concatenate([both, -both])


def boundary_values(name: str) -> np.ndarray:
    """The subnormal and overflow boundaries, each with its fp32 neighbours."""
    f = FORMATS[name]
    points = np.array(
        [0.0, f.min_subnormal / 2, f.min_subnormal, 1.5 * f.min_subnormal,
         f.min_normal - f.min_subnormal / 2, f.min_normal, f.max,
         f.max + 2.0 ** (f.emax - f.man_bits - 1)],
        dtype=np.float32,
    )
    up, down = np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))
    v = np.concatenate([points, up, down])
    return np.concatenate([v, -v])


def random_fp32(name: str, n: int, rng) -> np.ndarray:
    """n fp32 values with random sign and 23-bit mantissa, exponents spread across the range."""
    f = FORMATS[name]
    lo = max(f.emin - f.man_bits - 4, -150)
    hi = min(f.emax + 3, 127)
    e = rng.integers(lo, hi + 1, n)
    mant = rng.integers(0, 1 << 23, n) / float(1 << 23)
    sign = np.where(rng.integers(0, 2, n) == 1, -1.0, 1.0)
    return (sign * np.ldexp(1.0 + mant, e)).astype(np.float32)


@pytest.mark.parametrize("name", CAST_FORMATS)
def test_million_random_values_ties_and_boundaries(name, rng):
    x = np.concatenate(
        [random_fp32(name, N_RANDOM, rng), grid_midpoints(name, rng), boundary_values(name)]
    )
    assert x.size >= N_RANDOM
    check_against_oracle(x, name, saturate=True)
    if name in NONSATURATING:
        check_against_oracle(x, name, saturate=False)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_integers_round_half_even_and_saturate(name, rng):
    fmt = FORMATS[name]
    x = np.concatenate([
        rng.normal(0, 2 * fmt.max, 200_000).astype(np.float32),
        np.arange(-2 * fmt.max, 2 * fmt.max, 0.5, dtype=np.float32),  # every half-integer tie
        np.array([np.inf, -np.inf], dtype=np.float32),
    ])
    expected = np.clip(np.round(x), -fmt.max, fmt.max) + 0.0  # numpy rounds half to even; no -0
    assert_same_bits(cast(torch.from_numpy(x), name), expected.astype(np.float32), x)


def test_tf32_and_fp32(rng):
    x = np.concatenate([random_fp32("tf32", 300_000, rng), all_bf16_values()])
    x = x[np.isfinite(x)]
    bits = x.view(np.uint32).astype(np.uint64)
    # round half to even at mantissa bit 13, integer arithmetic: an independent oracle
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
    expected = rounded.astype(np.uint32).view(np.float32)
    assert_same_bits(cast(torch.from_numpy(x), "tf32", saturate=False), expected, x)
    t = torch.from_numpy(x)
    assert torch.equal(cast(t, "fp32"), t)
    assert cast(torch.tensor([float("inf")]), "fp32").item() == FORMATS["fp32"].max


def test_torch_half_inputs_and_float64():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, dtype=torch.float64, generator=gen) * 100
    # float64 is rounded once: an integer oracle rounds the 52-bit mantissa to 7 bits, half to even
    bits = x.numpy().view(np.uint64)
    dropped = np.uint64(45)
    rounded = (bits + np.uint64((1 << 44) - 1) + ((bits >> dropped) & np.uint64(1))) & ~np.uint64((1 << 45) - 1)
    assert np.array_equal(cast(x, "bf16").double().numpy(), rounded.view(np.float64))
    # torch and ml_dtypes go through float32 first, and round twice: 1 + 2^-8 + 2^-30 is above
    # the tie between 1 and 1 + 2^-7, but float32 drops the 2^-30 and the tie goes to even
    v = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
    assert cast(v, "bf16").item() == 1 + 2**-7 and v.to(torch.bfloat16).item() == 1.0
    assert torch.equal(cast(x.half(), "fp16"), x.half().float())
    assert torch.equal(cast(x.bfloat16(), "fp8_e4m3"), cast(x.bfloat16().float(), "fp8_e4m3"))


def test_saturation_versus_overflow():
    x = torch.tensor([464.0, 464.1, 1e9, -float("inf"), float("nan")])
    assert cast(x, "fp8_e4m3").tolist()[:4] == [448.0, 448.0, 448.0, -448.0]
    assert torch.isnan(cast(x, "fp8_e4m3", saturate=False)[1:3]).all()
    assert cast(x, "fp8_e4m3", saturate=False)[0] == 448.0  # 464 is a tie, and rounds to even
    e5 = cast(x, "fp8_e5m2", saturate=False)
    assert e5[2] == float("inf") and e5[3] == -float("inf") and torch.isnan(e5[4])
    for name in ("fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"):
        with pytest.raises(ValueError, match="neither inf nor NaN"):
            cast(x, name, saturate=False)


def test_nan_without_nan_code_stays_nan_and_encode_refuses():
    x = torch.tensor([1.0, float("nan")])
    assert torch.isnan(cast(x, "fp4_e2m1")[1]) and cast(x, "fp4_e2m1")[0] == 1.0
    with pytest.raises(ValueError, match="no NaN code"):
        encode(x, "fp4_e2m1")


def test_non_contiguous_and_shapes():
    x = torch.randn(64, 48) * 10
    assert torch.equal(cast(x.t(), "fp8_e4m3"), cast(x.t().contiguous(), "fp8_e4m3"))
    assert cast(torch.empty(0, 3), "fp4_e2m1").shape == (0, 3)
    assert cast(torch.tensor(2.7), "fp4_e2m1").item() == 3.0


def test_bad_inputs():
    with pytest.raises(TypeError, match="floating-point"):
        cast(torch.arange(4), "fp8_e4m3")
    with pytest.raises(TypeError, match="floating-point"):
        cast(torch.zeros(2, dtype=torch.complex64), "fp8_e4m3")
    with pytest.raises(TypeError, match="torch.Tensor"):
        cast([1.0, 2.0], "fp8_e4m3")
    with pytest.raises(ValueError, match="unknown rounding"):
        cast(torch.zeros(2), "fp8_e4m3", rounding="up")


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_native_fp8_codes_are_the_reference_codes(name, rng):
    """Compiled graphs take FP8 codes from torch's conversion (rounding.native_fp8_codes): the
    reference's codes for every bf16 pattern, random fp32 values, ties and their neighbours,
    the boundaries, ±inf and NaN of both signs; where finite, ml_dtypes' codes of the clipped
    value as well; and the same codes compiled by inductor (its saturation by two selects)."""
    from fewerbits.rounding import native_fp8_codes, round_to_codes

    fmt = FORMATS[name]
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    x = np.concatenate([all_bf16_values(), random_fp32(name, N_RANDOM, rng), grid_midpoints(name, rng),
                        boundary_values(name), np.array([np.inf, -np.inf, 1e38, -1e38], np.float32), nans])
    v = torch.from_numpy(x)
    got = native_fp8_codes(v, fmt)
    assert got.dtype == torch.uint8 and torch.equal(got, round_to_codes(v, fmt))
    finite = np.isfinite(x)
    oracle = np.clip(x[finite], -fmt.max, fmt.max).astype(ORACLE[name]).view(np.uint8)
    assert np.array_equal(got.numpy()[finite], oracle)
    assert got[torch.isnan(v) & torch.signbit(v)].unique().tolist() == [fmt.nan_code | 0x80]
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda t: native_fp8_codes(t, fmt), fullgraph=True)(v)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, got)


def test_device_constants_are_built_once_by_another_thread():
    """A CUDA constant is built by a thread of its own, so that one first asked for inside a
    function that inductor replays as CUDA graphs does not land in the graphs' memory pool, which
    takes every allocation of the calling thread during the function's first calls (the helper
    runs on a CPU device here; tests/test_cuda.py trains mxfp4 and nvfp4 under the graphs)."""
    import threading

    from fewerbits.rounding import _built_apart, device_constant

    seen = []

    def make():
        seen.append(threading.get_ident())
        return torch.arange(4, dtype=torch.float32)

    got = _built_apart(make, torch.device("cpu"))
    assert torch.equal(got, torch.arange(4.0)) and seen and seen[0] != threading.get_ident()
    with torch.inference_mode():  # the thread builds it outside inference mode, as before
        assert not _built_apart(make, torch.device("cpu")).is_inference()

    def fails():
        raise ValueError("no table")

    with pytest.raises(ValueError, match="no table"):  # raised in the caller's thread
        _built_apart(fails, torch.device("cpu"))
    key = ("a test constant", len(seen))
    first = device_constant(key, make, torch.device("cpu"))
    assert device_constant(key, make, torch.device("cpu")) is first and len(seen) == 3
