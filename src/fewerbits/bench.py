"""`fewerbits bench`: what each recipe costs in time and memory, measured side by side.

    bench gemm     the model's GEMM shapes: each recipe's three GEMMs on operands quantized
                   beforehand (the GEMM alone), TFLOP/s next to bf16's
    bench linear   one Linear's forward + backward per recipe against nn.Linear in bf16,
                   quantization included
    bench train    a preset's training step under each recipe (optionally compiled, whole
                   or block by block):
                   tokens/s, peak memory and the first step's time (with --compile, mostly
                   compilation); `--peer torchao` adds torchao's float8 training of the same
                   model in the same process

Every arm runs in one process on one device, one after the other, with the same inputs; a
time is the median of `iters` runs after `warmup` runs (CUDA events on a GPU, the wall clock on
a CPU). Ratios between arms of one run are the numbers to compare; absolute times depend on
the machine. `bench train` also gives each arm's fastest and slowest timed step; the host's
median time to enqueue a step (on a GPU, a host time near the step's time says the step was
bound by the host, or waited on the GPU inside); and with `repeats` goes over all its arms that
many times in turn (a new model and compilation each time), pooling each arm's timed steps: a
step that varies from one build of the model to the next shows in that range, where one round
of timed steps can hide it. The baseline of `bench train` is the `bf16` recipe: fp32 master
weights, bf16 compute, the trainer's AdamW. A training step here is the trainer's: forward,
cross-entropy, backward, gradient clipping at norm 1, AdamW step.

`--compile-mode` passes torch.compile's mode to every compiled arm; "reduce-overhead" replays
the compiled graphs (each block's forward and backward with `--compile-blocks`) as CUDA graphs,
so the host launches a graph instead of each of its kernels. Their memory is allocated when
they are recorded (a warm-up step), so an arm's peak memory is that step's; the JSON's
`peak_reserved_bytes` (every arm's peak of the allocator's reserved memory) also counts the
graphs' memory pools, which replays keep whether or not the allocator sees a tensor in them.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .benchmark import time_ms, time_samples
from .convert import check_compile_mode, compile_model, uses_cuda_graphs
from .hardware import device_name, resolve_device
from .recipes import Recipe, get_recipe

PEERS = ("torchao",)


def header(device: torch.device, what: str) -> str:
    return (f"{what}: {device_name(device)}, torch {torch.__version__}, "
            f"{datetime.date.today().isoformat()}")


def _recipes(names) -> list[Recipe]:
    recipes = [get_recipe(n) for n in names]  # unknown names fail here, with the valid list
    if len({r.name for r in recipes}) != len(recipes):
        raise ValueError("each recipe may appear once")
    return recipes


def linear_shapes(preset: str, tokens: int, vocab_size: int = 8192) -> list[tuple[str, int, int, int]]:
    """(names, M, K, N) of the distinct Linear shapes a preset's converted blocks hold."""
    from .models import Llama, get_preset

    if tokens < 1:
        raise ValueError("tokens must be at least 1")
    with torch.device("meta"):
        model = Llama(get_preset(preset, vocab_size))
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name != "lm_head":
            shapes.setdefault((m.in_features, m.out_features), []).append(name.rsplit(".", 1)[-1])
    return [("/".join(sorted(set(names))), tokens, k, n) for (k, n), names in shapes.items()]


# -- gemm ---------------------------------------------------------------------------------------


def bench_gemm(preset: str, recipes, *, tokens: int = 8192, device="auto", iters: int = 10,
               warmup: int = 3) -> list[dict]:
    """TFLOP/s of each recipe's fprop, dgrad and wgrad GEMMs at the preset's shapes.

    Operands are quantized before the clock starts; an emulated GEMM's time includes the
    dequantization it needs. `*_vs_bf16` is bf16's time over the recipe's (above 1: faster).
    """
    from .kernels import quantize
    from .linear import _matmul

    device = resolve_device(device)
    recipes = _recipes(recipes)
    rows = []
    for names, m, k, n in linear_shapes(preset, tokens):
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
        w = torch.randn(n, k, generator=gen).to(device, torch.bfloat16)
        g = torch.randn(m, n, generator=gen).to(device, torch.bfloat16)
        # (a, b) of A · Bᵀ per GEMM, from the high-precision tensors along the inner dimension
        operands = {"fprop": ((x, 1), (w, 1)), "dgrad": ((g, 1), (w, 0)), "wgrad": ((g, 0), (x, 0))}
        flops = 2 * m * k * n
        for recipe in [get_recipe("bf16"), *[r for r in recipes if r.name != "bf16"]]:
            row = {"shape": f"{m}x{k}x{n}", "linears": names, "recipe": recipe.name}
            for gemm_name, ((ta, axa), (tb, axb)) in operands.items():
                gemm = getattr(recipe, gemm_name)

                def prep(t, axis, op):
                    if op.scheme is None:
                        return (t if axis == 1 else t.t()).contiguous().to(recipe.compute_dtype)
                    return quantize(t, op.scheme, axis=axis)

                a, b = prep(ta, axa, gemm.a), prep(tb, axb, gemm.b)
                ms = time_ms(lambda: _matmul(a, b, torch.bfloat16, recipe, "auto", gemm), iters, warmup, device)
                row[f"{gemm_name}_ms"] = ms
                row[f"{gemm_name}_tflops"] = flops / ms / 1e9
            rows.append(row)
    base = {r["shape"]: r for r in rows if r["recipe"] == "bf16"}
    for r in rows:
        for gemm_name in ("fprop", "dgrad", "wgrad"):
            r[f"{gemm_name}_vs_bf16"] = base[r["shape"]][f"{gemm_name}_ms"] / r[f"{gemm_name}_ms"]
    return rows


