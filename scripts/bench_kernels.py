"""The Triton quantization paths against the reference quantizer and a plain copy, per scheme.

    python scripts/bench_kernels.py [--size 8192] [--dtype bfloat16]
    python scripts/bench_kernels.py --shapes 8192x4096 8192x14336 --dtype float32 --axes -1 0 --no-reference

For each R×C tensor and quantization axis (-1: blocks along rows; 0: the column-wise copy for
a backward GEMM): milliseconds of `fewerbits.quantize` (the reference) and of `kernels.quantize`
(the Triton path), timed two ways. "call" puts CUDA events around the Python call, so for a
small tensor it includes the host's time to launch (the Python code, the checks, Triton's
launcher); "kernels" replays the call captured in a CUDA graph, which leaves only the GPU's
time for the kernels the call launches. Bandwidth counts the input read once plus everything
stored (codes and scales), against a device-to-device copy of the input timed the same way.
Medians of CUDA-event timings after warm-up, one process, one GPU.
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


def graph_ms(fn, iters=20, replays=10):
    """GPU milliseconds of one fn() captured in a CUDA graph (median of `iters` timings of
    `replays` replays each, divided by `replays`), or None where fn cannot be captured (it
    waits on the host)."""
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None

    def replay():
        for _ in range(replays):
            graph.replay()

    return ms(replay, iters=iters) / replays


def path_of(scheme) -> str:
    if rowblock.supported(scheme):
        return "one read"
    if rowblock.amax_supported(scheme):
        return "reduction + kernel"
    return "element kernel"


def parse_shape(text: str) -> tuple[int, int]:
    try:
        r, c = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is ROWSxCOLS, e.g. 8192x4096, not {text!r}") from None
    if r < 1 or c < 1:
        raise argparse.ArgumentTypeError(f"a shape's sizes must be positive, not {text!r}")
    return r, c


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=8192, help="an N×N tensor (unless --shapes)")
    p.add_argument("--shapes", type=parse_shape, nargs="+", help="ROWSxCOLS tensors")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--axes", type=int, nargs="+", default=[-1], choices=[-1, 0])
    p.add_argument("--schemes", nargs="+", choices=sorted(fb.SCHEMES), help="default: every scheme")
    p.add_argument("--no-reference", action="store_true", help="skip timing the reference quantizer")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    kernels.set_backend("triton")
    names = args.schemes or list(fb.SCHEMES)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}\n")
    print("| shape | scheme | axis | path | reference ms | call ms | kernels ms | kernels GB/s | of copy |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|")
    for r, c in args.shapes or [(args.size, args.size)]:
        x = torch.randn(r, c, device="cuda", dtype=getattr(torch, args.dtype))
        copy_ms = graph_ms(lambda: x.clone())
        copy_gbs = 2 * x.nbytes / copy_ms / 1e6
        print(f"| {r}x{c} | copy | | | | {ms(lambda: x.clone()):.3f} | {copy_ms:.3f} | {copy_gbs:,.0f} | 100% |")
        for name in names:
            scheme = fb.SCHEMES[name]
            for axis in args.axes:
                ref = "–" if args.no_reference else f"{ms(lambda: fb.quantize(x, name, axis=axis), iters=5, warmup=1):.2f}"
                call = ms(lambda: kernels.quantize(x, name, axis=axis))
                q = kernels.quantize(x, name, axis=axis)
                ker = graph_ms(lambda: kernels.quantize(x, name, axis=axis))
                if ker is None:
                    ker_txt = gbs_txt = share = "host wait"
                else:
                    gbs = (x.nbytes + q.nbytes) / ker / 1e6
                    ker_txt, gbs_txt, share = f"{ker:.3f}", f"{gbs:,.0f}", f"{gbs / copy_gbs:.0%}"
                print(f"| {r}x{c} | {name} | {axis} | {path_of(scheme)} | {ref} | {call:.3f} | {ker_txt} | "
                      f"{gbs_txt} | {share} |", flush=True)
        del x
    return 0


if __name__ == "__main__":
    sys.exit(main())
