"""The `fewerbits` command line. Thin: parse, call the library, print."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from . import __version__
from .convert import COMPILE_MODES, compile_options
from .formats import FORMATS
from .hardware import device_name, native_matmul, resolve_device


def _pow2_text(v: float) -> str:
    m, e = math.frexp(v)
    return f"2^{e - 1}" if m == 0.5 else f"{v:g}"


def format_rows(device: torch.device) -> list[dict]:
    """One dict per format: its layout, derived limits and native support on `device`."""
    rows = []
    for f in FORMATS.values():
        rows.append(
            {
                "format": f.name,
                "bits": f.bits,
                "exp_bits": f.exp_bits,
                "man_bits": f.man_bits,
                "bias": None if f.is_integer else f.bias,
                "max": f.max,
                "min_normal": None if f.is_integer else f.min_normal,
                "min_subnormal": f.min_subnormal,
                "binades": f.binades,
                "inf": f.has_inf,
                "nan": f.has_nan,
                "torch_dtype": str(f.torch_dtype).removeprefix("torch.") if f.torch_dtype else None,
                "native_matmul": native_matmul(f.name, device),
            }
        )
    return rows


def _cell(key: str, v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in ("min_normal", "min_subnormal"):
        return _pow2_text(v)
    if key == "binades":
        return f"{v:.1f}"
    if key == "max":
        return f"{v:.6g}"
    return str(v)


def print_table(rows: list[dict], headers: dict[str, str], out=None) -> None:
    """Plain-text table: `headers` maps row keys to column titles."""
    out = out or sys.stdout
    cells = [[_cell(k, r[k]) for k in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers.values())]
    line = lambda items: "  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(items, widths)))  # noqa: E731
    print(line(list(headers.values())), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for c in cells:
        print(line(c), file=out)


FORMAT_HEADERS = {
    "format": "format",
    "bits": "bits",
    "exp_bits": "E",
    "man_bits": "M",
    "bias": "bias",
    "max": "max",
    "min_normal": "min normal",
    "min_subnormal": "min subnormal",
    "binades": "binades",
    "inf": "inf",
    "nan": "NaN",
    "torch_dtype": "torch dtype",
    "native_matmul": "native matmul",
}


def cmd_formats(args) -> int:
    device = resolve_device(args.device)
    rows = format_rows(device)
    if args.json:
        json.dump({"device": device_name(device), "formats": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"fewerbits {__version__} · torch {torch.__version__} · {device_name(device)}")
    print("Every limit is derived from (exponent bits, mantissa bits, bias, inf/NaN rule).\n")
    print_table(rows, FORMAT_HEADERS)
    print(
        "\nbinades = log2(max / min subnormal). int8/int4 are symmetric (±127, ±7); "
        "e8m0 is the unsigned MX scale format (no zero, 0xFF = NaN).\n"
        "native matmul: tensor-core (or CPU matrix-unit) support on this device; "
        "where it says no, fewerbits emulates."
    )
    return 0


def _field_docs(cls) -> dict[str, str]:
    """The `#:` comment after each field of a dataclass, read from its source."""
    import inspect
    import re

    docs = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*#: (.*)$", line)
        if m:
            docs[m.group(1)] = m.group(2)
    return docs


def _add_config_options(parser: argparse.ArgumentParser, skip=(), defaults=None, helps=None) -> None:
    """One option per TrainConfig field: --name-with-dashes, typed from the annotation."""
    from dataclasses import MISSING, fields

    from .train import TrainConfig

    docs = _field_docs(TrainConfig)
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        default = (defaults or {}).get(f.name, f.default if f.default is not MISSING else None)
        help_ = (helps or {}).get(f.name) or docs.get(f.name, "").replace("%", "%%")
        opt = "--" + f.name.replace("_", "-")
        kind = str(f.type).split("|")[0].strip()
        if kind == "bool":
            if default:
                parser.add_argument(f"--no-{f.name.replace('_', '-')}", dest=f.name, action="store_false", help=f"do not: {help_}")
            else:
                parser.add_argument(opt, action="store_true", help=help_)
            parser.set_defaults(**{f.name: default})
        else:
            typ = {"int": int, "float": float, "str": str}[kind]
            shown = "" if default is None else f" (default {default})"
            parser.add_argument(opt, type=typ, default=default, help=help_ + shown)


def _config_from_args(args, **override):
    from dataclasses import fields

    from .train import TrainConfig

    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    values.update(override)
    return TrainConfig(**values)


def cmd_train(args) -> int:
    from .train import TrainConfig, train

    if args.config_json:
        cfg = TrainConfig.from_dict(json.loads(open(args.config_json).read()))
    else:
        cfg = _config_from_args(args)
    try:
        summary = train(cfg, log=print)
    except KeyboardInterrupt:
        print(f"\ninterrupted: checkpoint written to {cfg.out}/checkpoint (--resume continues)", file=sys.stderr)
        return 130
    print(
        f"{summary['recipe']}: {summary['steps']} steps, final validation loss "
        f"{summary['final_val_loss']:.4f}, {summary['tokens_per_s']:,.0f} tokens/s, "
        f"{summary['skipped_steps']} skipped; {summary['run_dir']}"
    )
    return 0


def cmd_compare(args) -> int:
    import datetime

    from .train import compare

    out = args.out or f"runs/compare-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    cfg = _config_from_args(args, recipe="bf16", out=out)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    try:
        summaries = compare(cfg, recipes, jobs=args.jobs)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished runs and checkpoints are in {out} (--resume continues)", file=sys.stderr)
        return 130
    return 1 if any("error" in s for s in summaries) else 0


def cmd_sample(args) -> int:
    from .train.sample import sample

    print(sample(args.checkpoint, args.prompt, args.tokens, args.temperature, args.top_k, args.seed, args.device))
    return 0


BENCH_RECIPES = "bf16,fp8_tensorwise,fp8_delayed,fp8_rowwise,fp8_blockwise,mxfp8,mxfp4,nvfp4"


def _shape(text: str) -> tuple[int, int, int]:
    try:
        m, k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape MxKxN (tokens x in x out)") from None
    return m, k, n


def cmd_bench(args) -> int:
    from . import bench

    if args.json:  # before anything is measured: a bad path would otherwise fail after the first arm
        _check_output_file(args.json, "--json")
    device = resolve_device(args.device)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    head = bench.header(device, f"`fewerbits {_bench_command(args)} --recipes {','.join(recipes)}`") + (
        f", median of {args.iters} after {args.warmup} warm-up runs")
    if args.what == "train" and args.repeats > 1:
        head += (f" in each of {args.repeats} rounds over the arms in turn (a new model each round), "
                 f"the median of an arm's {args.repeats * args.iters} timed steps")
    if args.what == "gemm":
        rows = bench.bench_gemm(args.preset, recipes, tokens=args.tokens, device=device, iters=args.iters,
                                warmup=args.warmup)
        table = bench.gemm_table(rows)
    elif args.what == "linear":
        rows = bench.bench_linear(args.shapes, recipes, device=device, iters=args.iters, warmup=args.warmup)
        table = bench.linear_table(rows)
    else:
        cfg = bench.TrainBench(preset=args.preset, batch_size=args.batch_size, seq_len=args.seq_len,
                               steps=args.iters, warmup=args.warmup, compile=args.compile, device=str(device),
                               compile_blocks=args.compile_blocks, compile_mode=args.compile_mode,
                               save_quantized_inputs=args.save_quantized_inputs,
                               recompute_weight_values=args.recompute_weight_values, repeats=args.repeats)
        peers = [args.peer] if args.peer else []
        # the arms measured so far are on disk after each one, marked incomplete until the end
        partial = (lambda rows: _write_json(args.json, {"header": head, "complete": False, "rows": rows})
                   ) if args.json else None
        rows = bench.bench_train(cfg, recipes, peers=peers, echo=lambda line: print(line, file=sys.stderr),
                                 on_rows=partial)
        table = bench.train_table(rows)
    print(f"{head}\n\n{table}")
    if args.json:
        _write_json(args.json, {"header": head, "complete": True, "rows": rows})
    return 0


def _bench_command(args) -> str:
    """The bench command line the header names (without --recipes)."""
    if args.what == "gemm":
        return f"bench gemm --preset {args.preset} --tokens {args.tokens}"
    if args.what == "linear":
        return "bench linear --shapes " + " ".join("x".join(map(str, s)) for s in args.shapes)
    return (f"bench train --preset {args.preset} --batch-size {args.batch_size} --seq-len {args.seq_len}"
            + compile_options(args.compile, args.compile_blocks, args.compile_mode)
            + (f" --peer {args.peer}" if args.peer else "") + (f" --repeats {args.repeats}" if args.repeats > 1 else ""))


def _check_output_file(path: str, option: str) -> None:
    """A file a command will write: not a folder, in a folder that exists."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path} is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")


