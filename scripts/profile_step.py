"""Where a training step's GPU time goes, per recipe: torch.profiler over a few steps.

    PYTHONPATH=src python3 scripts/profile_step.py [--preset llama3-8b-8layers]
        [--batch-size 4] [--seq-len 2048] [--recipes bf16 fp8_tensorwise] [--steps 2]
        [--top 30] [--trace-dir DIR] [--compile] [--compile-blocks]

A recipe named torchao:tensorwise or torchao:rowwise profiles torchao's float8 training of the
same model (bf16 autocast, the output head left out), as `bench train --peer torchao` runs it.
The step is `fewerbits bench train`'s (forward, cross-entropy, backward, clipping, AdamW);
with --compile the model is compiled as in `bench train --compile` (the optimizer stays eager).
For each recipe it prints the kernels by total GPU time and a summary by kind (GEMM, FP8
GEMM, Triton casts, elementwise/reduction, optimizer, copies), per step, and the host's side:
how long a step takes to enqueue (the call returning, before the GPU is done) and how many
calls in a step synchronize with the GPU (`bench.synchronizing_calls`). A step whose
kernels add up to less than its time, with synchronizations or an enqueue time near the step
time, is waiting on the host, not on the GPU.
"""

import argparse
import re
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import fewerbits.bench as bench
from fewerbits.benchmark import time_ms
from fewerbits.linear import share_input_scales
from fewerbits.models import Llama, get_preset
from fewerbits.train.precision import apply_recipe

KINDS = [  # (kind, pattern on the kernel name), first match wins
    # the fused AdamW is a Triton kernel (named for AdamW, not "adam": "_hadamard_" holds that)
    ("optimizer", r"foreach|multi_tensor|adamw"),
    ("triton", r"^triton_|_kernel$"),  # inductor names a kernel by its ops, "_scaled_mm" too
    ("fp8 gemm", r"^nvjet_sm90_q|f8|e4m3|fp8|scaled_mm|Float8"),  # cuBLAS's nvjet "q": FP8 operands
    ("gemm", r"gemm|cutlass|sm90_xmma|nvjet|wgmma|cublas"),
    ("copy", r"copy|Memcpy|Memset|cat|fill"),
    ("flash/attention", r"flash|fmha|attention|sdpa"),
]


def kind(name: str) -> str:
    for k, pat in KINDS:
        if re.search(pat, name, re.I):
            return k
    return "elementwise/reduction/other"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama3-8b-8layers")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--recipes", nargs="+", default=["bf16", "fp8_tensorwise"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--compile", action="store_true", help="torch.compile the model, as bench train --compile")
    p.add_argument("--compile-blocks", action="store_true", help="compile block by block, as bench train --compile-blocks")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    model_cfg = get_preset(args.preset, bench.TrainBench.vocab_size)
    x, y = bench.train_batch(model_cfg, args.batch_size, args.seq_len, device)
    for recipe in args.recipes:
        bench._free(device)
        profile_recipe(recipe, model_cfg, x, y, args, device)
    return 0


def profile_recipe(recipe, model_cfg, x, y, args, device):
    torch.manual_seed(0)
    model = Llama(model_cfg).to(device)
    autocast = recipe.startswith("torchao:")
    if autocast:
        bench._torchao_convert(model, recipe.split(":", 1)[1])
    else:
        apply_recipe(model, recipe, device=device)
    share_input_scales(model, x[:1])  # as bench train and the trainer: delayed scaling's shared input scales
    compiled = args.compile or args.compile_blocks
    step = bench.training_step(model, x, y, compile=args.compile, device=device, autocast=autocast,
                               blocks=args.compile_blocks)
    wall = time_ms(step, 5, args.warmup, device)
    enqueue_ms, syncs = host_side(step)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = e.self_device_time_total
        # (a user annotation such as "Optimizer.step#AdamW.step" spans kernels: not one itself)
        if e.device_type == torch.autograd.DeviceType.CUDA and t > 0 and "#" not in e.key:
            rows.append((t / args.steps / 1e3, e.count // args.steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n=== {recipe}{' (compiled)' if compiled else ''}: {total:.1f} ms of kernels per step, {wall:.1f} ms per step "
          "(median of 5) ===")
    by_kind: dict[str, float] = {}
    for ms, _, name in rows:
        by_kind[kind(name)] = by_kind.get(kind(name), 0.0) + ms
    for k, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {k:30s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    print(f"  host: {enqueue_ms:.1f} ms to enqueue a step (median of 5), {len(syncs)} synchronizing calls in a step"
          + (f"; the first: {syncs[0][:100]}" if syncs else ""))
    print(f"  top {args.top} kernels (ms/step, calls/step, name):")
    for ms, n, name in rows[: args.top]:
        print(f"  {ms:8.2f} {n:5d}  {name[:150]}")
    if args.trace_dir:
        prof.export_chrome_trace(f"{args.trace_dir}/{recipe}.json")
    if compiled:
        torch._dynamo.reset()


def host_side(step) -> tuple[float, list[str]]:
    """(median ms for `step()` to return, its GPU work still queued; the warnings of the calls in
    one step that synchronized with the GPU)."""
    enqueue = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        enqueue.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(enqueue), bench.synchronizing_calls(step)


if __name__ == "__main__":
    main()
