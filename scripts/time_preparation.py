"""How long `prepare_weights` takes on a preset's weights, layer by layer in eager mode against
one compiled function (`compiled=True`), in one process; and whether the two give the same
bytes (operands, and delayed scaling's histories and amaxes).

    PYTHONPATH=src python3 scripts/time_preparation.py fp8_tensorwise fp8_delayed fp8_blockwise

On a CUDA device: llama3-8b-8layers with fp32 weights, every Linear under the recipe by the
trainer's default policy, the weights' amaxes given as the trainer gives them
(`set_weight_amaxes`); delayed scaling's weights prepared for `--micro-batches` forwards. For
each arm: the first call's time (compiling, for the compiled arm), then `--calls` calls in
`--rounds` rounds, the arms taking turns, each call timed on the host to its return and to the
GPU's end after it (the device idle before each call); medians per arm.
"""
import argparse
import statistics
import time

import torch

from fewerbits.linear import QuantizedLinear, prepare_weights, set_weight_amaxes
from fewerbits.models import Llama, get_preset
from fewerbits.train.precision import apply_recipe

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("recipes", nargs="+")
p.add_argument("--preset", default="llama3-8b-8layers")
p.add_argument("--micro-batches", type=int, default=4)
p.add_argument("--calls", type=int, default=6)
p.add_argument("--rounds", type=int, default=2)
args = p.parse_args()

cfg = get_preset(args.preset, 32000)
for recipe in args.recipes:
    torch.manual_seed(0)
    model = Llama(cfg).cuda()
    apply_recipe(model, recipe, device="cuda")
    n = args.micro_batches if recipe == "fp8_delayed" else None
    delayed = [m.delayed_scaling for m in model.modules() if isinstance(m, QuantizedLinear) and m.delayed_scaling]
    start = [(s.amax_history.clone(), s.amax.clone()) for s in delayed]
    host, done, first, kept = {}, {}, {}, {}
    for rnd in range(args.rounds):
        for compiled in (False, True):
            for s, (h, a) in zip(delayed, start):  # both arms from the same histories
                s.amax_history.copy_(h)
                s.amax.copy_(a)
            for i in range(args.calls + (rnd == 0)):
                set_weight_amaxes(model)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                layers = prepare_weights(model, micro_batches=n, compiled=compiled)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                if rnd == 0 and i == 0:
                    first[compiled] = t2 - t0
                    kept[compiled] = [t.clone() for m in layers for t in m._prepared if t is not None]
                    kept[compiled] += [t.clone() for s in delayed for t in (s.amax_history, s.amax)]
                else:
                    host.setdefault(compiled, []).append((t1 - t0) * 1e3)
                    done.setdefault(compiled, []).append((t2 - t0) * 1e3)
                for m in layers:
                    m.release_weight()
    same = len(kept[False]) == len(kept[True]) and all(
        a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        for a, b in zip(kept[False], kept[True]))
    print(f"{recipe}: {len(layers)} layers prepared" + (f" for {n} micro-batches" if n else ""), flush=True)
    for compiled in (False, True):
        print(f"  {'compiled' if compiled else 'eager':8s} first call {first[compiled]:.2f} s; "
              f"host {statistics.median(host[compiled]):.2f} ms, to the GPU's end "
              f"{statistics.median(done[compiled]):.2f} ms (medians of {len(done[compiled])})", flush=True)
    print("  bits equal" if same else "  BITS DIFFER", flush=True)
    del model, layers, kept
    torch.cuda.empty_cache()
