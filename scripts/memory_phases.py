"""Where a training step's peak memory is, per recipe: the allocator's figures at each phase of
`bench train`'s step (the trainer's: forward, cross-entropy, backward, clipping, the fused AdamW).

    PYTHONPATH=src python3 scripts/memory_phases.py [--preset llama3-8b-8layers]
        [--batch-size 4] [--seq-len 2048] [--recipes bf16 fp8_tensorwise] [--compile-blocks]

For each recipe, after warm-up steps, one step measured phase by phase, GiB
(`torch.cuda.memory_allocated` at a phase's start and `max_memory_allocated` within it):
  held       what the step starts with: weights, optimizer states, recipe state, buffers
  fwd peak   the most during the forward and the loss
  bwd start  held at the start of backward: the above, every saved activation, the loss's buffers
  bwd peak   the most during backward (the gradients arrive as the saved activations go)
  opt start  held after backward: weights, states and the gradients
  opt peak   the most during clipping and the optimizer step
  peak       the largest of the three peaks: what `bench train` reports
and "saved" = bwd start − held: what the forward and the loss leave for backward. Needs CUDA.
"""

import argparse

import torch
import torch.nn.functional as F

import fewerbits.bench as bench
from fewerbits.convert import compile_model
from fewerbits.linear import set_weight_amaxes, share_input_scales
from fewerbits.models import Llama, get_preset
from fewerbits.train.optim import AdamW, clip_coefficient, param_groups
from fewerbits.train.precision import apply_recipe

GiB = 2**30


def phases(recipe: str, model_cfg, x, y, args, device) -> dict[str, float]:
    torch.manual_seed(0)
    model = Llama(model_cfg).to(device)
    apply_recipe(model, recipe, device=device)
    share_input_scales(model, x[:1])  # as bench train: delayed scaling's shared input scales
    opt = AdamW(param_groups(model, 0.1), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    step_model = compile_model(model, blocks=True) if args.compile_blocks else model
    got: dict[str, float] = {}

    def mark(name: str, peak: str | None = None) -> None:
        torch.cuda.synchronize()
        if peak is not None:
            got[peak] = torch.cuda.max_memory_allocated() / GiB
        got[name] = torch.cuda.memory_allocated() / GiB
        torch.cuda.reset_peak_memory_stats()

    for _ in range(args.warmup + 1):  # the last one measured
        mark("held")
        set_weight_amaxes(model, opt.weight_amax)  # as bench.training_step
        loss = F.cross_entropy(step_model(x).float().flatten(0, -2), y.reshape(-1))
        mark("bwd start", "fwd peak")
        loss.backward()
        del loss
        mark("opt start", "bwd peak")
        opt.step(grad_scale=clip_coefficient(params, 1.0)[1])
        opt.zero_grad(set_to_none=True)
        mark("end", "opt peak")
    got["peak"] = max(got["fwd peak"], got["bwd peak"], got["opt peak"])
    got["saved"] = got["bwd start"] - got["held"]
    del step_model, model, opt, params
    return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="llama3-8b-8layers")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--recipes", nargs="+", default=["bf16", "fp8_tensorwise"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile-blocks", action="store_true", help="compile block by block, as bench train --compile-blocks")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    model_cfg = get_preset(args.preset, bench.TrainBench.vocab_size)
    x, y = bench.train_batch(model_cfg, args.batch_size, args.seq_len, device)
    cols = ["held", "fwd peak", "bwd start", "saved", "bwd peak", "opt start", "opt peak", "peak"]
    print("| recipe | " + " | ".join(cols) + " | × bf16 peak |")
    first = None
    for recipe in args.recipes:
        bench._free(device)
        got = phases(recipe, model_cfg, x, y, args, device)
        first = first or got["peak"]
        print(f"| {recipe} | " + " | ".join(f"{got[c]:.2f}" for c in cols) + f" | {got['peak'] / first:.3f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    main()
