"""Recipes: the precision of each operand of the three GEMMs of a Linear, and the registry.

A Linear y = x · Wᵀ runs three GEMMs; a recipe says, for each, how both operands are fed:

    fprop   output      = input         @ weight_t       a = input,          b = weight
    dgrad   grad_input  = grad_output   @ weight         a = grad_output,    b = weight (column-wise)
    wgrad   grad_weight = grad_output_t @ input          a = grad_output_t,  b = input_t

Each operand is an `Operand`: a quantization scheme (None: the compute dtype, unquantized) and a
rounding mode; each GEMM may add a block `Hadamard` transform of both operands along its inner
dimension. Column-wise operands are quantized from the high-precision tensor along the GEMM's
inner dimension (`quantize(..., axis=0)`), never by re-quantizing a row-wise copy.

The named recipes follow their primary sources; where a popular summary differs, the docstring
of the factory says so. Build your own with `Recipe(...)` from any schemes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch

from .hadamard import Hadamard
from .rounding import Rounding, check_rounding
from .schemes import SCHEMES, Scheme, get_scheme


@dataclass(frozen=True)
class Operand:
    """One GEMM operand: its scheme (None: unquantized, in the compute dtype) and rounding."""

    scheme: Scheme | None = None  #: a Scheme or a scheme name
    rounding: Rounding = "nearest"  #: "nearest" or "stochastic"

    def __post_init__(self):
        if self.scheme is not None:
            object.__setattr__(self, "scheme", get_scheme(self.scheme))
        check_rounding(self.rounding)
        if self.scheme is None and self.rounding != "nearest":
            raise ValueError("stochastic rounding needs a quantization scheme")

    def __str__(self) -> str:
        if self.scheme is None:
            return "hp"
        text = self.scheme.name
        named = SCHEMES.get(text)
        if named is not None and named.scale_rule != self.scheme.scale_rule:
            text += f" ({self.scheme.scale_rule})"
        return text + (" SR" if self.rounding == "stochastic" else "")


HP = Operand()


@dataclass(frozen=True)
class Gemm:
    """Both operands of one GEMM, an optional Hadamard transform along its inner dimension, and
    how a native FP8 GEMM accumulates.

    fast_accum: the native FP8 GEMM keeps its sums in the tensor cores' own accumulator for the
    whole inner dimension (`torch._scaled_mm(use_fast_accum=True)`), faster on Hopper, instead of
    promoting partial sums to fp32 as it goes. DeepSeek-V3 (arXiv 2412.19437 §3.3.2) measures that
    accumulator at about 14 bits on Hopper. Transformer Engine and torchao accumulate so in the
    forward GEMM only (TE's `_2X_ACC_FPROP = False`, torchao's `gemm_config_output`) and promote
    in both gradient GEMMs. The hardware's accumulator is not documented, so an emulated GEMM
    (CPU, MX, NVFP4) accumulates in fp32 whatever this says; only native GEMMs see it."""

    a: Operand = HP  #: the left operand (input, grad_output, grad_output_t)
    b: Operand = HP  #: the right operand (weight, weight, input_t)
    hadamard: Hadamard | None = None  #: applied to both operands, so the product is unchanged
    fast_accum: bool = False  #: native FP8: the tensor cores' accumulator, no fp32 promotion

    def __post_init__(self):
        if not isinstance(self.fast_accum, bool):
            raise ValueError(f"fast_accum must be True or False, not {self.fast_accum!r}")

    @property
    def quantized(self) -> bool:
        return self.a.scheme is not None or self.b.scheme is not None

    def __str__(self) -> str:
        h = f" + Hadamard {self.hadamard.size}" if self.hadamard else ""
        acc = ", fast accumulation" if self.fast_accum else ""
        return f"{self.a} × {self.b}{h}{acc}"


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's DelayedScaling: per-tensor scales from a history of past amaxes."""

    history_len: int = 1024  #: amaxes remembered per tensor
    margin: int = 0  #: the scale leaves 2^margin of headroom
    amax_compute: Literal["max", "most_recent"] = "max"  #: how the history becomes one amax

    def __post_init__(self):
        if self.history_len < 1:
            raise ValueError("history_len must be at least 1")
        if self.amax_compute not in ("max", "most_recent"):
            raise ValueError("amax_compute must be 'max' or 'most_recent'")


