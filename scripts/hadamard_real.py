"""What the FP4 recipes' Hadamard transform does to the weight-gradient GEMMs of a real model.

    fewerbits train --recipe bf16 --preset tiny --steps 1000 --data DATA --out RUN --device cpu
    PYTHONPATH=src python3 scripts/hadamard_real.py --run RUN --preset tiny --data DATA
        [--batch-size 32] [--seq-len 128] [--batch-seed 777] [--json FILE]

For the model at initialisation and after training (the run's last checkpoint), one forward
and backward pass in fp32 over a batch of training windows records every Linear's input x
(tokens × in) and output gradient g (tokens × out). For each Linear the weight-gradient GEMM
gᵀx (inner dimension: tokens) is computed with both operands prepared as the recipes' wgrad
slot prepares them — nvfp4_naive and mxfp4_naive, each without and with its recipe's own
Hadamard transform (size 16 and 32, the recipe's fixed signs) — and its SQNR against the fp64
product is printed, with each operand's kurtosis and largest-to-median channel RMS.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import fewerbits as fb
from fewerbits.diagnostics import sqnr_db
from fewerbits.models import Llama, get_preset
from fewerbits.train import checkpoint as ckpt
from fewerbits.train.data import batch, prepare
from stabilisers import wgrad  # the weight-gradient GEMM as the recipes' wgrad slot runs it (scripts/)

FORMATS = ("nvfp4", "mxfp4")


def slots():
    """format → (wgrad Gemm without the transform, the same with the recipe's transform)."""
    out = {}
    for name in FORMATS:
        naive = fb.get_recipe(name + "_naive").wgrad
        out[name] = (naive, dataclasses.replace(naive, hadamard=fb.get_recipe(name).wgrad.hadamard))
    return out


def wgrad_sqnr(gemm, g, x, ref):
    return sqnr_db(ref, wgrad(gemm, g, x).double())


def kurtosis(t):
    c = t.double().flatten()
    c = c - c.mean()
    return (c.pow(4).mean() / c.pow(2).mean().pow(2)).item()  # 3 for a Gaussian


def channel_ratio(t):
    rms = t.double().pow(2).mean(0).sqrt()
    return (rms.max() / rms.median()).item()


def capture(model, tokens, targets):
    """{Linear name: (x, g)} from one fp32 forward and backward pass."""
    store, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def hook(m, inp, out, name=name):
                store[name] = [inp[0].detach().reshape(-1, m.in_features).float().clone(), None]
                out.register_hook(lambda g, name=name: store[name].__setitem__(1, g.detach().reshape(-1, g.shape[-1]).float().clone()))
            handles.append(mod.register_forward_hook(hook))
    F.cross_entropy(model(tokens).flatten(0, 1).float(), targets.flatten()).backward()
    for h in handles:
        h.remove()
    return store


def measure(store):
    rows, variants = [], slots()
    for name, (x, g) in store.items():
        ref = g.t().double() @ x.double()
        row = {"layer": name, "x_kurtosis": kurtosis(x), "g_kurtosis": kurtosis(g),
               "x_channels": channel_ratio(x), "g_channels": channel_ratio(g)}
        for fmt, (naive, hadamard) in variants.items():
            row[fmt] = (wgrad_sqnr(naive, g, x, ref), wgrad_sqnr(hadamard, g, x, ref))
        rows.append(row)
    return rows


def report(state, rows):
    print(f"\n{state}: SQNR (dB) of gᵀx, naive → with the recipe's Hadamard transform")
    print("| Linear | kurtosis x / g | max/median channel RMS x / g | nvfp4 | Δ | mxfp4 | Δ |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        cells = [f"{r['layer']}", f"{r['x_kurtosis']:.1f} / {r['g_kurtosis']:.1f}",
                 f"{r['x_channels']:.1f} / {r['g_channels']:.1f}"]
        for fmt in FORMATS:
            a, b = r[fmt]
            cells += [f"{a:.2f} → {b:.2f}", f"{b - a:+.2f}"]
        print("| " + " | ".join(cells) + " |")
    for fmt in FORMATS:
        d = torch.tensor([r[fmt][1] - r[fmt][0] for r in rows])
        print(f"{fmt}: mean Δ {d.mean():+.2f} dB, median {d.median():+.2f}, range {d.min():+.2f} … {d.max():+.2f}, "
              f"higher with the transform in {int((d > 0).sum())} of {len(d)} Linears")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a trained run's folder (its last checkpoint is read)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--data", default=None, help="the run's training text (default: the embedded corpus)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0, help="the run's seed (its initial weights)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-seed", type=int, default=777, help="which training windows")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    data = prepare(args.data, args.vocab_size, args.cache_dir)
    cfg = get_preset(args.preset, data.vocab_size)
    tokens, targets = batch(data.train, args.batch_size, args.seq_len, args.batch_seed, 0)
    result = {}
    for state in ("initialised", "trained"):
        torch.manual_seed(args.seed)  # the trainer's initial weights
        model = Llama(cfg)
        if state == "trained":
            ckpt.load(ckpt.find(Path(args.run)), model)
        result[state] = measure(capture(model, tokens, targets))
        report(state, result[state])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
