"""The kernels' division by a scale without a division, checked against the GPU's own division.

    python3 scripts/verify_quotient.py [--random 32] [--fraction 1.0]

`kernels/rowblock.py`'s `_quotient(x, *_divisor(s))` stands for `tl.div_rn(x, s)` (fp32 x / s,
correctly rounded) where a kernel divides by one fp32 scale a program (the one-read rows).
Where it returns the quotient (the scaled dividend xs = x · 2^(127 − E) within [2^−64, 2^64)),
every intermediate is a normal number, so scaling xs by a power of two scales every step's
result by it, and the bits follow from those of xs's significand. Part 1 checks
all of them: every dividend significand in [1, 2) against every divisor significand in [1, 2),
2^46 pairs, each quotient against `tl.div_rn`'s. Part 2 draws random fp32 pairs over the whole
range (dividends of every sign, exponent, subnormal and special; divisors the positive normal
scales a block can have) and checks the quotient where it is returned, and elsewhere that the
value returned and the true quotient are both under 2^−60 in magnitude, or both over 2^60,
with one sign, so that every element format rounds them to the same code.

Needs a CUDA GPU (part 1 takes about a minute on an H200). Prints the counts; exits non-zero
on any difference.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import triton
import triton.language as tl

from fewerbits.kernels.rowblock import QUOTIENT_HIGH, QUOTIENT_LOW, _divisor, _quotient


@triton.jit
def _all_significands(bad_ptr, first_ptr, every, M_PER: tl.constexpr, BLOCK: tl.constexpr):
    """Program (i, j): dividends 1 + (j·BLOCK + t)·2^−23, divisors 1 + (i·every·M_PER + k)·2^−23."""
    xs = ((127 << 23) | (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))).to(tl.float32, bitcast=True)
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    for k in range(M_PER):
        m = ((127 << 23) | (tl.program_id(0) * every * M_PER + k)).to(tl.float32, bitcast=True)
        p, mm, y = _divisor(m)
        q = _quotient(xs, p, mm, y)
        ref = tl.div_rn(xs, m)
        bad += (q.to(tl.int32, bitcast=True) != ref.to(tl.int32, bitcast=True)).to(tl.int32)
    n = tl.sum(bad)
    tl.atomic_add(bad_ptr, n)
    if n > 0:
        tl.atomic_min(first_ptr, tl.program_id(0) * every * M_PER)


@triton.jit
def _random_pairs(x_ptr, s_ptr, out_ptr, N, BLOCK: tl.constexpr):
    """out = 0 where the pair is right, 1 where the quotient differs, 2 where a value outside
    the quotient's range would round otherwise."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < N
    x = tl.load(x_ptr + i, mask=inside, other=1.0)
    s = tl.load(s_ptr + i, mask=inside, other=1.0)
    p, m, y = _divisor(s)
    v = _quotient(x, p, m, y)
    ref = tl.div_rn(x, s)
    a = tl.abs(x * p)
    in_range = (a >= QUOTIENT_LOW) & (a < QUOTIENT_HIGH)
    vb = v.to(tl.int32, bitcast=True)
    rb = ref.to(tl.int32, bitcast=True)
    same_sign = (vb < 0) == (rb < 0)
    tiny = (tl.abs(v) < 8.673617379884035e-19) & (tl.abs(ref) < 8.673617379884035e-19)  # 2^−60
    huge = (tl.abs(v) > 1.152921504606847e18) & (tl.abs(ref) > 1.152921504606847e18)  # 2^60
    nan = (x != x) & (v != v) & (ref != ref)
    wrong_q = in_range & (vb != rb) & ~nan
    wrong_out = ~in_range & ~nan & ~(same_sign & (tiny | huge))
    tl.store(out_ptr + i, tl.where(wrong_q, 1, tl.where(wrong_out, 2, 0)).to(tl.int8), mask=inside)


def all_significands(fraction: float = 1.0) -> int:
    """Part 1, over about this fraction of the divisor significands (runs of 256 spread evenly
    over [1, 2)); the number of pairs unlike div_rn's."""
    m_per, block = 256, 1024
    runs = (1 << 23) // m_per
    every = max(1, round(1 / fraction))
    rows = runs // every
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    first = torch.full((1,), 1 << 30, dtype=torch.int32, device="cuda")
    _all_significands[(rows, (1 << 23) // block)](bad, first, every, M_PER=m_per, BLOCK=block, num_warps=4)
    torch.cuda.synchronize()
    n = int(bad.item())
    print(f"part 1: {rows * m_per:,} divisor significands × {1 << 23:,} dividend significands "
          f"= {rows * m_per * (1 << 23):,} pairs; quotients unlike div_rn's: {n:,}"
          + (f" (first in the divisors from {1 + int(first.item()) / 2 ** 23!r})" if n else ""))
    return n


def random_pairs(batches: int, n: int = 1 << 27) -> int:
    """Part 2 over batches of n pairs; the number of pairs that differ (either way)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = {1: 0, 2: 0}
    for _ in range(batches):
        x = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device="cuda", generator=gen).view(torch.float32)
        # divisors: positive normal scales 2^−126 … 2^119, amax / 448 at least fp32's smallest normal
        e = torch.randint(1, 127 + 120, (n,), dtype=torch.int32, device="cuda", generator=gen)
        mant = torch.randint(0, 1 << 23, (n,), dtype=torch.int32, device="cuda", generator=gen)
        s = ((e << 23) | mant).view(torch.float32)
        out = torch.empty(n, dtype=torch.int8, device="cuda")
        _random_pairs[(triton.cdiv(n, 1024),)](x, s, out, n, BLOCK=1024)
        for k in total:
            total[k] += int((out == k).sum())
    print(f"part 2: {batches * n:,} random pairs; quotients unlike div_rn's: {total[1]:,}; values outside "
          f"the quotient's range that would round otherwise: {total[2]:,}")
    return total[1] + total[2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--random", type=int, default=32, help="batches of 2^27 random pairs (part 2)")
    p.add_argument("--fraction", type=float, default=1.0, help="of the divisor significands in part 1")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("verify_quotient.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    t0 = time.perf_counter()
    bad = random_pairs(args.random)
    print(f"  ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    bad += all_significands(args.fraction)
    print(f"  ({time.perf_counter() - t0:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