# -- linear -------------------------------------------------------------------------------------


def gemm_paths(recipe: Recipe, m: int, k: int, n: int, device) -> str:
    """How the recipe's GEMMs run at this shape here: "native", "emulated", the compute
    dtype's GEMMs, or fprop/dgrad/wgrad when they differ."""
    from .gemm import native_reason
    from .quantize import quantize

    if not recipe.quantized:
        return f"{str(recipe.compute_dtype).removeprefix('torch.')} GEMMs"
    paths = []
    for gemm, (ra, ca, rb, cb) in ((recipe.fprop, (m, k, n, k)), (recipe.dgrad, (m, n, k, n)),
                                   (recipe.wgrad, (n, m, k, m))):
        if gemm.a.scheme is None or gemm.b.scheme is None:
            paths.append("hp")
            continue
        qa = quantize(torch.zeros(ra, ca, device=device), gemm.a.scheme)
        qb = quantize(torch.zeros(rb, cb, device=device), gemm.b.scheme)
        paths.append("native" if native_reason(qa, qb) is None else "emulated")
    return paths[0] if len(set(paths)) == 1 else "/".join(paths)



def bench_linear(shapes, recipes, *, device="auto", iters: int = 10, warmup: int = 3) -> list[dict]:
    """Forward + backward of one Linear (M×K input, N outputs) per recipe vs nn.Linear in bf16."""
    device = resolve_device(device)
    recipes = _recipes(recipes)
    rows = []
    for m, k, n in shapes:
        if min(m, k, n) < 1:
            raise ValueError(f"shape {m}x{k}x{n}: every size must be at least 1")
        rows += _bench_linear_shape(m, k, n, recipes, device, iters, warmup)
        _free(device)  # this shape's tensors went with the call
    return rows


def _bench_linear_shape(m: int, k: int, n: int, recipes, device, iters: int, warmup: int) -> list[dict]:
    from .linear import QuantizedLinear

    torch.manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(m, n, device=device, dtype=torch.bfloat16)

    def step(layer):
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x).backward(g)

    shape = f"{m}x{k}x{n}"
    base = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    t_base = time_ms(lambda: step(base), iters, warmup, device)
    rows = [{"shape": shape, "recipe": "nn.Linear (bf16)", "path": "bf16 GEMMs", "ms": t_base, "vs_bf16": 1.0}]
    master = nn.Linear(k, n, bias=False, device=device)  # fp32 master weights, as in training
    for recipe in recipes:
        layer = QuantizedLinear.from_linear(master, recipe)
        ms = time_ms(lambda: step(layer), iters, warmup, device)
        rows.append({"shape": shape, "recipe": recipe.name, "path": gemm_paths(recipe, m, k, n, device),
                     "ms": ms, "vs_bf16": ms / t_base})
    return rows


# -- train --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainBench:
    preset: str = "tiny"
    batch_size: int = 8
    seq_len: int = 128
    steps: int = 10  #: timed steps (the median is reported)
    warmup: int = 3
    repeats: int = 1  #: rounds over every arm in turn, each arm's timed steps pooled
    compile: bool = False
    compile_blocks: bool = False  #: compile each transformer block instead of the whole model
    compile_mode: str | None = None  #: torch.compile's mode for every arm (with compile or compile_blocks)
    vocab_size: int = 8192
    device: str = "auto"
    save_quantized_inputs: bool = False  #: as the trainer's option (recipes' arms only)
    recompute_weight_values: bool = False  #: as the trainer's option (recipes' arms only)


