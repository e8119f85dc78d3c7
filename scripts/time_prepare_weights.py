"""How long `prepare_weights` takes on a preset's weights, with dgrad's copy as the forward's
codes transposed (where `_codes_transposable` allows it) against quantized again from the fp32
weight, both in one process, arm by arm in turn; and whether the two give the same bytes.

    PYTHONPATH=src python3 scripts/time_prepare_weights.py fp8_tensorwise fp8_blockwise

On a CUDA device: llama3-8b-8layers with fp32 weights, every Linear under the recipe by the
trainer's default policy, the weights' amaxes given as the trainer gives them
(`set_weight_amaxes`), then `prepare_weights(model, in_place=True)` (as under CUDA graphs)
timed by CUDA events: three rounds of both arms, 8 calls each, the last 6 of every round kept;
the median per arm (docs/kernels-notes.md, v49).
"""
import statistics
import sys

import torch

import fewerbits.linear as L
from fewerbits.models import Llama, get_preset
from fewerbits.train.precision import apply_recipe
from fewerbits.train.loop import prepare_weights
from fewerbits.linear import set_weight_amaxes
cfg = get_preset("llama3-8b-8layers", 32000)
new_rule = L._codes_transposable
for recipe in sys.argv[1:]:
    torch.manual_seed(0)
    model = Llama(cfg).cuda()
    apply_recipe(model, recipe, device="cuda")
    set_weight_amaxes(model)
    res, kept = {}, {}
    for rnd in range(3):
        for arm in ("quantized again", "transposed"):
            L._codes_transposable = new_rule if arm == "transposed" else (lambda *a: False)
            layers = prepare_weights(model, in_place=True)
            ts = []
            for i in range(8):
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                prepare_weights(model, in_place=True)
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e))
            res.setdefault(arm, []).extend(ts[2:])
            kept[arm] = [t.clone() for m in layers for t in m._prepared if t is not None]
            for m in layers:
                m.release_weight()
    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(kept["quantized again"], kept["transposed"]))
    n = sum(1 for m in model.modules() if isinstance(m, L.QuantizedLinear))
    medians = {k: round(statistics.median(v), 3) for k, v in res.items()}
    print(recipe, f"{len(layers)} of {n} layers prepared;", medians, "ms median;",
          "bits equal" if same else "BITS DIFFER", flush=True)
    del model, kept
    torch.cuda.empty_cache()
L._codes_transposable = new_rule
