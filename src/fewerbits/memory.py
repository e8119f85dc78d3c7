"""How much memory a training run takes per GPU, before it starts.

`estimate_memory(model, recipe, ...)` itemises the bytes a fewerbits training step holds, for
the trainer's Llama model (a preset, a Hugging Face-style config, or shapes you give):

    master weights       fp32, every parameter (the optimizer steps on them)
    gradients            fp32 (or bf16; with an fp32 accumulation buffer if asked)
    optimizer states     AdamW: two per parameter in fp32, bf16 or 8 bits (+ block scales),
                         and a step counter per parameter tensor
    kept weight copies   the quantized (or bf16) weight operands reused between micro-batches
                         when gradients accumulate (QuantizedLinear.cache_weight)
    recipe state         delayed scaling's amax histories (3 × 1024 fp32 per Linear)
    model buffers        the rotary tables
    activations          what autograd saves for backward, counted from the model's own
                         operations (below), one item per dtype (the compute dtype, fp32,
                         int64; `per_block` holds one block's); with per-block checkpointing,
                         each block's input plus one block's activations
    logits and loss      at the start of backward, the log-softmax output and the two fp32
                         gradients made from it: 12 bytes per token per vocabulary entry
    optimizer temporaries  none with the fused AdamW kernel (GPU); with the multi-tensor
                         path (CPU), two fp32 temporaries per parameter of the largest group

The peak is the larger of two moments: the start of backward (weights, states, activations,
logits) and the optimizer step (weights, gradients, states, temporaries). Everything but the
activations and the two transient items is exact for the trainer's model: it is the sum of the
real tensors (tests build them and compare). Activations per block, T = batch × sequence tokens,
d model width, f MLP width, H query heads, c bytes of the compute dtype:

    each RMSNorm (×2)   x in fp32 (4Td), x·rsqrt (4Td), rsqrt (4T)
    attention           the q/k/v input (cTd), q, k, v after rotary and head repetition (3cTd),
                        the attention output (cTd), its log-sum-exp (4TH), o_proj's input (cTd)
    SwiGLU              its input (cTd), gate output, silu output, up output, down input (4cTf)

A Linear saves its compute-dtype input (quantization happens on the fly) — except under
per-tensor FP8, where it saves the input's forward codes (1 byte per element and a 4-byte
scale), and with `save_quantized_input`, where it saves the column-wise quantized copy (codes
and block scales). Under NVFP4 (16x16-block weights, emulated on bf16 values on a GPU) a Linear
also keeps its weight's forward values (2 bytes per weight and a 4-byte tensor scale) for the
input-gradient GEMM, which multiplies them transposed instead of quantizing the weight again,
unless `recompute_weight_values` asks for the latter. Data parallelism shards states (ZeRO-1),
plus gradients (ZeRO-2), plus master weights (ZeRO-3 / FSDP); tensor parallelism splits the
block and vocabulary matrices and the activations inside attention and the MLP (Megatron
style, no sequence parallelism).
Mixture-of-experts activations assume even routing.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .models import ModelConfig, PRESETS, get_preset
from .recipes import Recipe, get_recipe
from .schemes import get_scheme

GiB = 2**30
STATE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "8bit": 1.0 + 4 / 2048}  # 8-bit: fp32 absmax per 2048
GRAD_BYTES = {"float32": 4, "bfloat16": 2}
CHECKPOINTING = ("none", "block")
RESIDENT = ("master weights (fp32)", "optimizer states", "kept weight copies", "recipe state (amax histories)",
            "model buffers", "fp32 gradient accumulation")
PHASE_ITEMS = {  # what is alive at each peak candidate
    "start of backward": RESIDENT + ("activations", "logits and loss"),
    "optimizer step": RESIDENT + ("gradients", "optimizer temporaries"),
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, itemised; `total_bytes` is the estimated peak."""

    model: str
    recipe: str
    params: int  #: parameters of the whole model (unsharded)
    items: dict[str, int]  #: item → bytes per GPU
    phases: dict[str, int]  #: the two peak candidates → bytes
    total_bytes: int
    settings: dict = field(default_factory=dict)
    per_block: dict = field(default_factory=dict)  #: one block's saved activations, dtype → bytes

    @property
    def activations(self) -> int:
        """All saved activations (the `activations, <dtype>` items together)."""
        return sum(b for k, b in self.items.items() if k.startswith("activations"))

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        width = max(len(k) for k in self.items)
        lines = [f"{self.model}, recipe {self.recipe}: {self.params:,} parameters; "
                 + ", ".join(f"{k} {v}" for k, v in self.settings.items()), ""]
        for name, b in self.items.items():
            lines.append(f"  {name:<{width}}  {b / GiB:10.3f} GiB  {b / max(self.params, 1):8.2f} B/param")
        block = ", ".join(f"{b / GiB:.3f} GiB {k}" for k, b in self.per_block.items())
        lines.append(f"  {'one block saves':<{width}}  {block}")
        for name, b in self.phases.items():
            lines.append(f"  {'at ' + name:<{width}}  {b / GiB:10.3f} GiB")
        lines.append(f"  {'peak per GPU':<{width}}  {self.total_bytes / GiB:10.3f} GiB")
        return "\n".join(lines)


