"""Which operations of a compiled training step read each Linear's fp32 weight, per recipe.

    PYTHONPATH=src python3 scripts/weight_reads.py [--recipes fp8_delayed fp8_tensorwise bf16]

The step is `bench train`'s (bench.training_step: the model compiled block by block by
`compile_model`, fp32 master weights, the trainer's AdamW with the weights' amaxes given to the
quantizers: on a CPU, where AdamW is not the fused kernel, `set_weight_amaxes` reduces each
weight for its amax outside the graphs) on a one-block Llama small enough for a CPU (width 256,
SwiGLU 768, 4 heads, 2 KV heads). Inductor's graphs are read after its own passes (its
`post_grad_custom_post_pass`), the ones it turns into kernels: for every 2-D fp32 input of a
graph at least 128 on a side (the block's weights), the operations that read it through views,
each with the library function that made it (the last frame in linear.py, and the one in the
module that made the operation; operations alike from one place listed once), or "kept for
backward" where the forward graph returns it for the backward graph. A weight read by a cast in
the forward graph and again in the backward graph is read from fp32 twice a step; how inductor
then groups those reads into kernels depends on its backend (the CPU's C++ kernels fuse more
than a GPU's Triton ones), so this counts passes the graph asks for, not kernels.
"""

import argparse
import re

import torch
import torch._inductor.config as inductor_config

import fewerbits.bench as bench
from fewerbits.linear import share_input_scales
from fewerbits.models import Llama, ModelConfig
from fewerbits.train.precision import apply_recipe

VIEWS = {"permute", "view", "reshape", "t", "expand", "alias", "_unsafe_view", "transpose", "squeeze", "unsqueeze"}
FRAME = re.compile(r'File "[^"]*fewerbits/([^"]+)", line (\d+), in (\w+)')


def readers(graph) -> list[tuple[tuple[int, ...], list[str]]]:
    """For each 2-D fp32 input of `graph` at least 128 on a side (the block's weights): its shape
    and the operations reading it (through views)."""
    rows = []
    for w in graph.nodes:
        val = w.meta.get("val")
        if (w.op != "placeholder" or not isinstance(val, torch.Tensor) or val.dtype != torch.float32
                or val.dim() != 2 or min(val.shape) < 128):  # not a weight: a history, a scale, a rotary table
            continue
        found, todo = [], list(w.users)
        while todo:
            u = todo.pop()
            name = getattr(u.target, "__name__", str(u.target)).split(".")[0]
            if u.op == "call_function" and name in VIEWS:
                todo += list(u.users)
                continue
            if u.op == "output":
                found.append("kept for backward")
                continue
            frames = FRAME.findall(u.meta.get("stack_trace") or "")
            caller = [f"{fn}:{line} {func}" for fn, line, func in frames if fn == "linear.py"][-1:]
            where = [f"{fn}:{line} {func}" for fn, line, func in frames[-1:]]
            shown = caller + [f for f in where if f not in caller]
            found.append(f"{name} ({', '.join(shown) or 'no library frame'})")
        rows.append((tuple(val.shape), sorted(set(found))))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=["fp8_delayed", "fp8_tensorwise", "bf16"])
    args = p.parse_args(argv)
    cfg = ModelConfig(dim=256, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=768, vocab_size=512, max_seq_len=64)
    device = torch.device("cpu")
    for recipe in args.recipes:
        graphs = []
        torch._dynamo.reset()
        with inductor_config.patch(post_grad_custom_post_pass=lambda g: graphs.append(readers(g)),
                                   fx_graph_cache=False):
            torch.manual_seed(0)
            model = Llama(cfg)
            apply_recipe(model, recipe)
            x, y = bench.train_batch(cfg, 2, 64, device)
            if recipe == "fp8_delayed":
                share_input_scales(model, x)
            step = bench.training_step(model, x, y, compile=False, blocks=True, device=device)
            step()
            step()
        print(f"{recipe}:")
        for name, rows in zip(("forward", "backward"), graphs):
            print(f"  {name} graph")
            for shape, found in rows:
                print(f"    fp32 {list(shape)}: " + "; ".join(found))


if __name__ == "__main__":
    main()
