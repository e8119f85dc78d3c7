"""Formats: derived limits against torch.finfo, ml_dtypes.finfo and DESIGN.md §3; every code."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fewerbits import FORMATS, FloatFormat, decode, encode, get_format
from conftest import ORACLE, SMALL_FORMATS, assert_same_bits

TORCH_DTYPES = [n for n, f in FORMATS.items() if f.torch_dtype is not None and not f.is_integer]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_limits_equal_torch_finfo(name):
    fmt = FORMATS[name]
    fi = torch.finfo(fmt.torch_dtype)
    assert fmt.bits == fi.bits
    assert fmt.max == fi.max
    assert fmt.min_normal == fi.smallest_normal == fi.tiny
    assert fmt.eps == fi.eps


def test_int8_matches_iinfo_but_is_symmetric():
    fmt, ii = FORMATS["int8"], torch.iinfo(torch.int8)
    assert (fmt.bits, fmt.max) == (ii.bits, ii.max)
    assert fmt.min_subnormal == 1.0 and FORMATS["int4"].max == 7


@pytest.mark.parametrize("name", [n for n in ORACLE if n not in ("int8", "int4", "fp16")])
def test_limits_equal_ml_dtypes_finfo(name):
    fmt, fi = FORMATS[name], ml_dtypes.finfo(ORACLE[name])
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)


# DESIGN.md §3: bias, max, min normal, min subnormal, inf, NaN: the spec the derivation must meet.
DESIGN_TABLE = {
    "fp8_e4m3": (7, 448, 2**-6, 2**-9, False, True),
    "fp8_e5m2": (15, 57344, 2**-14, 2**-16, True, True),
    "fp6_e3m2": (3, 28, 2**-2, 2**-4, False, False),
    "fp6_e2m3": (1, 7.5, 1, 2**-3, False, False),
    "fp4_e2m1": (1, 6, 1, 0.5, False, False),
    "e8m0": (127, 2**127, 2**-127, 2**-127, False, True),
}


@pytest.mark.parametrize("name", DESIGN_TABLE)
def test_limits_match_design_table(name):
    f = FORMATS[name]
    assert (f.bias, f.max, f.min_normal, f.min_subnormal, f.has_inf, f.has_nan) == DESIGN_TABLE[name]


def test_e2m1_grid_and_emax():
    values = sorted({v for v in FORMATS["fp4_e2m1"].code_values()})
    assert values == [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    emax = {n: FORMATS[n].emax for n in ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")}
    assert emax == {"fp8_e4m3": 8, "fp8_e5m2": 15, "fp6_e3m2": 4, "fp6_e2m3": 2, "fp4_e2m1": 2}


def test_wide_formats_and_binades():
    assert FORMATS["fp32"].max == float(np.finfo(np.float32).max)
    assert FORMATS["fp32"].min_subnormal == 2.0**-149
    assert FORMATS["tf32"].bits == 19 and FORMATS["tf32"].eps == 2.0**-10
    assert FORMATS["tf32"].max == (2 - 2**-10) * 2.0**127
    assert math.isclose(FORMATS["fp8_e4m3"].binades, math.log2(448 / 2**-9))


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_decode_every_code_matches_oracle(name):
    fmt = FORMATS[name]
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    expected = codes.view(ORACLE[name]).astype(np.float32)  # int8, int4: two's complement
    got = decode(torch.from_numpy(codes), fmt)
    assert got.dtype == torch.float32
    assert_same_bits(got, expected, codes)


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_encode_inverts_decode(name):
    fmt = FORMATS[name]
    codes = torch.arange(1 << fmt.bits, dtype=torch.uint8)
    values = decode(codes, fmt)
    keep = torch.isfinite(values)  # encode saturates: ±inf codes come back as ±max
    if fmt.is_integer:  # the two's-complement code -2^(bits-1) lies outside the symmetric range
        keep &= values.abs() <= fmt.max
    assert torch.equal(encode(values[keep], fmt), codes[keep])


def test_nan_and_inf_codes():
    e4m3, e5m2, e8m0 = FORMATS["fp8_e4m3"], FORMATS["fp8_e5m2"], FORMATS["e8m0"]
    x = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert encode(x[:1], e4m3).item() == 0x7F
    assert encode(x, e5m2).tolist() == [0x7E, 0x7B, 0xFB]  # encode saturates ±inf to ±max
    assert e5m2.inf_code == 0x7C and math.isinf(e5m2.decode_code(0x7C))
    assert math.isnan(e8m0.decode_code(0xFF)) and e8m0.decode_code(0) == 2.0**-127


def test_unknown_format_lists_valid_names():
    with pytest.raises(ValueError, match="fp8_e4m3.*fp4_e2m1"):
        get_format("fp8_e4m4")
    with pytest.raises(ValueError, match="valid formats"):
        encode(torch.zeros(2), "fp3")


def test_custom_format_derives_its_limits():
    e3m4 = FloatFormat("fp8_e3m4", 3, 4, 3, "fn")
    assert e3m4.max == 30 and e3m4.min_normal == 0.25 and e3m4.min_subnormal == 2.0**-6
    ocp_e5m2_like = FloatFormat("x", 5, 2, 15, "ieee")
    assert ocp_e5m2_like.max == FORMATS["fp8_e5m2"].max


def test_code_table_refused_for_wide_formats():
    with pytest.raises(ValueError, match="≤ 8 bits"):
        FORMATS["bf16"].code_values()
    with pytest.raises(ValueError, match="at most 8 bits"):
        encode(torch.ones(1), "fp16")