# -- the model's shapes -------------------------------------------------------------------------


def model_config(model) -> tuple[str, ModelConfig]:
    """(name, ModelConfig) from a preset name, a ModelConfig, a Hugging Face-style config dict,
    or the path of such a JSON file."""
    if isinstance(model, ModelConfig):
        if model.vocab_size is None:
            raise ValueError("the ModelConfig has no vocab_size")
        return "custom", model
    if isinstance(model, str) and model in PRESETS:
        return model, get_preset(model, 8192 if PRESETS[model].vocab_size is None else None)
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.exists():
            raise ValueError(f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor a config file")
        try:
            model = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path} is not JSON: {e}") from None
        return path.name, from_hf_config(model)
    if isinstance(model, dict):
        return "config", from_hf_config(model)
    raise TypeError("model must be a preset name, a ModelConfig, a config dict or a JSON path")


def from_hf_config(c: dict) -> ModelConfig:
    """A ModelConfig from Hugging Face Llama/Mixtral-style keys (or fewerbits' own).

    The estimate is for fewerbits' Llama, whose output head is its own matrix: for a config
    with tied embeddings it counts vocab × hidden parameters more than the original model."""
    def get(*names, default=None):
        for n in names:
            if n in c and c[n] is not None:
                return c[n]
        if default is None:
            raise ValueError(f"the config lacks {names[0]!r}")
        return default

    dim = get("hidden_size", "dim")
    heads = get("num_attention_heads", "n_heads")
    cfg = dict(
        dim=dim, n_layers=get("num_hidden_layers", "n_layers"), n_heads=heads,
        n_kv_heads=get("num_key_value_heads", "n_kv_heads", default=heads),
        ffn_dim=get("intermediate_size", "ffn_dim"), vocab_size=get("vocab_size"),
        max_seq_len=get("max_position_embeddings", "max_seq_len", default=2048),
        n_experts=get("num_local_experts", "n_experts", default=0),
        top_k=get("num_experts_per_tok", "top_k", default=2),
    )
    for k, v in cfg.items():
        if not isinstance(v, int) or (v < 1 and k != "n_experts") or v < 0:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    return ModelConfig(**cfg)


def config_from_params(params: int, *, dim: int, n_layers: int, n_heads: int, vocab_size: int,
                       n_kv_heads: int | None = None) -> ModelConfig:
    """The dense ModelConfig with this parameter count and layer shape (the MLP width solves
    for the rest, rounded to a multiple of 64)."""
    kv = n_kv_heads or n_heads
    hd = dim // n_heads if n_heads else 0
    if min(params, dim, n_layers, n_heads, vocab_size, kv) < 1:
        raise ValueError("params, dim, layers, heads and vocabulary must be positive")
    fixed = 2 * vocab_size * dim + dim + n_layers * (2 * dim * n_heads * hd + 2 * dim * kv * hd + 2 * dim)
    ffn = (params - fixed) / (3 * dim * n_layers)
    if ffn < 1:
        raise ValueError(f"{params:,} parameters do not fill {n_layers} layers of width {dim} "
                         f"with a vocabulary of {vocab_size} (embeddings and attention alone take {fixed:,})")
    return ModelConfig(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=kv,
                       ffn_dim=max(64, round(ffn / 64) * 64), vocab_size=vocab_size)