def bench_train(cfg: TrainBench, recipes, *, peers=(), echo=lambda line: None, on_rows=None) -> list[dict]:
    """Tokens/s and peak memory of a training step of `cfg.preset` under each recipe (and each
    peer), all in this process; the bf16 recipe is measured first as the baseline. With
    `cfg.repeats` > 1 the arms are measured that many times in turn (bf16, the recipes, the
    peers, then again), each time on a new model, compiled again; an arm's figures come from
    all its timed steps (its peak memory is the largest). on_rows, if given, gets the rows
    measured so far after each arm (a long run stopped early keeps them)."""
    from .models import get_preset

    device = resolve_device(cfg.device)
    recipes = _recipes(recipes)
    for peer in peers:
        if peer not in PEERS:
            raise ValueError(f"unknown peer {peer!r}; valid peers: {', '.join(PEERS)}")
    if "torchao" in peers:
        _require_torchao()
    if cfg.steps < 1 or cfg.warmup < 0 or cfg.batch_size < 1 or cfg.seq_len < 1 or cfg.repeats < 1:
        raise ValueError("steps, repeats, batch_size and seq_len must be at least 1, warmup at least 0")
    check_compile_mode(cfg.compile_mode, cfg.compile or cfg.compile_blocks)
    model_cfg = get_preset(cfg.preset, cfg.vocab_size)
    if cfg.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"seq_len {cfg.seq_len} exceeds preset {cfg.preset}'s max_seq_len {model_cfg.max_seq_len}")
    x, y = train_batch(model_cfg, cfg.batch_size, cfg.seq_len, device)

    arms = [("bf16", None)] + [(r.name, None) for r in recipes if r.name != "bf16"]
    if "torchao" in peers:
        arms += [("torchao tensorwise", "tensorwise"), ("torchao rowwise", "rowwise")]
    rows: dict[str, dict] = {}  # by arm, in the arms' order
    for _ in range(cfg.repeats):
        for name, torchao_recipe in arms:
            rows[name] = _train_arm(cfg, name, torchao_recipe, model_cfg, x, y, device, rows.get(name))
            base = rows["bf16"]
            for row in rows.values():  # bf16's figures change with each of its rounds
                row["vs_bf16"] = row["tokens_per_s"] / base["tokens_per_s"]
                row["memory_vs_bf16"] = (row["peak_memory_bytes"] / base["peak_memory_bytes"]
                                         if base["peak_memory_bytes"] else None)
            row = rows[name]
            echo(f"{name}: {statistics.median(row['step_ms'][-1]):.1f} ms/step (round {len(row['step_ms'])}), "
                 f"{row['tokens_per_s']:,.0f} tokens/s over its rounds, first step {row['first_step_s']:.1f} s")
            if on_rows is not None:
                on_rows(list(rows.values()))
    return list(rows.values())


