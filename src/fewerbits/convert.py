"""convert(model, recipe): swap nn.Linear for QuantizedLinear in place, and say what each got.

The model never mentions precision; precision arrives here, after the model is built. The
default policy keeps in high precision what the field agrees should stay there:

    the output head (lm_head, output), embeddings, MoE routers / gates    by name (fnmatch on
                                                                          the full name or the
                                                                          last component)
    the last `keep_last_blocks` of the transformer blocks                 the recipe's default
                                                                          (nvfp4: 15%, rounded)
    the first `keep_first_blocks` blocks                                  0 by default
    on a native FP8 path (a Hopper GPU), Linears the kernel cannot take   dims not multiples of
    (or that are too small to gain from it)                               16 (128 for blockwise),
                                                                          or under min_features

The transformer blocks are the children of the largest nn.ModuleList that holds Linears
(`model.layers`, `transformer.h`, ...). Every Linear gets a row in the report: its name, shape,
what it got and why. Converting twice is harmless: a QuantizedLinear is left as it is.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .linear import QuantizedLinear
from .quantize import hold_lowering
from .recipes import Recipe, get_recipe

DEFAULT_KEEP = ("lm_head", "output", "*embed*", "gate", "router", "*.router.*")


@dataclass(frozen=True)
class Policy:
    """Which Linears a conversion leaves in high precision."""

    keep: tuple[str, ...] = DEFAULT_KEEP  #: name patterns kept in high precision
    extra_keep: tuple[str, ...] = ()  #: more patterns, added to `keep`
    keep_first_blocks: int = 0  #: the first N transformer blocks stay in high precision
    keep_last_blocks: int | float | None = None  #: N blocks, a fraction, or None: the recipe's default
    min_features: int = 256  #: on native FP8 paths, smaller Linears are kept (too small to gain)
    native: bool | str = "auto"  #: passed to every QuantizedLinear
    save_quantized_input: bool = False  #: passed to every QuantizedLinear
    recompute_weight_values: bool = False  #: passed to every QuantizedLinear

    def matches(self, name: str) -> str | None:
        """The first pattern that keeps `name`, if any."""
        last = name.rsplit(".", 1)[-1]
        for pat in self.keep + self.extra_keep:
            if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(last, pat):
                return pat
        return None


@dataclass
class LayerReport:
    name: str
    in_features: int
    out_features: int
    got: str  #: the recipe name, or the high-precision dtype it stays in
    reason: str
    quantized: bool = False  #: converted to a QuantizedLinear by this call or an earlier one


@dataclass
class ConversionReport:
    """What convert() did to every Linear of the model."""

    recipe: str
    layers: list[LayerReport] = field(default_factory=list)

    @property
    def converted(self) -> list[LayerReport]:
        return [r for r in self.layers if r.quantized]

    @property
    def kept(self) -> list[LayerReport]:
        return [r for r in self.layers if not r.quantized]

    def __str__(self) -> str:
        head = ("layer", "in", "out", "precision", "why")
        rows = [(r.name, str(r.in_features), str(r.out_features), r.got, r.reason) for r in self.layers]
        widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
        summary = f"{len(self.converted)} of {len(self.layers)} Linear layers converted to {self.recipe}"
        return "\n".join(lines + [summary])


def _blocks(model: nn.Module) -> tuple[str, int] | None:
    """(name, length) of the ModuleList that holds the transformer blocks, if there is one: of
    the ModuleLists whose modules hold Linears, the outermost (a mixture-of-experts block's list
    of experts lies inside a block, and may be the longer list), the longest of those."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name:
            n = sum(any(isinstance(m, nn.Linear) for m in child.modules()) for child in mod)
            key = (-name.count("."), n)
            if n and (best is None or key > best[0]):
                best = (key, name, len(mod))
    return None if best is None else best[1:]


def _native_fp8(recipe: Recipe, device: torch.device) -> bool:
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    ops = [op for g in (recipe.fprop, recipe.dgrad, recipe.wgrad) for op in (g.a, g.b)]
    return any(op.scheme is not None and op.scheme.elem.name.startswith("fp8") and op.scheme.scale_fmt.name == "fp32" for op in ops)