TP_SPLIT = ("embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
COLUMN_SPLIT = ("embed_tokens", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")  # out_features


@dataclass
class Inventory:
    """What the trainer's model holds under a recipe, read off the model built on the meta device."""

    params: list  #: (name, numel, split by tensor parallelism, index of its AdamW parameter group)
    buffers: int  #: bytes of the model's own buffers (rotary tables)
    recipe_state: int  #: bytes of the recipe's buffers (delayed scaling's amax histories)
    linears: list  #: (name, in_features, out_features, the recipe the layer runs)
    quantized_blocks: int  #: blocks whose Linears run the recipe (the others: its compute dtype)


def inventory(cfg: ModelConfig, recipe: Recipe) -> Inventory:
    import torch

    from .linear import QuantizedLinear
    from .models import Llama
    from .train.precision import apply_recipe

    with torch.device("meta"):
        model = Llama(cfg)
    apply_recipe(model, recipe)
    from .train.optim import param_groups

    group_of = {id(p): i for i, g in enumerate(param_groups(model, 0.1)) for p in g["params"]}
    params = [(n, p.numel(), n.split(".")[-2] in TP_SPLIT, group_of[id(p)]) for n, p in model.named_parameters()]
    state = sum(b.nbytes for n, b in model.named_buffers() if ".delayed_scaling." in n)
    buffers = sum(b.nbytes for n, b in model.named_buffers() if ".delayed_scaling." not in n)
    linears = [(n, m.in_features, m.out_features, m.recipe) for n, m in model.named_modules()
               if isinstance(m, QuantizedLinear)]
    quantized = sum(any(isinstance(m, QuantizedLinear) and m.recipe.name == recipe.name for m in block.modules())
                    for block in model.layers)
    return Inventory(params, buffers, state, linears, quantized)


# -- the estimate -------------------------------------------------------------------------------


def estimate_memory(model="small", recipe: str | Recipe = "bf16", *, batch_size: int = 8, seq_len: int = 1024,
                    state_dtype: str = "float32", grad_dtype: str = "float32", fp32_grad_accumulation: bool = False,
                    grad_accum: int = 1, checkpointing: str = "none", dp: int = 1, zero: int = 0,
                    tp: int = 1, fused_adamw: bool = True, save_quantized_input: bool = False,
                    recompute_weight_values: bool = False, delayed_weight_once: bool = False) -> MemoryEstimate:
    """Itemised bytes per GPU of training `model` under `recipe` (see the module docstring).

    batch_size is the micro-batch per GPU; zero is the ZeRO stage (3 = FSDP full sharding);
    fused_adamw: the optimizer's one-kernel update (its default on a GPU) rather than its
    multi-tensor path (CPU), which allocates two fp32 temporaries per parameter of a group;
    save_quantized_input: the Linears keep their input's column-wise quantized copy for backward
    (the trainer's `save_quantized_inputs`) instead of the input; recompute_weight_values: NVFP4's
    Linears quantize their weights again for backward instead of keeping the forward's values
    (the trainer's option of that name); delayed_weight_once: delayed scaling's weights too are
    quantized once a step for its micro-batches and kept (the trainer's option of that name).
    """
    name, cfg = model_config(model)
    recipe = get_recipe(recipe)
    for k, v in dict(batch_size=batch_size, seq_len=seq_len, grad_accum=grad_accum, dp=dp, tp=tp).items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    if state_dtype not in STATE_BYTES:
        raise ValueError(f"state_dtype must be one of {', '.join(STATE_BYTES)}, not {state_dtype!r}")
    if grad_dtype not in GRAD_BYTES:
        raise ValueError(f"grad_dtype must be one of {', '.join(GRAD_BYTES)}, not {grad_dtype!r}")
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}, not {checkpointing!r}")
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, not {zero!r}")
    if zero and dp == 1:
        raise ValueError("ZeRO sharding needs a data-parallel size above 1 (--dp)")
    if seq_len > cfg.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_seq_len {cfg.max_seq_len}")
    for what, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_dim", cfg.ffn_dim),
                       ("vocab_size", cfg.vocab_size)):
        if size % tp:
            raise ValueError(f"{what} = {size} is not divisible by the tensor-parallel size {tp}")

    inv = inventory(cfg, recipe)
    params = sum(p[1] for p in inv.params)
    local = [n // tp if split else n for _, n, split, _ in inv.params]  # this GPU's share under TP
    p_local = sum(local)
    shard = lambda b, stage: math.ceil(b / dp) if zero >= stage else b  # noqa: E731

    items: dict[str, int] = {}
    items["master weights (fp32)"] = shard(4 * p_local, 3)
    items["gradients"] = shard(GRAD_BYTES[grad_dtype] * p_local, 2)
    if fp32_grad_accumulation and grad_dtype != "float32":
        items["fp32 gradient accumulation"] = shard(4 * p_local, 2)
    items["optimizer states"] = shard(math.ceil(2 * STATE_BYTES[state_dtype] * p_local), 1) + 4 * len(inv.params)
    items["kept weight copies"] = _kept_weights(inv, tp, delayed_weight_once) if grad_accum > 1 else 0
    items["recipe state (amax histories)"] = inv.recipe_state
    items["model buffers"] = inv.buffers
    compute_name = str(recipe.compute_dtype).removeprefix("torch.")
    acts = _activations(cfg, recipe, batch_size * seq_len, checkpointing, tp, save_quantized_input,
                        inv.quantized_blocks, recompute_weight_values)
    for kind, b in _by_dtype(acts, compute_name).items():
        items[f"activations, {kind}"] = b
    tokens = batch_size * seq_len
    items["logits and loss"] = 12 * tokens * cfg.vocab_size // tp
    if fused_adamw:  # one kernel per parameter, in place
        items["optimizer temporaries"] = 0
    else:  # two fp32 lists as large as the largest parameter group (this GPU's shard of it)
        groups: dict[int, int] = {}
        for (_, _, _, g), n in zip(inv.params, local):
            groups[g] = groups.get(g, 0) + n
        items["optimizer temporaries"] = shard(8 * max(groups.values()), 1)

    phases = {phase: sum(b for k, b in items.items() if k in keys or ("activations" in keys and k.startswith("activations")))
              for phase, keys in PHASE_ITEMS.items()}
    per_block = {k: v for k, v in _by_dtype(_block_activations(cfg, recipe, batch_size * seq_len, tp,
                                                               save_quantized_input, recompute_weight_values),
                                            compute_name).items() if v}
    settings = dict(batch_size=batch_size, seq_len=seq_len, state_dtype=state_dtype, grad_dtype=grad_dtype,
                    grad_accum=grad_accum, checkpointing=checkpointing, dp=dp, zero=zero, tp=tp,
                    fused_adamw=fused_adamw, save_quantized_input=save_quantized_input,
                    recompute_weight_values=recompute_weight_values, delayed_weight_once=delayed_weight_once)
    return MemoryEstimate(name, recipe.name, params, items, phases, max(phases.values()), settings, per_block)


def _kept_weights(inv: Inventory, tp: int, delayed: bool = False) -> int:
    """Bytes of the fprop and dgrad weight operands kept for a step's micro-batches
    (QuantizedLinear.cache_weight, prepare_weight; `delayed`: delayed scaling's weights too)."""
    from .quantize import quantized_nbytes

    total = 0
    for name, k, n, recipe in inv.linears:
        layer = name.split(".")[-1]
        n = n // tp if layer in COLUMN_SPLIT else n
        k = k // tp if layer in ("o_proj", "down_proj") else k
        for gemm, axis in ((recipe.fprop, 1), (recipe.dgrad, 0)):
            op = gemm.b
            if op.scheme is None:  # a copy in the compute dtype (none in fp32: the parameter itself)
                total += 0 if recipe.compute_dtype.itemsize == 4 else n * k * recipe.compute_dtype.itemsize
            elif op.rounding == "nearest" and (recipe.delayed is None or delayed):  # else prepared afresh each time
                total += quantized_nbytes((n, k), get_scheme(op.scheme), axis=axis)
    return total


def _by_dtype(parts: dict[str, int], compute_name: str) -> dict[str, int]:
    """{"compute": …, "float32": …, "int64": …} with the compute dtype named (and merged into
    float32 when it is float32)."""
    out: dict[str, int] = {}
    for kind, b in parts.items():
        name = compute_name if kind == "compute" else kind
        out[name] = out.get(name, 0) + b
    return out


def _saves_codes(recipe: Recipe) -> bool:
    """Whether the recipe's Linears save their input's forward codes (one byte per element and
    one fp32 scale) rather than the input itself (linear.py: per-tensor FP8)."""
    from .linear import _transposable

    fp, wg = recipe.fprop, recipe.wgrad
    return _transposable(fp.a, fp, wg.b, wg)


def _saves_weight_values(recipe: Recipe) -> bool:
    """Whether the recipe's Linears keep their weight's forward values (bf16) for the input-
    gradient GEMM (linear.py: square blocks read either way, multiplied as values the Triton
    kernel makes — NVFP4's 16x16 weights on a GPU)."""
    from .gemm import emulated_in_bf16
    from .linear import _square_transposable

    fp, dg = recipe.fprop, recipe.dgrad
    return (recipe.delayed is None and recipe.weight_qat is None and fp.a.scheme is not None
            and _square_transposable(fp.b, fp, dg.b, dg)
            and emulated_in_bf16(get_scheme(fp.a.scheme), get_scheme(fp.b.scheme)))


def _saves_two_amaxes(recipe: Recipe, rows: int) -> bool:
    """Whether the recipe's Linears keep, beside an input of `rows` tokens, the two tensor amaxes
    found in one read of it (linear.py: NVFP4, whose weight-gradient GEMM transforms the input
    along the tokens by a Hadamard transform the values kernel applies itself — on a GPU)."""
    from .gemm import emulated_in_bf16
    from .linear import _pairs_amaxes

    fp, wg = recipe.fprop, recipe.wgrad
    if (recipe.delayed is not None or fp.b.scheme is None or wg.a.scheme is None
            or not _pairs_amaxes(fp.a, fp, wg.b, wg) or rows % wg.hadamard.size):
        return False
    return all(emulated_in_bf16(get_scheme(g.a.scheme), get_scheme(g.b.scheme)) for g in (fp, wg))


def _saved_input(recipe: Recipe, rows: int, cols: int, save_quantized: bool) -> dict[str, int]:
    """Bytes by dtype that a Linear saves of its (rows, cols) input."""
    from .quantize import quantized_nbytes

    c = recipe.compute_dtype.itemsize
    if not recipe.quantized or recipe.wgrad.b.scheme is None:
        return {"compute": c * rows * cols}
    if not save_quantized and _saves_two_amaxes(recipe, rows):  # the input, its two amaxes (fp32)
        return {"compute": c * rows * cols, "float32": 8}
    if _saves_codes(recipe):  # the forward codes and a 4-byte scale
        return {"uint8": rows * cols, "float32": 4}
    if save_quantized:  # the column-wise copy the weight-gradient GEMM uses: codes and scales
        from .quantize import packed_size

        scheme = get_scheme(recipe.wgrad.b.scheme)
        codes = cols * packed_size(rows, scheme.elem.bits)  # (cols, rows): blocks along the tokens
        scales = quantized_nbytes((rows, cols), scheme, axis=0) - codes
        if scheme.scale_fmt.bits <= 8:  # 8-bit scale codes (and NVFP4's fp32 tensor scale)
            tensor = 4 if scheme.two_level else 0
            return {"uint8": codes + scales - tensor, "float32": tensor}
        return {"uint8": codes, "float32": scales}
    return {"compute": c * rows * cols}


def _each_reader_saves_its_own(recipe: Recipe, rows: int, save_quantized: bool) -> bool:
    """Whether every Linear that reads one input (q, k and v; gate and up) saves its own copy of
    it: where what it saves is a quantization of the input (its forward codes, or the column-
    wise copy of `save_quantized`) made with the Linear's own amax (delayed scaling) or by
    stochastic rounding. Otherwise one copy serves them all: eagerly `linear.SHARED_OPERANDS`
    makes it once, and a compiled graph's common-subexpression pass merges the casts."""
    if not recipe.quantized or recipe.wgrad.b.scheme is None:
        return False
    if not save_quantized and _saves_two_amaxes(recipe, rows):
        return False
    if _saves_codes(recipe):  # (codes that transpose are rounded to nearest)
        return recipe.delayed is not None
    if save_quantized:
        return recipe.delayed is not None or recipe.wgrad.b.rounding != "nearest"
    return False


def _block_activations(cfg: ModelConfig, recipe: Recipe, T: int, tp: int,
                       save_quantized: bool = False, recompute_weights: bool = False) -> dict[str, int]:
    """Bytes one block saves for backward, by dtype ("compute", "float32", "int64", "uint8", and
    "bfloat16" where it keeps weight values)."""
    c = recipe.compute_dtype.itemsize
    d, f, H = cfg.dim, cfg.ffn_dim, cfg.n_heads
    out = {"compute": 0, "float32": 0, "int64": 0, "uint8": 0}
    out["float32"] += 2 * (8 * T * d + 4 * T)  # the two RMSNorms
    out["float32"] += 4 * T * H // tp  # attention's log-sum-exp
    out["compute"] += 4 * c * T * d // tp  # q, k, v after rotary and head repetition, the attention output
    # the Linears' inputs, with how many Linears read each: q/k/v's (one, replicated over TP),
    # o_proj's, gate/up's (one), down_proj's
    inputs = [(T, d, 3), (T, d // tp, 1)]
    if cfg.n_experts:
        k, E = cfg.top_k, cfg.n_experts
        routed = k * T  # token slots, spread evenly over the experts
        out["compute"] += c * T * d + routed * (3 * c * f + c * d) // tp  # input; per slot: SwiGLU, output · weight
        inputs += [(routed, d // tp, 2), (routed, f // tp, 1)]  # gathered input, down input (over all experts)
        out["float32"] += 4 * T * E + 4 * T * k  # router probabilities, top-k weights
        out["int64"] += 8 * T * k + 16 * routed // tp  # top-k indices, each expert's token and slot indices
    else:
        out["compute"] += 3 * c * T * f // tp  # gate output, silu output, up output
        inputs += [(T, d, 2), (T, f // tp, 1)]
    for rows, cols, readers in inputs:
        copies = readers if _each_reader_saves_its_own(recipe, rows, save_quantized) else 1
        for kind, b in _saved_input(recipe, rows, cols, save_quantized).items():
            out[kind] += copies * b
    if _saves_weight_values(recipe) and not recompute_weights:  # each Linear's weight values, tensor scale
        attn = 2 * d * cfg.head_dim * (H + cfg.n_kv_heads) // tp  # q, k, v, o
        mlp = 3 * d * f // tp * (cfg.n_experts or 1)  # gate, up, down (of every expert)
        out["bfloat16"] = 2 * (attn + mlp)
        out["float32"] += 4 * (4 + 3 * (cfg.n_experts or 1)) if get_scheme(recipe.fprop.b.scheme).two_level else 0
    return out


def _activations(cfg: ModelConfig, recipe: Recipe, T: int, checkpointing: str, tp: int,
                 save_quantized: bool = False, quantized_blocks: int | None = None,
                 recompute_weights: bool = False) -> dict[str, int]:
    """Saved activations of the whole model by dtype (see the module docstring);
    quantized_blocks: how many blocks run the recipe (the others its compute dtype)."""
    from .train.precision import high_precision_recipe

    c = recipe.compute_dtype.itemsize
    n_q = cfg.n_layers if quantized_blocks is None else quantized_blocks
    block = _block_activations(cfg, recipe, T, tp, save_quantized, recompute_weights)
    kept = _block_activations(cfg, high_precision_recipe(recipe), T, tp)
    if checkpointing == "block":  # each block's input, and one block recomputed
        kinds = ([block] if n_q else []) + ([kept] if n_q < cfg.n_layers else [])
        total = dict(max(kinds, key=lambda b: sum(b.values())))
        total["compute"] += cfg.n_layers * c * T * cfg.dim
    else:
        total = {k: n_q * block.get(k, 0) + (cfg.n_layers - n_q) * kept.get(k, 0) for k in {**block, **kept}}
    total["int64"] += 8 * T  # token ids
    total["float32"] += 8 * T * cfg.dim + 4 * T  # the final RMSNorm
    total["compute"] += c * T * cfg.dim  # the output head's input
    return total


# -- the survey's table -------------------------------------------------------------------------


#: The survey's 70B dense-model table (GB) and the bytes per parameter that reproduce its states:
#: weights and gradients in the training precision, two fp32 Adam states, no fp32 master copy.
#: Whatever the figure holds beyond those states is read as its activation allowance.
SURVEY_70B = (  # (setting, GB, weight bytes, gradient bytes, Adam bytes, master bytes it leaves out)
    ("FP32", 1300, 4, 4, 8, 0),
    ("BF16 mixed", 940, 2, 2, 8, 4),
    ("FP8 mixed", 750, 1, 1, 8, 4),
)


def survey_table(params: float = 70e9) -> str:
    """The survey's 70B table line by line, next to the same rows with the fp32 master weights
    it leaves out, and next to what fewerbits keeps per parameter (16 bytes in every recipe)."""
    lines = ["| setting | survey (GB) | its states: B/param (GB) | its activations (GB, the rest) | "
             "fp32 master weights it omits (GB) | with them (GB) | fewerbits' states: 16 B/param (GB) | "
             "fewerbits + the same activations (GB) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for setting, figure, w, g, adam, master in SURVEY_70B:
        states = (w + g + adam) * params / 1e9
        acts = figure - states
        ours = 16 * params / 1e9
        lines.append(f"| {setting} | {figure:,} | {w + g + adam} ({states:,.0f}) | {acts:,.0f} | "
                     f"{master * params / 1e9:,.0f} | {figure + master * params / 1e9:,.0f} | {ours:,.0f} | "
                     f"{ours + acts:,.0f} |")
    return "\n".join(lines)


def comparison_table(estimates: list[MemoryEstimate]) -> str:
    """Items as rows, recipes as columns, GiB per GPU."""
    e0 = estimates[0]
    head = (f"{e0.model}: {e0.params:,} parameters; "
            + ", ".join(f"{k} {v}" for k, v in e0.settings.items()) + "\n\n")
    names = list(dict.fromkeys(k for e in estimates for k in e.items))
    lines = ["| GiB per GPU | " + " | ".join(e.recipe for e in estimates) + " |",
             "|---|" + "--:|" * len(estimates)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{e.items.get(name, 0) / GiB:.3f}" for e in estimates) + " |")
    lines.append("| one block's activations | " + " | ".join(
        " + ".join(f"{b / GiB:.3f} {k}" for k, b in e.per_block.items()) for e in estimates) + " |")
    for phase in e0.phases:
        lines.append(f"| at {phase} | " + " | ".join(f"{e.phases[phase] / GiB:.3f}" for e in estimates) + " |")
    lines.append("| **peak** | " + " | ".join(f"**{e.total_bytes / GiB:.3f}**" for e in estimates) + " |")
    return head + "\n".join(lines)


def plot(estimates: list[MemoryEstimate], path: str | Path) -> None:
    """A stacked bar of each estimate's items at its peak moment, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(estimates[0].items)
    fig, ax = plt.subplots(figsize=(1.6 * len(estimates) + 4, 5))
    for i, e in enumerate(estimates):
        peak = max(e.phases, key=e.phases.get)
        shown = PHASE_ITEMS[peak]
        bottom = 0.0
        for j, name in enumerate(names):
            if name not in shown and not (name == "fp32 gradient accumulation" and name in e.items):
                continue
            height = e.items.get(name, 0) / GiB
            ax.bar(i, height, bottom=bottom, color=f"C{j % 10}", label=name if i == 0 else None)
            bottom += height
        ax.text(i, bottom, f"{e.total_bytes / GiB:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(estimates)), [e.recipe for e in estimates])
    ax.set_ylabel("GiB per GPU at the peak")
    e0 = estimates[0]
    ax.set_title(f"{e0.model}: batch {e0.settings['batch_size']} × {e0.settings['seq_len']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