def _train_arm(cfg: TrainBench, name: str, torchao_recipe, model_cfg, x, y, device, row: dict | None) -> dict:
    """One round of one arm of `bench_train`: its row, with this round's timed steps added to
    those of `row` (the arm's earlier rounds), or a new row."""
    from .linear import share_input_scales
    from .models import Llama

    _free(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    model = Llama(model_cfg).to(device)
    autocast = False
    if torchao_recipe is None:
        from .convert import Policy
        from .train.precision import apply_recipe

        policy = Policy(save_quantized_input=cfg.save_quantized_inputs,
                        recompute_weight_values=cfg.recompute_weight_values)
        apply_recipe(model, name, policy, device=device)
    else:
        _torchao_convert(model, torchao_recipe)
        autocast = True
    share_input_scales(model, x[:1])  # as the trainer: delayed scaling's shared input scales
    first_s, times, host = _time_training(model, x, y, cfg, device, autocast)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    reserved = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
    del model
    if row is None:  # the first round: its first step is the one that compiles
        row = {"recipe": name, "first_step_s": first_s, "peak_memory_bytes": peak, "peak_reserved_bytes": reserved,
               "step_ms": [], "host_ms": []}
    elif peak is not None:
        row["peak_memory_bytes"] = max(row["peak_memory_bytes"], peak)
        row["peak_reserved_bytes"] = max(row["peak_reserved_bytes"], reserved)
    row["step_ms"].append(times)
    row["host_ms"].append(host)
    pooled = [t for round_ in row["step_ms"] for t in round_]
    ms = statistics.median(pooled)
    row.update(ms_per_step=ms, ms_min=min(pooled), ms_max=max(pooled),
               host_ms_per_step=statistics.median(t for round_ in row["host_ms"] for t in round_),
               tokens_per_s=cfg.batch_size * cfg.seq_len / ms * 1e3)
    return row


def train_batch(model_cfg, batch_size: int, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) every `bench train` step uses: seeded random tokens on `device`."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, model_cfg.vocab_size, (batch_size, seq_len + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def _time_training(model, x, y, cfg: TrainBench, device, autocast: bool) -> tuple[float, list[float], list[float]]:
    """(seconds of the first step, compilation included; ms of each timed step; ms of the host
    each timed step took to return, `time_samples`'s host). The first step is one of the
    `warmup` steps when there are any, and never a timed one."""
    step = training_step(model, x, y, compile=cfg.compile, device=device, autocast=autocast,
                         blocks=cfg.compile_blocks, mode=cfg.compile_mode)
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_s = time.perf_counter() - t0
    host: list[float] = []
    return first_s, time_samples(step, cfg.steps, max(cfg.warmup - 1, 0), device, host), host


def training_step(model, x, y, *, compile: bool, device, autocast: bool = False, blocks: bool = False,
                  mode: str | None = None):
    """The step `bench train` times, as a function: forward (compiled with `compile_model` if
    asked, block by block with `blocks`, in torch.compile's `mode` if given; the optimizer stays
    eager), cross-entropy, backward, clipping and the trainer's AdamW, as the trainer runs them
    (the clipping coefficient applied by AdamW as it reads each gradient, the weights' amaxes
    that its kernel finds given to the quantizers: `set_weight_amaxes`). Under a mode that
    replays CUDA graphs, each step begins a new iteration of them
    (`torch.compiler.cudagraph_mark_step_begin`): the previous step's outputs are done with."""
    from .linear import set_weight_amaxes
    from .train.optim import AdamW, clip_coefficient, param_groups

    check_compile_mode(mode, compile or blocks)
    opt = AdamW(param_groups(model, 0.1), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = {"mode": mode} if mode is not None else {}
    step_model = compile_model(model, blocks=blocks, **kwargs) if compile or blocks else model
    graphs = uses_cuda_graphs(mode)

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        set_weight_amaxes(model, opt.weight_amax)  # as the trainer: the weights' amaxes from AdamW
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            logits = step_model(x).float().flatten(0, -2)
        loss = F.cross_entropy(logits, y.reshape(-1))
        del logits  # as the trainer: no name holds the logits through backward
        loss.backward()
        opt.step(grad_scale=clip_coefficient(params, 1.0)[1])  # clipping, applied as AdamW reads
        opt.zero_grad(set_to_none=True)

    return step


def synchronizing_calls(fn) -> list[str]:
    """Run fn() once and return the warnings of the calls in it that made the host wait for a
    CUDA device (`torch.cuda.set_sync_debug_mode`): a host-to-device copy of a constant or a
    device value read on the host. A step that makes any stalls the GPU every time it runs.
    Without CUDA nothing can wait for it: fn runs and the list is empty."""
    if not torch.cuda.is_available():
        fn()
        return []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


def _require_torchao():
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "--peer torchao needs torchao (pip install torchao; torchao 0.17.0 matches torch 2.11)"
        ) from None


def _torchao_convert(model: nn.Module, recipe: str) -> None:
    """torchao's float8 training on every Linear but the output head (its documented use)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn != "lm_head")


def _free(device: torch.device) -> None:
    torch._dynamo.reset()  # compiled arms: drop their graphs (and the tensors they hold)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- tables -------------------------------------------------------------------------------------


def gemm_table(rows: list[dict]) -> str:
    lines = ["| shape (M×K×N) | Linears | recipe | fprop TFLOP/s | dgrad TFLOP/s | wgrad TFLOP/s | speed vs bf16 (fprop / dgrad / wgrad) |",
             "|---|---|---|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['linears']} | {r['recipe']} | {r['fprop_tflops']:.3g} | {r['dgrad_tflops']:.3g} | "
            f"{r['wgrad_tflops']:.3g} | {r['fprop_vs_bf16']:.2f} / {r['dgrad_vs_bf16']:.2f} / {r['wgrad_vs_bf16']:.2f} |")
    return "\n".join(lines)


def linear_table(rows: list[dict]) -> str:
    lines = ["| shape (M×K×N) | recipe | GEMM path | fwd+bwd ms | × nn.Linear bf16 |", "|---|---|---|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['recipe']} | {r['path']} | {r['ms']:.3f} | {r['vs_bf16']:.2f} |")
    return "\n".join(lines)


def train_table(rows: list[dict]) -> str:
    lines = ["| recipe | ms/step | fastest–slowest step ms | host ms/step | tokens/s | × bf16 tokens/s | peak memory "
             "| × bf16 memory | first step s |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        mem = f"{r['peak_memory_bytes'] / 2**30:.2f} GiB" if r["peak_memory_bytes"] is not None else "n/a (CPU)"
        mem_ratio = f"{r['memory_vs_bf16']:.3f}" if r["memory_vs_bf16"] is not None else "n/a"
        lines.append(f"| {r['recipe']} | {r['ms_per_step']:.1f} | {r['ms_min']:.1f}–{r['ms_max']:.1f} | "
                     f"{r['host_ms_per_step']:.1f} | {r['tokens_per_s']:,.0f} | {r['vs_bf16']:.3f} | {mem} | "
                     f"{mem_ratio} | {r['first_step_s']:.1f} |")
    return "\n".join(lines)