def _native_granule(recipe: Recipe) -> int:
    blocks = {op.scheme.block for g in (recipe.fprop, recipe.dgrad, recipe.wgrad) for op in (g.a, g.b) if op.scheme}
    return 128 if any(128 in b for b in blocks) else 16


def convert(
    model: nn.Module,
    recipe: str | Recipe,
    *,
    policy: Policy | None = None,
    device: torch.device | str | None = None,
) -> ConversionReport:
    """Swap the model's nn.Linear modules for QuantizedLinear (in place) per `policy`.

    device: where the model will run (default: where its parameters are), which decides whether
    the native-FP8 shape rules apply.
    """
    recipe = get_recipe(recipe)
    policy = policy or Policy()
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    report = ConversionReport(recipe.name)
    hp = str(recipe.compute_dtype).removeprefix("torch.")

    blocks = _blocks(model)
    kept_blocks: dict[int, str] = {}
    if blocks is not None:
        n = blocks[1]
        last = policy.keep_last_blocks
        if last is None:
            last = recipe.keep_last_blocks
        n_last = round(last * n) if isinstance(last, float) else int(last)
        for i in range(min(policy.keep_first_blocks, n)):
            kept_blocks[i] = f"one of the first {policy.keep_first_blocks} blocks"
        for i in range(max(0, n - n_last), n):
            kept_blocks[i] = f"one of the last {n_last} of {n} blocks"
    block_re = re.compile(rf"^{re.escape(blocks[0])}\.(\d+)\.") if blocks else None
    native = _native_fp8(recipe, device) and policy.native is not False
    granule = _native_granule(recipe)

    if isinstance(model, nn.Linear):
        raise ValueError(
            "convert() swaps the Linears inside a model; for a bare nn.Linear use "
            "QuantizedLinear.from_linear(linear, recipe)"
        )
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear):
            continue
        row = LayerReport(name, mod.in_features, mod.out_features, hp, "")
        report.layers.append(row)
        if isinstance(mod, QuantizedLinear):
            row.got, row.reason, row.quantized = mod.recipe.name, "already converted", True
            continue
        match = policy.matches(name)
        m = block_re.match(name) if block_re else None
        if match is not None:
            row.reason = f"policy keeps {match!r}"
        elif m and int(m.group(1)) in kept_blocks:
            row.reason = kept_blocks[int(m.group(1))]
        elif native and (mod.in_features % granule or mod.out_features % granule):
            row.reason = f"native FP8 needs dims divisible by {granule}"
        elif native and min(mod.in_features, mod.out_features) < policy.min_features:
            row.reason = f"smaller than {policy.min_features}: too small to gain from FP8"
        else:
            layer_recipe = recipe
            if recipe.experts is not None and "experts" in name.split("."):
                layer_recipe = recipe.experts
            row.got, row.reason, row.quantized = layer_recipe.name, "converted", True
            q = QuantizedLinear.from_linear(
                mod, layer_recipe, native=policy.native, save_quantized_input=policy.save_quantized_input,
                recompute_weight_values=policy.recompute_weight_values,
            )
            _set_submodule(model, name, q)
    if not report.layers:
        warnings.warn("convert(): the model has no nn.Linear; nothing was converted", stacklevel=2)
    return report


#: torch.compile's modes (`compile_model`'s `mode`); "reduce-overhead" replays CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_options(compile: bool, blocks: bool, mode: str | None) -> str:
    """The command-line options that ask for this compilation (each with a leading space)."""
    return ((" --compile" if compile else "") + (" --compile-blocks" if blocks else "")
            + (f" --compile-mode {mode}" if mode else ""))


def check_compile_mode(mode: str | None, compiled: bool) -> None:
    """A clear error for a torch.compile mode that is unknown or given without compilation."""
    if mode is None:
        return
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {mode!r}; valid modes: {', '.join(COMPILE_MODES)}")
    if not compiled:
        raise ValueError(f"compile mode {mode!r} needs compilation (--compile or --compile-blocks)")


def uses_cuda_graphs(mode: str | None) -> bool:
    """Whether torch.compile's `mode` replays its graphs as CUDA graphs (on CUDA devices)."""
    return bool(mode) and bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))


