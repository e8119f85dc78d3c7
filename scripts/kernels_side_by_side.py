"""Two versions of the quantization kernels in one process: the same bits, and which is faster.

    git archive 0541878 src/fewerbits | tar -x -C /tmp/before        # an earlier tree, once
    python scripts/kernels_side_by_side.py /tmp/before/src/fewerbits \\
        --schemes mxfp4 nvfp4 --shapes 8192x4096 8192x14336 --dtype bfloat16 --axes -1 0 [--values]

BEFORE is the folder of an earlier `fewerbits` package (its source as stored in the repository).
It is copied to a temporary folder and imported under another name, `fewerbits_before`, its
operators registered under that name too, so that both versions' kernels run side by side.

First the bits: for each scheme, axis, rounding (nearest, stochastic) and input dtype (bf16,
fp32), the codes and scales of `kernels.quantize` (with --values, the bf16 matrix of
`kernels.quantized_values`, with and without the kernel's Hadamard transform where the scheme
takes one) of small matrices with NaN, ±inf, −0, zero, tiny and huge blocks and ragged edges,
before against now. Then, on a GPU, the times: milliseconds of the kernels a call launches,
replayed as a CUDA graph (`bench_kernels.graph_ms`), medians of three timings with the two
versions taking turns, and each one's share of the copy rate (the input read once, everything
stored written once, against a device-to-device copy of the input). Without a GPU (Triton's
interpreter: TRITON_INTERPRET=1) only the bits are compared, on the smaller matrix.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import fewerbits as fb
from fewerbits import kernels
from fewerbits.hadamard import Hadamard

sys.path.insert(0, str(Path(__file__).parent))
from bench_kernels import graph_ms, parse_shape  # noqa: E402

NAME = "fewerbits_before"


def import_before(folder: Path):
    """The `kernels` module of the package in `folder`, imported as `fewerbits_before`."""
    if not (folder / "kernels" / "__init__.py").is_file():
        raise SystemExit(f"{folder} holds no fewerbits package (no kernels/__init__.py)")
    root = Path(tempfile.mkdtemp(prefix="fewerbits-before-"))
    shutil.copytree(folder, root / NAME)
    ops = root / NAME / "kernels" / "__init__.py"
    # its operators under its own namespace: torch allows one definition of each name
    text = re.sub(r'Library\("fewerbits"', f'Library("{NAME}"', ops.read_text())
    text = text.replace("torch.ops.fewerbits.", f"torch.ops.{NAME}.").replace('"fewerbits::', f'"{NAME}::')
    ops.write_text(text)
    sys.path.insert(0, str(root))
    return importlib.import_module(f"{NAME}.kernels")


def hard(rows: int, cols: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """A Gaussian matrix with a zero block, NaN, ±inf, a block of −0, tiny and huge blocks."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols))
    x[0, :40] = 0.0
    x[1, 3], x[2, 70], x[3, 5] = float("nan"), float("inf"), -float("inf")
    x[4, :16] = -0.0
    x[5, :64] *= 1e-30
    x[6, :32] *= 3e4
    return x.to(device=device, dtype=dtype)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = a.reshape(-1), b.reshape(-1)
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def transforms(name: str, values: bool) -> list:
    """None, and the Hadamard transform of the scheme's block where the values kernel applies
    one itself (1 × bc blocks of 16 or 32)."""
    br, bc = fb.get_scheme(name).block
    return [None, Hadamard(bc, seed=3)] if values and br == 1 and bc in (16, 32) else [None]


def compare_bits(before, names: list[str], axes: list[int], values: bool, device: str) -> int:
    """Prints each differing case; returns how many differ."""
    n = bad = 0
    for dtype in (torch.bfloat16, torch.float32):
        for shape in ((300, 260), (1000, 1030)) if device == "cuda" else ((300, 260),):  # the interpreter is slow
            x = hard(*shape, dtype, device)
            for name in names:
                for axis in axes:
                    for rounding in ("nearest", "stochastic"):
                        for h in transforms(name, values):
                            gen = lambda: torch.Generator(device=device).manual_seed(5)  # noqa: E731
                            if values:
                                now = kernels.quantized_values(x, name, axis=axis, rounding=rounding, generator=gen(),
                                                               hadamard=h)
                                then = before.quantized_values(x, name, axis=axis, rounding=rounding, generator=gen(),
                                                               hadamard=h)
                                ok = same(now[0], then[0]) and same(now[1], then[1])
                            else:
                                now = kernels.quantize(x, name, axis=axis, rounding=rounding, generator=gen())
                                then = before.quantize(x, name, axis=axis, rounding=rounding, generator=gen())
                                ok = all(same(getattr(now, k), getattr(then, k)) for k in ("data", "scale", "tensor_scale"))
                            n += 1
                            if not ok:
                                bad += 1
                                print(f"differ: {name} {tuple(shape)} {str(dtype)[6:]} axis {axis} {rounding}"
                                      + (" Hadamard" if h is not None else ""), flush=True)
    print(f"bits: {n} cases, {bad} differ\n", flush=True)
    return bad


def compare_times(before, names, shapes, dtype, axes, values: bool) -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {str(dtype)[6:]} input\n")
    print("| shape | scheme | axis | Hadamard | copy ms | before ms | now ms | before | now |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|")
    for r, c in shapes:
        x = torch.randn(r, c, device="cuda", dtype=dtype)
        copy = statistics.median(graph_ms(lambda: x.clone()) for _ in range(3))
        rate = 2 * x.nbytes / copy
        for name in names:
            for axis in axes:
                for h in transforms(name, values):
                    if values:  # a bf16 matrix (and NVFP4's 4-byte tensor scale)
                        def call(k): return k.quantized_values(x, name, axis=axis, hadamard=h)
                        stored = call(kernels)[0].nbytes
                    else:
                        def call(k): return k.quantize(x, name, axis=axis)
                        stored = call(kernels).nbytes
                    then, now = [], []
                    for _ in range(3):
                        then.append(graph_ms(lambda: call(before)))
                        now.append(graph_ms(lambda: call(kernels)))
                    t, w = statistics.median(then), statistics.median(now)
                    moved = x.nbytes + stored
                    print(f"| {r}x{c} | {name} | {axis} | {'yes' if h is not None else 'no'} | {copy:.4f} | {t:.4f} | "
                          f"{w:.4f} | {moved / t / rate:.0%} | {moved / w / rate:.0%} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="folder of the earlier fewerbits package (…/src/fewerbits)")
    p.add_argument("--schemes", nargs="+", choices=sorted(fb.SCHEMES), required=True)
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[(8192, 4096)], help="ROWSxCOLS tensors timed")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the timed tensors' dtype")
    p.add_argument("--axes", type=int, nargs="+", default=[-1, 0], choices=[-1, 0])
    p.add_argument("--values", action="store_true", help="the values kernel (emulated GEMMs' operands), not the codes")
    args = p.parse_args(argv)
    before = import_before(args.before)
    kernels.set_backend("triton")
    before.set_backend("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bad = compare_bits(before, args.schemes, args.axes, args.values, device)
    if device == "cuda":
        compare_times(before, args.schemes, args.shapes, getattr(torch, args.dtype), args.axes, args.values)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
