"""fp8_delayed's training step under gradient accumulation: each weight quantized once a step
for all the micro-batches (`prepare_weights(model, micro_batches=n)`, the trainer's
`--delayed-weight-once`) against once a micro-batch (the default), in one process; the
preparation layer by layer in eager mode, and as one compiled function (`compiled=True`).

    PYTHONPATH=src python3 scripts/delayed_once.py --grad-accum 4

On a CUDA device: `llama3-8b-8layers` (vocabulary 32000) with fp32 weights, every block's
Linears under fp8_delayed by the trainer's default policy, compiled block by block (torch.compile's
default mode), the trainer's AdamW, clipping and weight amaxes. A step is `--grad-accum`
micro-batches of `--batch-size` × `--seq-len` random tokens, then the optimizer. The arms
take turns on one model (`--rounds` rounds, `--iters` timed steps an arm a round after
`--warmup`); the medians of their pooled steps, and each arm's peak memory, are printed.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fewerbits.bench import train_batch
from fewerbits.convert import compile_model
from fewerbits.linear import prepare_weights, set_weight_amaxes, share_input_scales
from fewerbits.models import Llama, get_preset
from fewerbits.train.optim import AdamW, clip_coefficient, param_groups
from fewerbits.train.precision import apply_recipe

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--preset", default="llama3-8b-8layers")
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--seq-len", type=int, default=2048)
p.add_argument("--grad-accum", type=int, default=4)
p.add_argument("--iters", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--rounds", type=int, default=2)
args = p.parse_args()

device = torch.device("cuda")
cfg = get_preset(args.preset, 32000)
torch.manual_seed(0)
model = Llama(cfg).to(device)
apply_recipe(model, "fp8_delayed", device=device)
x, y = train_batch(cfg, args.batch_size, args.seq_len, device)
share_input_scales(model, x[:1])
opt = AdamW(param_groups(model, 0.1), lr=1e-5)
params = [q for q in model.parameters() if q.requires_grad]
step_model = compile_model(model, blocks=True)


ARMS = {"every micro-batch": None, "once a step": False, "once a step, compiled preparation": True}


def step(prepared) -> None:
    set_weight_amaxes(model, opt.weight_amax)
    layers = [] if prepared is None else prepare_weights(model, micro_batches=args.grad_accum, compiled=prepared)
    for _ in range(args.grad_accum):
        loss = F.cross_entropy(step_model(x).float().flatten(0, -2), y.reshape(-1))
        (loss / args.grad_accum).backward()
    for m in layers:
        m.release_weight()
    opt.step(grad_scale=clip_coefficient(params, 1.0)[1])
    opt.zero_grad(set_to_none=True)


times = {arm: [] for arm in ARMS}
peaks = dict.fromkeys(ARMS, 0)
for _ in range(args.rounds):
    for arm, prepared in ARMS.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            step(prepared)
            torch.cuda.synchronize()
            if i >= args.warmup:
                times[arm].append((time.perf_counter() - t0) * 1e3)
        peaks[arm] = max(peaks[arm], torch.cuda.max_memory_allocated(device))
tokens = args.batch_size * args.seq_len * args.grad_accum
base = statistics.median(times["every micro-batch"])
for arm in ARMS:
    ms = statistics.median(times[arm])
    print(f"{arm}: {ms:.1f} ms/step ({min(times[arm]):.1f}-{max(times[arm]):.1f}), {tokens / ms * 1e3:,.0f} tokens/s "
          f"({base / ms:.4f}x the first arm's), peak {peaks[arm] / 2**30:.2f} GiB", flush=True)
