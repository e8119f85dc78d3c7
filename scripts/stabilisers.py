"""What the FP4 stabilisers do to one weight-gradient GEMM: the table in docs/recipes.md.

    python scripts/stabilisers.py [--tokens 4096] [--seed 0]

For grad_outputᵀ · input (tokens × 256 each), the SQNR against fp32 of the wgrad GEMM under
the `_naive` recipe, with the recipe's Hadamard transform only, with the full recipe (Hadamard
and stochastic rounding of grad_output), and the mean of 64 stochastic draws, on three kinds
of operands: Gaussian, Student-t (ν = 2: many moderate outliers), and Gaussian with 1% spikes
of 20σ.
"""

import argparse
import dataclasses
import sys

import torch

import fewerbits as fb
from fewerbits.diagnostics import sqnr_db
from fewerbits.gemm import scaled_matmul
from fewerbits.linear import _prepare


def operands(kind: str, tokens: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(tokens, 256, generator=gen)
    if kind == "student-t":
        x = torch.distributions.StudentT(2.0).sample((tokens, 256))
    elif kind == "spikes":
        x = x + (torch.rand(tokens, 256, generator=gen) < 0.01) * 20 * torch.randn(tokens, 256, generator=gen)
    return x


def wgrad(gemm: fb.Gemm, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    a = _prepare(g, gemm.a, gemm, 0, torch.bfloat16)
    b = _prepare(x, gemm.b, gemm, 0, torch.bfloat16)
    return scaled_matmul(a, b, out_dtype=torch.float32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print("| recipe | operands | naive | + Hadamard | full recipe (one draw) | full, mean of 64 draws |")
    print("|---|---|--:|--:|--:|--:|")
    for base in ("mxfp4", "nvfp4"):
        full = fb.get_recipe(base).wgrad
        naive = fb.get_recipe(base + "_naive").wgrad
        hadamard = dataclasses.replace(naive, hadamard=full.hadamard)
        for kind in ("gaussian", "student-t", "spikes"):
            gen = torch.Generator().manual_seed(args.seed)
            torch.manual_seed(args.seed)
            g, x = operands(kind, args.tokens, gen), operands(kind, args.tokens, gen)
            ref = g.t() @ x
            draws = torch.stack([wgrad(full, g, x) for _ in range(64)])
            row = [sqnr_db(ref, wgrad(naive, g, x)), sqnr_db(ref, wgrad(hadamard, g, x)),
                   sqnr_db(ref, draws[0]), sqnr_db(ref, draws.mean(0))]
            print(f"| {base} | {kind} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
