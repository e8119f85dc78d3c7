"""CPU time of the reference quantizer on a 4096x4096 tensor, per scheme (a benchmark, not a test).

    python scripts/bench_quantize_cpu.py [--size 4096] [--repeats 3] [--threads N]

The reference is the spec, written for clarity in plain torch (float64 inside); the fast paths
are the GPU kernels. This shows what a CPU run of the reference costs.
"""

import argparse
import platform
import statistics
import sys
import time

import torch

import fewerbits as fb


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    print(f"{args.size}x{args.size} fp32, median of {args.repeats}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}\n")
    print("| scheme | quantize (s) | dequantize (s) | quantize, stochastic (s) |")
    print("|---|--:|--:|--:|")
    for name in fb.SCHEMES:
        times = {"q": [], "dq": [], "sr": []}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            q = fb.quantize(x, name)
            t1 = time.perf_counter()
            q.dequantize()
            t2 = time.perf_counter()
            fb.quantize(x, name, rounding="stochastic", generator=torch.Generator().manual_seed(0))
            t3 = time.perf_counter()
            times["q"].append(t1 - t0)
            times["dq"].append(t2 - t1)
            times["sr"].append(t3 - t2)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} | {med['q']:.2f} | {med['dq']:.2f} | {med['sr']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
