"""Which steps record CUDA graphs, per recipe: `bench train`'s step compiled block by block in
a mode that replays them (reduce-overhead), with the recordings and warm-up runs of inductor's
cudagraph trees counted step by step.

    PYTHONPATH=src python3 scripts/cuda_graph_recordings.py [--preset small] [--seq-len 1024]
        [--batch-size 4] [--recipes bf16 fp8_tensorwise fp8_delayed fp8_blockwise] [--steps 9]
        [--mode reduce-overhead] [--train [--grad-accum 2]]

With --train it runs the trainer itself (`fewerbits.train.train`, compiled block by block, on
generated token ids, gradient accumulation as asked) and counts per optimizer step, the time
being the trainer's own (tokens per step over its tokens/s).

Each line: the recipe, then per step its wall time (ms, the GPU synchronized after it), the
graphs recorded in it (r) and the functions warmed up (w). A step records once, early
(cudagraph trees warm a function up in its first call and record it in its second); a graph
records again when an input it takes at a fixed address has moved (dynamo fixes the address
of every parameter, buffer and tensor attribute of a module), which shows as later steps with
r > 0 and the time of a recording step (docs/kernels-notes.md, v41). Needs a CUDA device.
"""

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import torch
import torch._inductor.cudagraph_trees as trees

from fewerbits import bench
from fewerbits.linear import share_input_scales
from fewerbits.models import Llama, get_preset
from fewerbits.train.precision import apply_recipe


def count_calls(counts: collections.Counter) -> None:
    """Count cudagraph trees' recordings and warm-up runs into `counts`."""
    for name in ("record_function", "run_eager"):
        original = getattr(trees.CUDAGraphTreeManager, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        setattr(trees.CUDAGraphTreeManager, name, counted)


def trainer_rows(recipe: str, args, counts: collections.Counter) -> list[str]:
    """One cell per optimizer step of `fewerbits.train.train`: ms, recordings, warm-ups."""
    from fewerbits.train import TrainConfig, train
    from fewerbits.train.optim import AdamW

    seen = []
    step = AdamW.step

    def counted_step(self, *a, **k):  # the counts of the step's micro-batches, then the update
        seen.append((counts["record_function"], counts["run_eager"]))
        counts.clear()
        return step(self, *a, **k)

    AdamW.step = counted_step
    try:
        with tempfile.TemporaryDirectory() as tmp:
            i = np.arange(400_000)
            (i * 7 % 251 + i // 97 % 5).astype(np.uint16).tofile(Path(tmp) / "tokens.bin")
            counts.clear()
            train(TrainConfig(recipe=recipe, preset=args.preset, data=str(Path(tmp) / "tokens.bin"),
                              vocab_size=256, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                              grad_accum=args.grad_accum, compile_blocks=True, compile_mode=args.mode,
                              eval_every=10**6, eval_windows=args.batch_size, log_every=1, checkpoint_every=0,
                              progress=False, tensorboard=False, out=str(Path(tmp) / "run"), device="cuda"))
            rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    finally:
        AdamW.step = step
    tokens = args.batch_size * args.seq_len * args.grad_accum
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return [f"{tokens / rate * 1e3:.0f}ms/r{r}/w{w}" for rate, (r, w) in zip(rates, seen)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--recipes", nargs="+", default=["bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise"])
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--mode", default="reduce-overhead")
    ap.add_argument("--train", action="store_true", help="count in the trainer's steps instead")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches a step, with --train")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("cuda_graph_recordings.py needs a CUDA device")
    device = torch.device("cuda")
    counts: collections.Counter = collections.Counter()
    count_calls(counts)
    for recipe in args.recipes:
        torch._dynamo.reset()
        if args.train:
            print(recipe, "trainer", " ".join(trainer_rows(recipe, args, counts)), flush=True)
            continue
        cfg = get_preset(args.preset, 32000)
        torch.manual_seed(0)
        model = Llama(cfg).to(device)
        apply_recipe(model, recipe, device=device)
        x, y = bench.train_batch(cfg, args.batch_size, args.seq_len, device)
        share_input_scales(model, x[:1])
        step = bench.training_step(model, x, y, compile=False, blocks=True, device=device, mode=args.mode)
        cells = []
        for _ in range(args.steps):
            counts.clear()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize(device)
            ms = (time.perf_counter() - t0) * 1e3
            cells.append(f"{ms:.0f}ms/r{counts['record_function']}/w{counts['run_eager']}")
        print(recipe, " ".join(cells), flush=True)
        del model, step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
