"""The Triton element kernel against the reference quantizer and a plain copy, per scheme.

    python scripts/bench_kernels.py [--size 8192] [--dtype bfloat16]

For an N×N tensor: milliseconds of `fewerbits.quantize` (reference), of `kernels.quantize`
(reference scales + the Triton element pass), and of the element kernel alone, with the
kernel's bandwidth (input read + codes written) against a device-to-device copy's.
Medians of CUDA-event timings after warm-up, in one process on one GPU.
"""

import argparse
import sys

import torch

import fewerbits as fb
from fewerbits import kernels
from fewerbits.benchmark import cuda_time_ms
from fewerbits.kernels.cast import cast_codes
from fewerbits.quantize import make_plan


def ms(fn, iters=20, warmup=3):
    return cuda_time_ms(fn, iters, warmup)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args(argv)
    n = args.size
    x = torch.randn(n, n, device="cuda", dtype=getattr(torch, args.dtype))
    copy_ms = ms(lambda: x.clone())
    copy_gbs = 2 * x.nbytes / copy_ms / 1e6
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {n}x{n} {args.dtype}; "
          f"copy {copy_ms:.3f} ms = {copy_gbs:,.0f} GB/s\n")
    print("| scheme | reference ms | kernels.quantize ms | speed-up | element kernel ms | kernel GB/s | of copy |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    kernels.set_backend("triton")
    for name in fb.SCHEMES:
        ref = ms(lambda: fb.quantize(x, name), iters=5, warmup=1)
        fast = ms(lambda: kernels.quantize(x, name))
        plan = make_plan(x, name)
        pack = plan.scheme.elem.bits == 4
        elem = ms(lambda: cast_codes(plan.X, plan.factor, plan.br, plan.bc, plan.scheme.elem,
                                     multiply=plan.scheme.two_level, noise=None, pack=True))
        out_bytes = x.numel() * (0.5 if pack else 1)
        gbs = (plan.X.nbytes + out_bytes) / elem / 1e6
        print(f"| {name} | {ref:.2f} | {fast:.2f} | {ref / fast:.1f}x | {elem:.3f} | {gbs:,.0f} | {gbs / copy_gbs:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