@dataclass(frozen=True)
class Recipe:
    """The precision of a Linear's three GEMMs, plus what the trainer and the policy must know."""

    name: str  #: registry name
    compute_dtype: torch.dtype = torch.bfloat16  #: dtype of activations and unquantized GEMMs
    fprop: Gemm = Gemm()  #: output = input @ weight_t
    dgrad: Gemm = Gemm()  #: grad_input = grad_output @ weight
    wgrad: Gemm = Gemm()  #: grad_weight = grad_output_t @ input
    loss_scaling: Literal["none", "dynamic"] = "none"  #: fp16 needs dynamic loss scaling
    delayed: DelayedScaling | None = None  #: per-tensor scales from amax histories
    keep_last_blocks: float = 0.0  #: fraction of transformer blocks the default policy keeps in compute_dtype
    weight_qat: Operand | None = None  #: fake-quantize the weight first (straight-through gradient)
    experts: Recipe | None = None  #: the recipe for MoE expert Linears (names containing "experts")
    source: str = ""  #: where the definition comes from
    doc: str = field(default="", compare=False)  #: one line for tables

    def __post_init__(self):
        if self.compute_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"compute_dtype must be float32, bfloat16 or float16, not {self.compute_dtype}")
        if not 0.0 <= self.keep_last_blocks < 1.0:
            raise ValueError("keep_last_blocks is a fraction in [0, 1)")
        if self.delayed is not None:
            for gemm in (self.fprop, self.dgrad, self.wgrad):
                for op in (gemm.a, gemm.b):
                    if op.scheme is not None and op.scheme.block != (-1, -1):
                        raise ValueError("delayed scaling needs per-tensor schemes")

    @property
    def quantized(self) -> bool:
        return self.weight_qat is not None or any(g.quantized for g in (self.fprop, self.dgrad, self.wgrad))

    def describe(self) -> str:
        qat = f"weight fake-quantized to {self.weight_qat}; " if self.weight_qat else ""
        return f"{qat}fprop {self.fprop}; dgrad {self.dgrad}; wgrad {self.wgrad}"

    def __str__(self) -> str:
        return self.name


def _op(scheme: str | Scheme | None, rounding: Rounding = "nearest", rule: str | None = None) -> Operand:
    return Operand(None if scheme is None else get_scheme(scheme, rule), rounding)


# -- the named recipes ---------------------------------------------------------------------------


def _fp32() -> Recipe:
    # every GEMM in fp32, TF32 off
    return Recipe("fp32", torch.float32, doc="fp32 everywhere, TF32 off")


def _bf16() -> Recipe:
    # output = input_bf16 @ weight_bf16ᵀ (fp32 accumulation); fp32 master weights and gradients
    return Recipe("bf16", torch.bfloat16, doc="bf16 compute, fp32 master weights")


def _fp16() -> Recipe:
    # as bf16 in fp16; fp16's 5 exponent bits make the trainer scale the loss dynamically
    return Recipe("fp16", torch.float16, loss_scaling="dynamic", doc="fp16 compute, dynamic loss scaling")


def _fp8(name: str, delayed: DelayedScaling | None, doc: str) -> Recipe:
    # HYBRID: E4M3 forward operands, E5M2 gradients; one fp32 scale per tensor; the forward GEMM
    # accumulates fast, the gradient GEMMs promote to fp32 (TE's _2X_ACC_FPROP/DGRAD/WGRAD)
    e4, e5 = _op("fp8_e4m3_tensor"), _op("fp8_e5m2_tensor")
    return Recipe(
        name,
        fprop=Gemm(e4, e4, fast_accum=True),  # output = input_e4m3 @ weight_e4m3ᵀ
        dgrad=Gemm(e5, e4),  # grad_input  = grad_e5m2  @ weight_e4m3
        wgrad=Gemm(e5, e4),  # grad_weight = grad_e5m2ᵀ @ input_e4m3
        delayed=delayed,
        source="Transformer Engine, DelayedScaling / Float8CurrentScaling, Format.HYBRID",
        doc=doc,
    )


def _fp8_delayed() -> Recipe:
    """TE DelayedScaling: history 1024, amax = max(history), margin 0, HYBRID formats.

    The scale a tensor uses at step t comes from the amaxes of steps before t; the first step
    uses scale 1, as Transformer Engine initialises it.
    """
    return _fp8("fp8_delayed", DelayedScaling(1024, 0, "max"), "FP8 per-tensor, delayed (amax history 1024)")


def _fp8_tensorwise() -> Recipe:
    return _fp8("fp8_tensorwise", None, "FP8 per-tensor, current scaling, HYBRID")


