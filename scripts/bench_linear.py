"""Forward + backward time of one QuantizedLinear per recipe against nn.Linear in bf16.

    python scripts/bench_linear.py [--shapes 8192x4096x4096 8192x4096x14336] [--iters 10]
                                   [--recipes ...] [--json FILE]

Shapes are tokens x in_features x out_features. The baseline is nn.Linear with bf16 weights;
each QuantizedLinear keeps fp32 master weights (as training does) and takes bf16 activations.
One step = y = layer(x); y.backward(g). Times are medians of CUDA-event timings after warm-up,
all arms in one process on one GPU; the table reports each recipe's time over the baseline's.
"""

import argparse
import json
import sys

import torch
import torch.nn as nn

import fewerbits as fb
from fewerbits.benchmark import cuda_time_ms
from fewerbits.gemm import native_reason


def time_step(layer, x, g, warmup: int, iters: int) -> float:
    def step():
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x).backward(g)

    return cuda_time_ms(step, iters, warmup)


def path_of(recipe: fb.Recipe, m: int, k: int, n: int) -> str:
    """'native' if every quantized GEMM of the recipe takes a native kernel at this shape."""
    if not recipe.quantized:
        return f"{str(recipe.compute_dtype).removeprefix('torch.')} GEMMs"
    paths = []
    for gemm, (ra, ca, rb, cb) in (
        (recipe.fprop, (m, k, n, k)), (recipe.dgrad, (m, n, k, n)), (recipe.wgrad, (n, m, k, m))
    ):
        qa = fb.quantize(torch.zeros(ra, ca, device="cuda"), gemm.a.scheme)
        qb = fb.quantize(torch.zeros(rb, cb, device="cuda"), gemm.b.scheme)
        paths.append("native" if native_reason(qa, qb) is None else "emulated")
    return paths[0] if len(set(paths)) == 1 else "/".join(paths)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["8192x4096x4096", "8192x4096x14336"])
    p.add_argument("--recipes", nargs="+", default=list(fb.RECIPES))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    results = []
    for shape in args.shapes:
        m, k, n = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        base = nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
        t_base = time_step(base, x, g, args.warmup, args.iters)
        results.append({"shape": shape, "recipe": "nn.Linear (bf16)", "path": "bf16 GEMMs", "ms": t_base, "ratio": 1.0})
        master = nn.Linear(k, n, bias=False, device=dev)
        for name in args.recipes:
            recipe = fb.get_recipe(name)
            layer = fb.QuantizedLinear.from_linear(master, recipe)
            ms = time_step(layer, x, g, args.warmup, args.iters)
            results.append({"shape": shape, "recipe": name, "path": path_of(recipe, m, k, n), "ms": ms, "ratio": ms / t_base})
            print(f"{shape} {name:14s} {ms:9.2f} ms  {ms / t_base:6.2f}x", file=sys.stderr, flush=True)
        del x, g, base, master
        torch.cuda.empty_cache()

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, median of {args.iters} after {args.warmup} warm-up steps\n")
    shapes = args.shapes
    print("| recipe | GEMM path | " + " | ".join(f"{s}: ms | × nn.Linear" for s in shapes) + " |")
    print("|---|---|" + "--:|--:|" * len(shapes))
    names = ["nn.Linear (bf16)"] + list(args.recipes)
    for name in names:
        rows = [r for r in results if r["recipe"] == name]
        cells = " | ".join(f"{r['ms']:.2f} | {r['ratio']:.2f}" for r in rows)
        print(f"| {name} | {rows[0]['path']} | {cells} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