def compile_model(model, *, blocks: bool = False, **kwargs):
    """torch.compile(model) with the quantizers seeing what eager mode sees: model is a module
    or, as torch.compile takes, a function (blocks=True needs a module).

    blocks=True compiles each transformer block in place instead (the modules of the model's
    list of blocks; the rest of the model runs eagerly) and returns the model: the blocks share
    one code, so dynamo traces one and the others reuse its graph, and compiling takes about
    one block's time instead of the whole stack's. What is lost is fusion across a block's
    edges (its input and output are materialised, as eagerly).

    Inductor keeps the intermediate values of a fused kernel in fp32 unless asked to round them
    where the program casts (its `emulate_precision_casts` option): a Linear's bf16 output,
    fused into the next Linear's quantizer, would be quantized unrounded, and the codes would
    differ from eager mode's. On a GPU it also divides approximately unless asked not to. With
    both options a converted model gives eager mode's bits (tests/test_convert.py, on a CPU).
    Inductor's C++ code for the CPU honours the rounding option from torch 2.13 on; under an
    older torch a model with parameters on the CPU (a function, where no GPU is present) is
    compiled with a warning that its bits may differ from eager mode's (a SwiGLU's
    silu(g) * u, for one, is rounded once instead of twice).
    It also registers inductor's lowering of the quantizer's `hold` (`quantize.hold_lowering`),
    which stores a cast's reciprocal of its scale and its FP8 codes once each, where they are
    made (a plain torch.compile copies each held value instead: the same bits).
    Other keyword arguments go to torch.compile (each block's `compile` with blocks=True); a
    `mode` is passed on as its inductor options, and a backend other than inductor gets none."""
    if blocks and not isinstance(model, nn.Module):
        raise ValueError(f"compile_model(blocks=True) takes an nn.Module, not {type(model).__name__}")
    if kwargs.get("backend", "inductor") == "inductor":
        mode = kwargs.pop("mode", None)
        options = dict(torch._inductor.list_mode_options(mode)) if mode else {}
        options.update({"emulate_precision_casts": True, **_division_rounding(), **kwargs.pop("options", {})})
        kwargs["options"] = options
        hold_lowering()
        if not _cpu_rounds_casts() and _may_run_on_cpu(model):
            warnings.warn(f"compile_model(): torch {torch.__version__}'s inductor does not round a fused kernel's "
                          "bf16/fp16 intermediate values on the CPU as eager mode does (torch 2.13 does); "
                          "compiled results (codes included) may differ from eager mode's", stacklevel=2)
    if not blocks:
        return torch.compile(model, **kwargs)
    found = _blocks(model)
    if found is None:
        raise ValueError("compile_model(blocks=True) found no list of blocks (an nn.ModuleList of modules "
                         "holding Linears) in the model; compile the whole model instead")
    for block in model.get_submodule(found[0]):
        block.compile(**kwargs)
    return model


def _may_run_on_cpu(model) -> bool:
    """Whether a model given to compile_model may run on the CPU: a module with a parameter
    there; a plain function (whose tensors come with each call), wherever no GPU is present."""
    if isinstance(model, nn.Module):
        return any(p.device.type == "cpu" for p in model.parameters())
    return not torch.cuda.is_available()


def _cpu_rounds_casts() -> bool:
    """Whether this torch's inductor honours `emulate_precision_casts` in its C++ (CPU) kernels:
    torch 2.11 and 2.12 keep silu(g) * u of bf16 tensors in fp32 there with the option on
    (checked against eager mode), torch 2.13 rounds silu(g) first, as eager mode does."""
    return torch.torch_version.Version(torch.__version__).release[:2] >= (2, 13)


def _division_rounding() -> dict:
    """Inductor's option for correctly rounded fp32 division in Triton kernels (x / y is
    otherwise an approximate division on a GPU, and a block's scale or a scaled element can
    differ from eager mode's in the last bit), under its name in this torch, if it has one."""
    names = getattr(torch._inductor.config, "_config", {})  # the option names this torch knows
    for name in ("eager_numerics.division_rounding", "emulate_divison_rounding"):
        if name in names:
            return {name: True}
    return {}


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
