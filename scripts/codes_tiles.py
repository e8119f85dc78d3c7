"""Which tile makes the one-read kernel's codes fastest: every tile of a grid, timed on a GPU.

    python3 scripts/codes_tiles.py [--schemes mxfp4 mxfp6_e2m3] [--shapes 8192x14336 8192x4096] [--axis 0]

For each shape (bf16, standard normal, read along rows, or with --axis 0 down its columns, as
the transposed view) and scheme it times `rowblock.quantize_rowblocks` with the default layout
choices (two elements a word where `rowblock.row_read_in_lanes` or `column_read_in_lanes`
holds, whole blocks a thread where `row_read_whole` does) in every tile of 8–64 rows, 64–256 columns and 2–8 warps
that gives a thread 4 to 64 elements: milliseconds of the kernel replayed as a CUDA graph
(`bench_kernels.graph_ms`, the median of three timings), as a share of the copy rate (the input
read once, codes and scales written once, against a device-to-device copy of the input). Each
tile's codes and scales are compared with those of the library's default call with lanes off
(`lanes=False`): a tile that changes a bit is marked. It prints the default call, the call
without lanes, and the eight fastest tiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import graph_ms, parse_shape  # noqa: E402

import fewerbits as fb  # noqa: E402
from fewerbits.kernels import rowblock  # noqa: E402


def tiles() -> list[tuple[int, int, int]]:
    return [(r, c, w) for r in (8, 16, 32, 64) for c in (64, 128, 256) for w in (2, 4, 8)
            if 4 <= r * c // (32 * w) <= 64]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schemes", nargs="+", default=["mxfp4", "mxfp6_e2m3"], choices=sorted(fb.SCHEMES))
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[(8192, 14336), (8192, 4096)])
    p.add_argument("--axis", type=int, default=-1, choices=[-1, 0], help="the blocks along rows (-1) or columns (0)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("codes_tiles.py times kernels on a GPU; none is available", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 input read "
          f"{'along rows' if args.axis == -1 else 'down columns'}")
    for shape in args.shapes:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        if args.axis == 0:
            x = x.t()
        copy = statistics.median(graph_ms(lambda: x.clone()) for _ in range(3))
        rate = 2 * x.nbytes / copy
        for name in args.schemes:
            scheme = fb.get_scheme(name)
            ref = rowblock.quantize_rowblocks(x, scheme, None, lanes=False)
            share = lambda t: (x.nbytes + ref[0].nbytes + ref[1].nbytes) / t / rate  # noqa: E731

            def timed(**kw) -> float:
                return statistics.median(graph_ms(lambda: rowblock.quantize_rowblocks(x, scheme, None, **kw))
                                         for _ in range(3))

            rows = []
            for r, c, w in tiles():
                codes, scales, _ = rowblock.quantize_rowblocks(x, scheme, None, tile_r=r, tile_c=c, num_warps=w)
                same = torch.equal(codes, ref[0]) and torch.equal(scales, ref[1])
                rows.append((timed(tile_r=r, tile_c=c, num_warps=w), r, c, w, same))
            default, off = timed(), timed(lanes=False)
            print(f"\n{shape[0]}x{shape[1]} {name}: copy {copy:.4f} ms; default {default:.4f} ({share(default):.0%}); "
                  f"lanes off {off:.4f} ({share(off):.0%}); {len(rows)} tiles, "
                  f"{sum(not s for *_, s in rows)} with other bits")
            for t, r, c, w, same in sorted(rows)[:8]:
                print(f"  {r} x {c}, {w} warps: {t:.4f} ({share(t):.0%}){'' if same else '  OTHER BITS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
