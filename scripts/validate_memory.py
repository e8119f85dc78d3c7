"""The memory planner against the trainer's measured peak: the table in docs/memory.md.

    PYTHONPATH=src python3 scripts/validate_memory.py [--presets 125m 350m 1b]
        [--recipes bf16 fp8_tensorwise fp8_blockwise mxfp8 nvfp4] [--batch-sizes 4 16]
        [--seq-len 1024] [--steps 3] [--json FILE] [--save-quantized-inputs]

Each case trains the preset for a few steps with `fewerbits.train` on the embedded corpus (in
this process, one case after another) and compares `torch.cuda.max_memory_allocated()` over the
run (the summary's peak) with `estimate_memory` for the same settings (the fused AdamW kernel,
as the trainer runs it on a GPU). Exits 1 if any case is
outside ±10%.
"""

import argparse
import gc
import json
import shutil
import sys
import tempfile

import torch

import fewerbits as fb
from fewerbits.train import TrainConfig, train


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["125m", "350m", "1b"])
    p.add_argument("--recipes", nargs="+", default=["bf16", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[4, 16])
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--save-quantized-inputs", action="store_true", help="the trainer's option, and the estimate's")
    p.add_argument("--device", default="cuda", help="cuda (the check); cpu only runs the cases (its peak is the RSS)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("validate_memory.py measures CUDA peaks: it needs a GPU")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            for recipe in args.recipes:
                for bs in args.batch_sizes:
                    cfg = TrainConfig(recipe=recipe, preset=preset, steps=args.steps, batch_size=bs,
                                      seq_len=args.seq_len, eval_every=10**6, eval_windows=1, checkpoint_every=0,
                                      out=f"{tmp}/{preset}-{recipe}-{bs}", progress=False, tensorboard=False,
                                      device=args.device, save_quantized_inputs=args.save_quantized_inputs)
                    summary = train(cfg)
                    shutil.rmtree(cfg.out)  # its final checkpoint: gigabytes each for the larger presets
                    est = fb.estimate_memory(preset, recipe, batch_size=bs, seq_len=args.seq_len,
                                             save_quantized_input=args.save_quantized_inputs)
                    measured = summary["peak_memory_bytes"]
                    row = {"preset": preset, "recipe": recipe, "batch_size": bs, "estimate": est.total_bytes,
                           "measured": measured, "ratio": est.total_bytes / measured,
                           "peak_at": max(est.phases, key=est.phases.get)}
                    rows.append(row)
                    print(f"{preset} {recipe} {bs}: estimate {est.total_bytes / 2**30:.2f} GiB, measured "
                          f"{measured / 2**30:.2f} GiB, ratio {row['ratio']:.3f}", file=sys.stderr, flush=True)
                    if args.json:  # after every case: a run cut short keeps what it measured
                        with open(args.json, "w") as f:
                            json.dump(rows, f, indent=2)
                    gc.collect()
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, seq_len {args.seq_len}, "
          f"{args.steps} steps\n")
    print("| preset | recipe | batch | estimated peak (GiB) | measured peak (GiB) | estimate / measured | peak at |")
    print("|---|---|--:|--:|--:|--:|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['recipe']} | {r['batch_size']} | {r['estimate'] / 2**30:.2f} | "
              f"{r['measured'] / 2**30:.2f} | {r['ratio']:.3f} | {r['peak_at']} |")
    return 0 if all(0.9 <= r["ratio"] <= 1.1 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
