"""Time `bench train --compile`'s step for some recipes, each compiled in turn, with the time of
every warm-up step (the first holds the compilation) and any recompilation logged.

    PYTHONPATH=src TORCH_LOGS=recompiles python3 scripts/compiled_step.py fp8_tensorwise bf16 \
        [--preset llama3-8b-8layers] [--batch-size 4] [--seq-len 2048] [--warmup 3] [--iters 10]
        [--blocks]

The step and the model are bench train's (bench.training_step, fp32 master weights, the
trainer's AdamW, the model compiled by fewerbits.compile_model); the recipes run in the order
given, in one process, with CUDA events on the timed steps.
"""

import argparse
import time

import torch

import fewerbits.bench as bench
from fewerbits.benchmark import time_ms
from fewerbits.models import Llama, get_preset
from fewerbits.train.precision import apply_recipe


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipes", nargs="+")
    p.add_argument("--preset", default="llama3-8b-8layers")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--blocks", action="store_true", help="compile block by block (compile_model(blocks=True))")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    cfg = get_preset(args.preset, bench.TrainBench.vocab_size)
    x, y = bench.train_batch(cfg, args.batch_size, args.seq_len, device)
    for recipe in args.recipes:
        bench._free(device)
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = Llama(cfg).to(device)
        apply_recipe(model, recipe, device=device)
        step = bench.training_step(model, x, y, compile=True, device=device, blocks=args.blocks)
        for i in range(args.warmup):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            print(f"{recipe}: warm-up step {i}: {time.perf_counter() - t0:.1f} s", flush=True)
        ms = time_ms(step, args.iters, 0, device)  # the warm-up steps ran above, each timed
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"{recipe}: median {ms:.1f} ms/step, peak {peak:.2f} GiB", flush=True)
        del model, step


if __name__ == "__main__":
    main()
