"""Round-trip SQNR floors for every scheme (docs/numerics.md has the full table).

The floors sit 0.5 dB under the values this reference quantizer gives on a seeded 512x1024
standard Gaussian, so a change that loses accuracy anywhere fails here. The relations below
them follow from the formats alone and hold for any correct implementation.
"""

import pytest
import torch

from fewerbits import SCHEMES, fake_quantize
from fewerbits.diagnostics import sqnr_db

# scheme: (round to nearest, stochastic rounding), dB
FLOORS = {
    "fp8_e4m3_tensor": (31.05, 28.0),
    "fp8_e5m2_tensor": (25.05, 22.0),
    "fp8_e4m3_row": (31.05, 28.0),
    "fp8_e4m3_1x128": (31.25, 28.25),
    "fp8_e4m3_128x128": (31.05, 28.0),
    "mxfp8_e4m3": (30.1, 27.55),
    "mxfp8_e5m2": (24.85, 21.95),
    "mxfp6_e3m2": (24.85, 21.95),
    "mxfp6_e2m3": (30.4, 27.45),
    "mxfp4": (18.25, 15.5),
    "nvfp4": (19.9, 16.7),
    "nvfp4_16x16": (18.55, 15.45),
}


@pytest.fixture(scope="module")
def gaussian():
    return torch.randn(512, 1024, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def measured(gaussian):
    out = {}
    for name in SCHEMES:
        nearest = sqnr_db(gaussian, fake_quantize(gaussian, name))
        gen = torch.Generator().manual_seed(1)
        sr = sqnr_db(gaussian, fake_quantize(gaussian, name, rounding="stochastic", generator=gen))
        out[name] = (nearest, sr)
    return out


def test_every_scheme_has_a_floor():
    assert set(FLOORS) == set(SCHEMES)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_sqnr_floor(name, measured):
    nearest, sr = measured[name]
    floor_nearest, floor_sr = FLOORS[name]
    assert nearest >= floor_nearest, f"{name}: {nearest:.2f} dB < {floor_nearest} dB"
    assert sr >= floor_sr, f"{name} (stochastic): {sr:.2f} dB < {floor_sr} dB"


@pytest.mark.parametrize("name", list(SCHEMES))
def test_stochastic_rounding_costs_about_3_db(name, measured):
    """SR noise is roughly twice the variance of round-to-nearest's."""
    nearest, sr = measured[name]
    assert 2.0 < nearest - sr < 4.0


def test_relations_between_formats(measured):
    n = {k: v[0] for k, v in measured.items()}
    assert 5.0 < n["fp8_e4m3_tensor"] - n["fp8_e5m2_tensor"] < 7.0  # one mantissa bit ≈ 6 dB
    assert 5.0 < n["mxfp6_e2m3"] - n["mxfp6_e3m2"] < 7.0
    assert n["nvfp4"] > n["mxfp4"] + 1.0  # finer blocks, finer scales
    assert n["nvfp4"] > n["nvfp4_16x16"]
    assert n["fp8_e4m3_1x128"] >= n["fp8_e4m3_tensor"]


def test_block_scales_survive_outliers(gaussian):
    x = gaussian.clone()
    x[::97, ::89] *= 1000.0  # sparse outliers wreck one tensor-wide scale
    tensor = sqnr_db(x, fake_quantize(x, "fp8_e4m3_tensor"))
    tiles = sqnr_db(x, fake_quantize(x, "fp8_e4m3_1x128"))
    assert tiles > tensor + 3.0


def test_sqnr_of_identical_tensors_is_infinite(gaussian):
    assert sqnr_db(gaussian, gaussian) == float("inf")
