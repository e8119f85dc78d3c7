"""Round-trip SQNR of every scheme: the table in docs/numerics.md.

    python scripts/numerics_table.py [--rows 2048] [--cols 2048] [--seed 0]

Prints a Markdown table: for each named scheme (and each E8M0 scale rule of the MX schemes),
the storage cost in bits per element (scales included) and the SQNR of quantize → dequantize
on a standard Gaussian and on the same Gaussian with 0.1% of its entries multiplied by 100
(outliers, as in activations), with round-to-nearest and with stochastic rounding.
"""

import argparse
import sys

import torch

import fewerbits as fb
from fewerbits.diagnostics import sqnr_db


def inputs(rows: int, cols: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gauss = torch.randn(rows, cols, generator=gen)
    outliers = gauss.clone()
    mask = torch.rand(rows, cols, generator=gen) < 1e-3
    outliers[mask] *= 100
    return {"gaussian": gauss, "outliers": outliers}


def variants():
    for name, scheme in fb.SCHEMES.items():
        yield name, scheme
        if scheme.scale_fmt.name == "e8m0":
            for rule in ("rceil", "ceil", "even"):
                yield f"{name} ({rule})", scheme.with_rule(rule)


def measure(rows: int, cols: int, seed: int) -> list[dict]:
    data = inputs(rows, cols, seed)
    out = []
    for label, scheme in variants():
        row = {"scheme": label, "what": scheme.describe()}
        q = fb.quantize(data["gaussian"], scheme)
        row["bits"] = 8 * q.nbytes / data["gaussian"].numel()
        for key, x in data.items():
            row[key] = sqnr_db(x, fb.fake_quantize(x, scheme))
        gen = torch.Generator().manual_seed(seed + 1)
        sr = fb.fake_quantize(data["gaussian"], scheme, rounding="stochastic", generator=gen)
        row["gaussian_sr"] = sqnr_db(data["gaussian"], sr)
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--cols", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = measure(args.rows, args.cols, args.seed)
    print(f"Input: {args.rows}x{args.cols}, seed {args.seed}, torch {torch.__version__}.\n")
    print("| scheme | elements, blocks, scales (rule) | bits/element | SQNR dB, Gaussian | "
          "SQNR dB, Gaussian, stochastic rounding | SQNR dB, 0.1% outliers ×100 |")
    print("|---|---|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['scheme']} | {r['what']} | {r['bits']:.3f} | {r['gaussian']:.2f} | "
              f"{r['gaussian_sr']:.2f} | {r['outliers']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
