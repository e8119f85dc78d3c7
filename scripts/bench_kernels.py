"""The Triton quantization paths against the reference quantizer and a plain copy, per scheme.

    python scripts/bench_kernels.py [--size 8192] [--dtype bfloat16]

For an N×N tensor: milliseconds of `fewerbits.quantize` (reference) and of `kernels.quantize`
(one fused kernel for 1 × bc blocks; reference scales + the element kernel otherwise), with
`kernels.quantize`'s effective bandwidth (input read once + codes and scales written) against
a device-to-device copy's. Medians of CUDA-event timings after warm-up, one process, one GPU.
"""

import argparse
import sys

import torch

import fewerbits as fb
from fewerbits import kernels
from fewerbits.benchmark import cuda_time_ms
from fewerbits.kernels import rowblock


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
    print("| scheme | path | reference ms | kernels.quantize ms | speed-up | GB/s | of copy |")
    print("|---|---|--:|--:|--:|--:|--:|")
    kernels.set_backend("triton")
    for name, scheme in fb.SCHEMES.items():
        ref = ms(lambda: fb.quantize(x, name), iters=5, warmup=1)
        fast = ms(lambda: kernels.quantize(x, name))
        q = kernels.quantize(x, name)
        gbs = (x.nbytes + q.nbytes) / fast / 1e6
        path = "fused" if rowblock.supported(scheme) else "element kernel"
        print(f"| {name} | {path} | {ref:.2f} | {fast:.3f} | {ref / fast:.1f}x | {gbs:,.0f} | {gbs / copy_gbs:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