def _fp8_rowwise() -> Recipe:
    """E4M3 for every operand, one power-of-two fp32 scale per row along the inner dimension.

    Power-of-two scales (torchao's rowwise recipe rounds scales to powers of two) use the
    rceil rule, so nothing saturates. The forward GEMM accumulates fast, the gradient GEMMs in
    fp32, as torchao's defaults have it (its Float8LinearConfig's per-GEMM configs).
    """
    row = _op("fp8_e4m3_row", rule="rceil")
    return Recipe(
        "fp8_rowwise",
        fprop=Gemm(row, row, fast_accum=True),  # output = input_rows @ weight_rowsᵀ
        dgrad=Gemm(row, row),  # grad_input  = grad_rows  @ weight_cols
        wgrad=Gemm(row, row),  # grad_weight = grad_colsᵀ @ input_cols
        source="torchao float8 rowwise (Float8LinearRecipeName.ROWWISE)",
        doc="FP8 E4M3, power-of-two scale per row",
    )


def _fp8_blockwise() -> Recipe:
    """DeepSeek-V3 (arXiv 2412.19437 §3.3): activations and their gradients in 1x128 tiles,
    weights in 128x128 blocks, E4M3 throughout, online fp32 scales. (A widely copied summary
    swaps the tile shapes; the report itself gives activations 1x128 and weights 128x128.)"""
    tile, block = _op("fp8_e4m3_1x128"), _op("fp8_e4m3_128x128")
    return Recipe(
        "fp8_blockwise",
        fprop=Gemm(tile, block),  # output      = input_1x128 @ weight_128x128ᵀ
        dgrad=Gemm(tile, block),  # grad_input  = grad_1x128  @ weight_128x128
        wgrad=Gemm(tile, tile),  # grad_weight = grad_1x128ᵀ @ input_1x128 (tiles along tokens)
        source="DeepSeek-V3 technical report, arXiv 2412.19437 §3.3",
        doc="FP8 E4M3, 1x128 activation tiles, 128x128 weight blocks",
    )


def _mxfp8() -> Recipe:
    """E4M3 for all operands, 32-element blocks along the inner dimension, rceil E8M0 scales
    (Mishra et al., "Recipes for Pre-training LLMs with MXFP8", arXiv 2506.08027)."""
    mx = _op("mxfp8_e4m3", rule="rceil")
    return Recipe(
        "mxfp8",
        fprop=Gemm(mx, mx),  # output      = input_mx @ weight_mxᵀ
        dgrad=Gemm(mx, mx),  # grad_input  = grad_mx  @ weight_mx (blocks along out_features)
        wgrad=Gemm(mx, mx),  # grad_weight = grad_mxᵀ @ input_mx  (blocks along tokens)
        source="arXiv 2506.08027 (MXFP8 pre-training recipe)",
        doc="MXFP8 E4M3, rceil scales",
    )


def _mxfp6() -> Recipe:
    # E2M3 (more mantissa) for input and weight, E3M2 (more range) for gradients; rceil scales
    fwd, grad = _op("mxfp6_e2m3", rule="rceil"), _op("mxfp6_e3m2", rule="rceil")
    return Recipe(
        "mxfp6",
        fprop=Gemm(fwd, fwd),  # output      = input_e2m3 @ weight_e2m3ᵀ
        dgrad=Gemm(grad, fwd),  # grad_input  = grad_e3m2  @ weight_e2m3
        wgrad=Gemm(grad, fwd),  # grad_weight = grad_e3m2ᵀ @ input_e2m3
        source="OCP MX v1.0 formats; scale rule as the MXFP8 recipe",
        doc="MXFP6: E2M3 forward, E3M2 gradients",
    )


def _mxfp4_fwd() -> Recipe:
    # "FP4 forward, FP8 backward": MXFP4 (OCP floor scales) forward, MXFP8 E4M3 (rceil) backward
    fp4, fp8 = _op("mxfp4"), _op("mxfp8_e4m3", rule="rceil")
    return Recipe(
        "mxfp4_fwd",
        fprop=Gemm(fp4, fp4),  # output      = input_fp4 @ weight_fp4ᵀ
        dgrad=Gemm(fp8, fp8),  # grad_input  = grad_fp8  @ weight_fp8
        wgrad=Gemm(fp8, fp8),  # grad_weight = grad_fp8ᵀ @ input_fp8
        source="OCP MX v1.0; FP4 forward with FP8 backward",
        doc="MXFP4 forward, MXFP8 backward",
    )


