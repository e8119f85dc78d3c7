"""Stochastic rounding: one of the two neighbours, unbiased, reproducible, different per draw."""

import math

import numpy as np
import pytest
import torch

from fewerbits import FORMATS, cast, fake_quantize
from conftest import ORACLE

SR_FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "bf16", "fp16"]


def neighbours(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the grid values around each x, from the oracle's grid (x inside the range)."""
    fmt = FORMATS[name]
    if fmt.bits <= 8:
        grid = np.array(sorted({v for v in fmt.code_values() if np.isfinite(v)}))
    else:  # every finite value of the 16-bit format
        codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        with np.errstate(invalid="ignore"):
            grid = codes.view(ORACLE[name]).astype(np.float64)
        grid = np.unique(grid[np.isfinite(grid)])
    i = np.searchsorted(grid, x, side="right") - 1
    lo = grid[i]
    hi = np.where(lo == x, lo, grid[np.minimum(i + 1, len(grid) - 1)])
    return lo, hi


@pytest.mark.parametrize("name", SR_FORMATS)
def test_always_one_of_the_two_neighbours(name, rng):
    fmt = FORMATS[name]
    top = min(fmt.max, 1e4)
    x = (rng.uniform(-top, top, 100_000) * rng.choice([1, 1e-2, 1e-4], 100_000)).astype(np.float32)
    gen = torch.Generator().manual_seed(1)
    got = cast(torch.from_numpy(x), name, rounding="stochastic", generator=gen).double().numpy()
    lo, hi = neighbours(x.astype(np.float64), name)
    assert ((got == lo) | (got == hi)).all()
    assert (got == hi).any() and (got == lo).any() and (lo != hi).any()


@pytest.mark.parametrize(
    "name, value",
    [("fp4_e2m1", 2.3), ("fp4_e2m1", -0.1), ("fp4_e2m1", 5.9), ("fp8_e4m3", 0.3),
     ("fp8_e4m3", 1e-3), ("fp8_e5m2", -1234.5), ("fp6_e2m3", 0.06), ("bf16", 1.0 + 2**-9),
     ("fp16", 3.14159)],
)
def test_unbiased(name, value):
    """The mean of N draws is within 5 standard errors of x (false-alarm odds ~ 6e-7)."""
    n = 400_000
    x = torch.full((n,), value, dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    draws = cast(x, name, rounding="stochastic", generator=gen).double()
    lo, hi = (float(v[0]) for v in neighbours(np.array([np.float32(value)], np.float64), name))
    p = (float(np.float32(value)) - lo) / (hi - lo)  # probability of rounding up
    assert 0 < p < 1
    std_err = (hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(draws.mean().item() - float(np.float32(value))) < 5 * std_err
    assert set(draws.unique().tolist()) == {lo, hi}


def test_round_to_nearest_is_biased_where_stochastic_is_not():
    x = torch.full((200_000,), 2.3)  # nearest always gives 2.0 in e2m1
    assert cast(x, "fp4_e2m1").mean().item() == 2.0
    sr = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator().manual_seed(0))
    assert abs(sr.mean().item() - 2.3) < 0.01


def test_values_on_the_grid_are_kept():
    x = torch.tensor(sorted(v for v in FORMATS["fp4_e2m1"].code_values()))
    assert torch.equal(cast(x.repeat(1000), "fp4_e2m1", rounding="stochastic"), x.repeat(1000))


def test_reproducible_with_a_seed_and_different_across_draws():
    x = torch.randn(10_000) * 3
    a = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator().manual_seed(3))
    b = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    gen = torch.Generator().manual_seed(3)
    first = cast(x, "fp4_e2m1", rounding="stochastic", generator=gen)
    second = cast(x, "fp4_e2m1", rounding="stochastic", generator=gen)
    assert torch.equal(first, a) and not torch.equal(first, second)
    other = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator().manual_seed(4))
    assert not torch.equal(a, other)


def lowbias32(x: int) -> int:
    """C. Wellons' lowbias32 in plain Python integers: the oracle for rounding.mix32."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_noise_is_the_hash_of_seed_and_position_and_looks_uniform():
    """The noise of a seed is lowbias32(i ^ seed) >> 8 at row-major position i (plain
    Python integers as the oracle, positions past 2^32 wrapping); a generator's draws give
    different seeds; the 24-bit values fill 64 equal bins evenly (chi-square), and neither
    neighbouring elements nor the same element under two seeds are correlated."""
    from fewerbits.rounding import draw_noise, draw_seed, mix32, noise_bits

    words = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    as_int32 = torch.tensor([w - (1 << 32) if w >> 31 else w for w in words], dtype=torch.int32)
    assert [m & 0xFFFFFFFF for m in mix32(as_int32).tolist()] == [lowbias32(w) for w in words]
    seed = torch.tensor(123456789)
    n = noise_bits(seed, (7, 11))
    assert n.dtype == torch.int32 and n.shape == (7, 11)
    assert n.flatten().tolist() == [lowbias32(i ^ 123456789) >> 8 for i in range(77)]
    gen = torch.Generator().manual_seed(0)
    seeds = {int(draw_seed("cpu", gen)) for _ in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 1 << 31 for s in seeds)
    a = draw_noise((512, 1024), "cpu", torch.Generator().manual_seed(1)).double() / 2**24
    b = draw_noise((512, 1024), "cpu", torch.Generator().manual_seed(2)).double() / 2**24
    counts = torch.bincount((a.flatten() * 64).long(), minlength=64).double()
    expected = a.numel() / 64
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 120  # 63 degrees of freedom: 120 is beyond the 99.99th percentile
    corr = lambda u, v: torch.corrcoef(torch.stack([u.flatten(), v.flatten()]))[0, 1].abs().item()  # noqa: E731
    assert corr(a[:, :-1], a[:, 1:]) < 0.01 and corr(a[:-1], a[1:]) < 0.01 and corr(a, b) < 0.01


def test_saturates_at_max():
    x = torch.tensor([5.99, 7.0, 100.0, -float("inf")])
    got = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator().manual_seed(0))
    assert got[1:].tolist() == [6.0, 6.0, -6.0] and got[0].item() in (4.0, 6.0)


@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_e4m3_tensor"])
def test_block_scaled_quantization_is_unbiased(scheme):
    """With the scale fixed by each row's amax, the mean of many SR draws approaches x."""
    torch.manual_seed(0)
    x = torch.randn(1, 64)
    x[0, 0] = 4.0  # pins the amax, so every draw has the same scales
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [fake_quantize(x, scheme, rounding="stochastic", generator=gen) for _ in range(4000)]
    )
    nearest_err = (fake_quantize(x, scheme) - x).abs().mean()
    sr_bias = (draws.mean(0) - x).abs().mean()
    assert sr_bias < nearest_err / 5