def _write_json(path: str, obj) -> None:
    """Write `obj` to `path` through a temporary file beside it, so that a reader (or a run
    stopped mid-write) sees the previous whole file or the new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def cmd_memory(args) -> int:
    from . import memory

    if args.survey:
        print("The survey's 70B table, line by line under its own accounting (weights and gradients in the "
              "training precision, fp32 Adam states, no master weights), next to the accounting with fp32 "
              "master weights:\n")
        print(memory.survey_table())
        return 0
    shape = [args.params, args.dim, args.layers, args.heads, args.vocab]
    if args.params is not None:
        if None in shape:
            raise ValueError("--params needs --dim, --layers, --heads and --vocab too")
        model = memory.config_from_params(args.params, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                                          vocab_size=args.vocab, n_kv_heads=args.kv_heads)
    else:
        model = args.config or args.preset
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    estimates = [
        memory.estimate_memory(
            model, r, batch_size=args.batch_size, seq_len=args.seq_len, state_dtype=args.state_dtype,
            grad_dtype=args.grad_dtype, fp32_grad_accumulation=args.fp32_grad_accumulation,
            grad_accum=args.grad_accum, checkpointing=args.checkpointing, dp=args.dp, zero=args.zero, tp=args.tp,
            fused_adamw=args.adamw == "fused", save_quantized_input=args.save_quantized_inputs,
            recompute_weight_values=args.recompute_weight_values, delayed_weight_once=args.delayed_weight_once,
        )
        for r in recipes
    ]
    if args.plot:
        memory.plot(estimates, args.plot)
    if args.json:
        out = estimates[0].to_dict() if len(estimates) == 1 else {"estimates": [e.to_dict() for e in estimates]}
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(memory.comparison_table(estimates))
        if args.plot:
            print(f"\nwrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fewerbits", description="Train language models with fewer bits."
    )
    parser.add_argument("--version", action="version", version=f"fewerbits {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("formats", help="print the table of number formats, derived from their layouts")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (for the native-support column)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_formats)

    p = sub.add_parser("train", help="train one model under one recipe")
    _add_config_options(p)
    p.add_argument("--config-json", default=None, help="read every option from this JSON file instead")
    p.set_defaults(func=cmd_train)

    from .train import DEFAULT_RECIPES

    p = sub.add_parser(
        "compare", help="train the same model under several recipes and compare loss, speed and memory"
    )
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), help="comma-separated recipe names; the first is the reference")
    _add_config_options(
        p, skip=("recipe",), defaults={"steps": 100, "out": None},
        helps={"out": "comparison folder, one run folder per recipe inside (default: runs/compare-DATE-TIME)"},
    )
    p.add_argument("--jobs", type=int, default=1,
                   help="recipes trained at once, each in its own process (they share the device, "
                        "so their tokens/s and memory are then not each recipe's alone)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="time each recipe side by side: GEMMs, one Linear, or a training step")
    bench_sub = p.add_subparsers(dest="what", required=True)
    for what, text in (("gemm", "TFLOP/s of each recipe's three GEMMs at a preset's shapes (GEMM alone)"),
                       ("linear", "forward + backward of one Linear per recipe against nn.Linear in bf16"),
                       ("train", "tokens/s and peak memory of a preset's training step per recipe")):
        b = bench_sub.add_parser(what, help=text)
        b.add_argument("--recipes", default=BENCH_RECIPES, help="comma-separated recipe names (bf16 is always measured)")
        b.add_argument("--device", default="auto", help="auto, cpu or cuda")
        b.add_argument("--iters", type=int, default=10, help="timed runs (the median is reported)")
        b.add_argument("--warmup", type=int, default=3, help="untimed runs first")
        b.add_argument("--json", default=None,
                       help="also write the rows to this JSON file (bench train: after each arm too)")
        if what in ("gemm", "train"):
            b.add_argument("--preset", default="tiny", help="model shapes (see fewerbits.models.PRESETS)")
        if what == "gemm":
            b.add_argument("--tokens", type=int, default=8192, help="M: tokens per GEMM")
        if what == "linear":
            b.add_argument("--shapes", type=_shape, nargs="+", default=[(8192, 4096, 4096), (8192, 4096, 14336)],
                           help="MxKxN: tokens x in_features x out_features")
        if what == "train":
            b.add_argument("--batch-size", type=int, default=8, help="sequences per step")
            b.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
            b.add_argument("--compile", action="store_true", help="torch.compile every arm")
            b.add_argument("--compile-blocks", action="store_true",
                           help="torch.compile every arm block by block (one block's compile time)")
            b.add_argument("--compile-mode", choices=COMPILE_MODES, default=None,
                           help="torch.compile's mode for every arm, with --compile or --compile-blocks "
                                "(reduce-overhead: the compiled graphs replayed as CUDA graphs)")
            b.add_argument("--save-quantized-inputs", action="store_true",
                           help="Linears keep their input's quantized column-wise copy for backward (as train's option)")
            b.add_argument("--recompute-weight-values", action="store_true",
                           help="NVFP4: quantize each weight again for backward instead of keeping its values (as train's option)")
            b.add_argument("--peer", choices=["torchao"], default=None,
                           help="also measure this library's FP8 training of the same model")
            b.add_argument("--repeats", type=int, default=1,
                           help="rounds over all the arms in turn, each on a new model (compiled again); "
                                "an arm's figures pool its timed steps, so the table's step range shows "
                                "how much its step varies from one build to the next")
        b.set_defaults(func=cmd_bench)

    p = sub.add_parser("memory", help="estimate the memory per GPU of training a model under each recipe")
    p.add_argument("--preset", default="small", help="model shapes (see fewerbits.models.PRESETS)")
    p.add_argument("--config", default=None, help="a Hugging Face-style config.json instead of a preset")
    p.add_argument("--params", type=int, default=None, help="a parameter count instead (with --dim, --layers, --heads, --vocab)")
    p.add_argument("--dim", type=int, default=None, help="model width, with --params")
    p.add_argument("--layers", type=int, default=None, help="transformer blocks, with --params")
    p.add_argument("--heads", type=int, default=None, help="query heads, with --params")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads, with --params (default: --heads)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary, with --params")
    p.add_argument("--recipes", default="bf16,fp8_tensorwise,fp8_blockwise,mxfp8,nvfp4", help="comma-separated recipes")
    p.add_argument("--batch-size", type=int, default=8, help="micro-batch per GPU (sequences)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--state-dtype", default="float32", help="AdamW states: float32, bfloat16 or 8bit")
    p.add_argument("--grad-dtype", default="float32", help="gradients: float32 or bfloat16")
    p.add_argument("--fp32-grad-accumulation", action="store_true", help="bf16 gradients accumulate into an fp32 buffer")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (above 1, weight copies are kept)")
    p.add_argument("--checkpointing", default="none", help="activation checkpointing: none or block")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size")
    p.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 over --dp (3 = FSDP full sharding)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--save-quantized-inputs", action="store_true",
                   help="Linears keep their input's quantized column-wise copy for backward (train's option)")
    p.add_argument("--recompute-weight-values", action="store_true",
                   help="NVFP4: Linears quantize each weight again for backward instead of keeping its values (train's option)")
    p.add_argument("--delayed-weight-once", action="store_true",
                   help="delayed scaling with --grad-accum above 1: each weight quantized once a step and kept (train's option)")
    p.add_argument("--adamw", choices=["fused", "multi-tensor"], default="fused",
                   help="the optimizer's update: one kernel per parameter (GPU default) or multi-tensor ops (CPU)")
    p.add_argument("--json", action="store_true", help="print JSON: params, total_bytes, items (bytes)")
    p.add_argument("--plot", default=None, help="write a stacked bar per recipe to this PNG")
    p.add_argument("--survey", action="store_true", help="the survey's 70B table next to the full accounting")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("sample", help="generate text from a trained run")
    p.add_argument("--checkpoint", required=True, help="a run folder (or its checkpoint folder)")
    p.add_argument("--prompt", default="def ", help="text to continue")
    p.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.set_defaults(func=cmd_sample)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like (before OSError: it is one)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        print(f"fewerbits: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