def _mxfp4(naive: bool) -> Recipe:
    """MXFP4 for all three GEMMs (OCP v1.0 floor scales). The stabilisers, after Tseng et al.,
    "Training LLMs with MXFP4" (arXiv 2502.20586): stochastic rounding of grad_output and a
    Hadamard transform of size 32 with a fixed sign vector on both weight-gradient operands.
    `mxfp4_naive` drops both."""
    fp4 = _op("mxfp4")
    grad = fp4 if naive else _op("mxfp4", "stochastic")
    rht = None if naive else Hadamard(32, seed=0)
    return Recipe(
        "mxfp4_naive" if naive else "mxfp4",
        fprop=Gemm(fp4, fp4),  # output      = input_fp4 @ weight_fp4ᵀ
        dgrad=Gemm(grad, fp4),  # grad_input  = grad_fp4 (SR) @ weight_fp4
        wgrad=Gemm(grad, fp4, rht),  # grad_weight = (grad H)ᵀ_fp4 (SR) @ (input H)_fp4
        source="OCP MX v1.0; arXiv 2502.20586",
        doc="MXFP4 everywhere" + ("" if naive else ", SR gradients, Hadamard 32 on wgrad"),
    )


def _nvfp4(naive: bool) -> Recipe:
    """NVIDIA's NVFP4 pre-training recipe (arXiv 2509.25149): NVFP4 for every GEMM operand;
    weights with 16x16 2-D scales, so the row- and column-wise copies agree; a random Hadamard
    transform of size 16 with one fixed sign vector on both weight-gradient operands; stochastic
    rounding of gradients, round-to-nearest for weights and activations; a few final blocks in
    BF16 (the default policy keeps the last 15%). `nvfp4_naive`: NVFP4 1x16 everywhere,
    round-to-nearest, no Hadamard transform, no 2-D weight blocks, no blocks kept."""
    act = _op("nvfp4")
    weight = act if naive else _op("nvfp4_16x16")
    grad = act if naive else _op("nvfp4", "stochastic")
    rht = None if naive else Hadamard(16, seed=0)
    return Recipe(
        "nvfp4_naive" if naive else "nvfp4",
        fprop=Gemm(act, weight),  # output      = input_nvfp4 @ weight_16x16ᵀ
        dgrad=Gemm(grad, weight),  # grad_input  = grad_nvfp4 (SR) @ weight_16x16
        wgrad=Gemm(grad, act, rht),  # grad_weight = (grad H)ᵀ (SR) @ (input H), H of size 16
        keep_last_blocks=0.0 if naive else 0.15,
        source="arXiv 2509.25149",
        doc="NVFP4" + (" everywhere, no stabilisers" if naive else ", 2-D weights, SR, RHT 16"),
    )


def _mxfp4_qat_experts() -> Recipe:
    """In the spirit of DeepSeek-V4's FP4 expert weights: every GEMM as `fp8_blockwise`, and the
    MoE experts' weights fake-quantized to MXFP4 before it (quantization-aware training with a
    straight-through gradient: the master weight receives the gradient of the fake-quantized
    one unchanged)."""
    base = _fp8_blockwise()
    experts = Recipe(
        "mxfp4_qat_expert",
        fprop=base.fprop,  # output = input_1x128 @ Q_fp4(weight)_128x128ᵀ
        dgrad=base.dgrad,  # grad_input = grad_1x128 @ Q_fp4(weight)_128x128
        wgrad=base.wgrad,  # grad_weight (straight through) = grad_1x128ᵀ @ input_1x128
        weight_qat=_op("mxfp4"),
        source="DeepSeek-V4 (FP4 quantization-aware training of expert weights)",
        doc="expert weights MXFP4 (QAT), GEMMs FP8 blockwise",
    )
    return dataclasses.replace(
        base, name="mxfp4_qat_experts", experts=experts,
        source="fp8_blockwise, with MXFP4 QAT experts after DeepSeek-V4",
        doc="FP8 blockwise; MoE experts' weights MXFP4 QAT",
    )


#: Every named recipe.
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        _fp32(),
        _bf16(),
        _fp16(),
        _fp8_delayed(),
        _fp8_tensorwise(),
        _fp8_rowwise(),
        _fp8_blockwise(),
        _mxfp8(),
        _mxfp6(),
        _mxfp4_fwd(),
        _mxfp4(naive=False),
        _mxfp4(naive=True),
        _nvfp4(naive=False),
        _nvfp4(naive=True),
        _mxfp4_qat_experts(),
    )
}


def get_recipe(recipe: str | Recipe) -> Recipe:
    """Look a recipe up by name (a Recipe passes through)."""
    if isinstance(recipe, Recipe):
        return recipe
    try:
        return RECIPES[recipe]
    except (KeyError, TypeError):
        raise ValueError(f"unknown recipe {recipe!r}; valid recipes: {', '.join(RECIPES)}") from None
