"""QuantizedLinear: nn.Linear whose three GEMMs run in the precision a recipe gives them.

One autograd.Function holds the three GEMMs of y = x · Wᵀ + b, with x flattened to (M, K),
W (N, K) and the gradient g = dL/dy flattened to (M, N):

    forward    output      = input @ weight_t         inner dimension K
               (M, K) · (N, K)ᵀ → (M, N)               input and weight quantized along K
    backward   grad_input  = grad_output @ weight      inner dimension N
               (M, N) · (K, N)ᵀ → (M, K)               the weight's column-wise copy: along N
               grad_weight = grad_output_t @ input     inner dimension M (tokens)
               (N, M) · (K, M)ᵀ → (N, K)               both column-wise copies: along M

Every quantized operand is made from the high-precision tensor along that GEMM's inner
dimension (`quantize(t, scheme, axis=0)` for the column-wise copies); a GEMM with a Hadamard
transform applies it to both of its operands along the inner dimension first. The bias stays
in high precision; `grad_weight` is produced in the weight's dtype (fp32 master weights),
`grad_input` and the output in the input's (like nn.Linear; a model whose activations are
bf16 gets bf16 out, an fp32 model fp32, whatever the GEMMs ran in).

One scale per tensor (FP8 tensorwise and delayed scaling), rounding to nearest, no Hadamard
transform: a tensor's codes then do not depend on the axis it is quantized along, so a
column-wise copy is the row-wise codes transposed (a copy of one byte per element), not a second
amax and cast. The weight-gradient GEMM takes grad_output's codes from the input-gradient GEMM
that way, and the input's from the forward GEMM, whose codes are what the layer saves.

An emulated GEMM whose operands dequantize exactly to bf16 (MX, NVFP4: no native kernel) gets
them on the Triton backend as bf16 values straight from the quantization kernel — the codes are
never stored and read back; in a compiled graph the kernel runs as an operator — except
operands that are kept (cached weights, saved inputs), which stay codes. The GEMM multiplies
the same values either way.

What is saved for backward: the weight (the parameter itself, no copy; with weight QAT, its
fake-quantized copy, which is what dgrad multiplies by) and the input — its forward codes where
they serve the weight-gradient GEMM as above (one byte per element instead of two), else as it
arrived, or, with `save_quantized_input=True`, only its column-wise quantized copy for the
weight-gradient GEMM, which is what that GEMM needs and all it needs.

NVFP4's tensor-level scale needs the amax of each tensor it quantizes: of the input (forward)
and the gradient (dgrad) as they are, and of both under the weight-gradient GEMM's Hadamard
transform. Where the values kernel makes those operands, one read of the input finds its two
amaxes in the forward (the transformed one is saved, a scalar) and one read of the gradient its
two in the backward (`kernels.two_amaxes`), instead of a pass for each amax.

A weight's amax, max |W|, can be given (`set_weight_amax`; the trainer gives the one the fused
AdamW finds as it writes W, through `set_weight_amaxes`): the weight's per-tensor quantizers
(FP8 tensorwise, delayed scaling's history, NVFP4's tensor level) then read no weight for it.
So can its columns' amaxes, for a recipe whose input-gradient GEMM takes W with one scale per
column (fp8_rowwise): that copy of W then needs no pass of its own for them.

Delayed scaling (`fp8_delayed`) keeps, per tensor role (input, weight, grad_output), an amax
history and the amax the next quantization uses, as buffers: they are saved and restored with
`state_dict()`.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from . import kernels
from .gemm import emulated_in_bf16, full_fp32, mm_fp32_out, scaled_matmul, values_matmul
from .quantize import QuantizedTensor, held, quantize, requantize, tensor_amax_of
from .recipes import DelayedScaling, Gemm, Operand, Recipe, get_recipe
from .schemes import get_scheme

ROLES = ("input", "weight", "grad_output")


class DelayedScalingState(nn.Module):
    """Amax histories (one row per role) and the amax each role's next quantization uses.

    Transformer Engine's order: a tensor is quantized with the amax chosen after the previous
    step; its own amax then goes into the history, the next amax is max(history) (or the most
    recent one), and the history window moves on by one.
    """

    def __init__(self, config: DelayedScaling, recipe: Recipe):
        super().__init__()
        self.config = config
        ops = (recipe.fprop.a, recipe.fprop.b, recipe.dgrad.a)
        self.register_buffer("amax_history", torch.zeros(len(ROLES), config.history_len))
        # amax = the element max makes the first decode scale exactly 1, as TE initialises it
        self.register_buffer("amax", torch.tensor([op.scheme.elem.max for op in ops]))
        self.recording = True  #: set per forward: training with autograd records, evaluation not

    def amax_for(self, role: str) -> torch.Tensor:
        """The amax (with the margin) that quantizes `role` now; a copy, safe to keep. Compiled,
        it is held (stored where it is read), so that a backward using it takes this value: the
        partitioner would otherwise read the buffer again in backward, after `record` has
        changed it, rather than save what the forward read."""
        amax = self.amax[ROLES.index(role)].clone() * 2.0**self.config.margin
        return held(amax) if torch.compiler.is_compiling() else amax

    @torch.no_grad()
    def record(self, role: str, t: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        """Put t's amax (`amax` where the caller has it already) into role's history."""
        if not self.recording:  # evaluation reads the histories but leaves them alone
            return
        r = ROLES.index(role)
        history = self.amax_history[r]
        if amax is None:
            amax = tensor_amax_of(t)  # written as the quantizer's, so a compiled graph merges the two
        history[0] = amax.float()
        new = history.max() if self.config.amax_compute == "max" else history[0].clone()
        # keep the previous amax when the new one is 0 or not finite, as TE keeps its scale
        self.amax[r] = torch.where((new > 0) & torch.isfinite(new), new, self.amax[r])
        history.copy_(torch.roll(history, -1))
        history[0].zero_()

    @torch.no_grad()
    def record_entries(self, role: str, amaxes: torch.Tensor) -> None:
        """Put the n amaxes of the 1-D `amaxes` into role's history, oldest first, as n `record`s
        would, one after another (whatever `recording` says), in a fixed handful of operations
        (a step's entries at once, where `record` takes a handful for each).

        Each record writes its amax into the window, takes the window's maximum (or the amax
        itself, `most_recent`) as the role's next amax unless that is 0 or not finite (TE keeps
        its scale then), and moves the window on by one. Laid end to end, the history's
        remembered entries (all but slot 0, which the next entry overwrites) and the n new ones
        hold every window the n records see: the k-th is history_len long and ends at the k-th
        new amax."""
        r = ROLES.index(role)
        history, n = self.amax_history[r], amaxes.numel()
        length = history.numel()
        seq = torch.cat([history[1:], amaxes.float()])
        new = seq.unfold(0, length, 1).amax(dim=1) if self.config.amax_compute == "max" else seq[length - 1:]
        # the next amax: that of the last record whose choice was kept, else the one there is
        kept = torch.cat([new.new_ones(1, dtype=torch.bool), (new > 0) & torch.isfinite(new)])
        last = (torch.arange(n + 1, device=kept.device) * kept).amax()
        self.amax[r] = torch.cat([self.amax[r : r + 1], new]).gather(0, last.reshape(1))[0]
        history[1:] = seq[n:]
        history[0] = 0


@dataclass(frozen=True)
class _Values:
    """An operand of an emulated GEMM as the values it multiplies: the (R, inner) bf16 matrix of
    the dequantized codes (never stored as codes) and the per-tensor scale the GEMM's fp32
    result is multiplied by (NVFP4), or None."""

    matrix: torch.Tensor
    tensor_scale: torch.Tensor | None


def _as_values(gemm: Gemm, t: torch.Tensor) -> bool:
    """Whether this GEMM's operands are made as values: it runs emulated on bf16 operands and
    the Triton backend makes the values in one kernel, with no codes in between (eagerly, or in
    a compiled graph through the kernel's operator: `kernels.values_in_one_kernel`)."""
    a, b = gemm.a.scheme, gemm.b.scheme
    return (a is not None and b is not None and emulated_in_bf16(get_scheme(a), get_scheme(b))
            and (kernels.uses_triton(t) or any(kernels.values_in_one_kernel(t, s) for s in (a, b))))


def _prepare(t: torch.Tensor, op: Operand, gemm: Gemm, axis: int, dtype, amax=None, codes: bool = False,
             tensor_amax=None, block_amaxes=None):
    """One GEMM operand from a high-precision 2-D tensor: Hadamard, then quantize along `axis`.

    Returns a QuantizedTensor, or, unquantized, the (R, inner) matrix in the compute dtype, or,
    for a GEMM that multiplies values (`_as_values`) unless `codes` asks for the codes, _Values
    (whose kernel applies the Hadamard transform itself where it can).

    tensor_amax: the amax of what is quantized (t under the GEMM's transform), where the caller
    has it already: NVFP4's tensor amaxes from `_two_amaxes`, a weight's from the fused AdamW
    (`QuantizedLinear.set_weight_amax`, given only to GEMMs without a transform);
    block_amaxes: its blocks' own amaxes, likewise (a weight's columns', for a copy with one
    scale per column).
    """
    if op.scheme is not None and not codes and amax is None and _as_values(gemm, t):
        return _Values(*kernels.quantized_values(t, op.scheme, rounding=op.rounding, axis=axis,
                                                 hadamard=gemm.hadamard, tensor_amax=tensor_amax,
                                                 block_amaxes=block_amaxes))
    if gemm.hadamard is not None:
        t = gemm.hadamard.transform(t, dim=axis)
    if op.scheme is None:
        return (t if axis == 1 else t.t()).to(dtype)
    return kernels.quantize(t, op.scheme, rounding=op.rounding, axis=axis, amax=amax, tensor_amax=tensor_amax,
                            block_amaxes=block_amaxes)


def _pairs_amaxes(rows: Operand, rows_gemm: Gemm, cols: Operand, cols_gemm: Gemm) -> bool:
    """Whether one tensor's operands `rows` (of `rows_gemm`, quantized along the tensor's rows as
    they are) and `cols` (of `cols_gemm`, along its columns under that GEMM's Hadamard transform)
    can take their tensor amaxes from one read (`kernels.two_amaxes`): two-level schemes (NVFP4)
    of 1 × h blocks, h the transform's size, and no transform on `rows_gemm`."""
    a, b, h = rows.scheme, cols.scheme, cols_gemm.hadamard
    if a is None or b is None or h is None or rows_gemm.hadamard is not None:
        return False
    a, b = get_scheme(a), get_scheme(b)
    return a.two_level and b.two_level and a.block == b.block == (1, h.size)


def _two_amaxes(t: torch.Tensor, rows: Operand, rows_gemm: Gemm, cols: Operand, cols_gemm: Gemm, amax=None):
    """NVFP4's two tensor amaxes of the 2-D tensor t in one read (`kernels.two_amaxes`), or None:
    [0] that of t for the operand quantized along its rows (`rows`, of `rows_gemm`: the
    forward's input, dgrad's gradient), [1] that of t's Hadamard-transformed columns for the
    operand of the weight-gradient GEMM (`cols`, of `cols_gemm`) — where `_pairs_amaxes` says so,
    both are values made by the one kernel, and no amax override applies. Each values kernel then
    reads t once instead of twice."""
    if (amax is not None or not _pairs_amaxes(rows, rows_gemm, cols, cols_gemm)
            or not (_as_values(rows_gemm, t) and _as_values(cols_gemm, t))
            or not all(kernels.two_amaxes_in_one_read(t, op.scheme, cols_gemm.hadamard) for op in (rows, cols))):
        return None
    return kernels.two_amaxes(t, cols_gemm.hadamard)


def _transposable(p: Operand, p_gemm: Gemm, q: Operand, q_gemm: Gemm) -> bool:
    """Whether operand q (column-wise) is operand p's codes transposed: one fp32 scale for the
    whole tensor, 8-bit codes, the same scheme, rounding to nearest, no Hadamard transform on
    either GEMM (and, the callers' part, the same amax override)."""
    s = p.scheme
    return (s is not None and s == q.scheme and s.block == (-1, -1) and not s.two_level and s.elem.bits == 8
            and p.rounding == q.rounding == "nearest" and p_gemm.hadamard is None and q_gemm.hadamard is None)


def _square_transposable(p: Operand, p_gemm: Gemm, q: Operand, q_gemm: Gemm) -> bool:
    """Whether operand q's values (column-wise) are operand p's values transposed: the same
    scheme with square blocks (a block read either way is the same block: the same amax, scale
    and tensor amax), rounding to nearest, no Hadamard transform on either GEMM (and, the
    callers' part, no amax override)."""
    s = p.scheme
    return (s is not None and s == q.scheme and s.block[0] == s.block[1] > 1
            and p.rounding == q.rounding == "nearest" and p_gemm.hadamard is None and q_gemm.hadamard is None)


def _codes_transposable(p: Operand, p_gemm: Gemm, q: Operand, q_gemm: Gemm) -> bool:
    """Whether operand q's codes (column-wise) are operand p's transposed, byte for byte: as
    `_transposable`, or square blocks of 8-bit codes under one scale each (fp8_blockwise's
    128x128 weights: a block read either way is the same block, with the same scale)."""
    s = p.scheme
    return _transposable(p, p_gemm, q, q_gemm) or (_square_transposable(p, p_gemm, q, q_gemm)
                                                   and s.elem.bits == 8 and not s.two_level)


def _transpose(q: QuantizedTensor) -> QuantizedTensor:
    """A 2-D QuantizedTensor of 8-bit codes under one scale, or under square blocks' scales,
    quantized along its other axis: the codes transposed (by a tiled Triton copy where the
    kernel backend says so, in compiled graphs too), and the blocks' scales."""
    scale = q.scale if q.scale.numel() == 1 else q.scale.t().contiguous()
    return replace(q, data=kernels.transpose_codes(q.data), scale=scale, axis=1 - q.axis)


class _SharedOperands:
    """The last few activation operands prepared, reused when another Linear asks for the same
    operand of the same tensor — q_proj, k_proj and v_proj read one input, so do gate_proj and
    up_proj — instead of quantizing it again (the same bits: same tensor, scheme, axis, rounding
    to nearest, no amax override). Each entry holds its source tensor, so its storage cannot be
    freed and reused while the entry lives; a changed version counter is a miss."""

    def __init__(self, size: int = 2):
        self.size, self.entries, self.enabled = size, [], True

    def prepare(self, t: torch.Tensor, op: Operand, gemm: Gemm, axis: int, dtype, amax=None, codes: bool = False,
                tensor_amax=None):
        if (not self.enabled or amax is not None or op.rounding != "nearest"
                or torch.compiler.is_compiling()):
            return _prepare(t, op, gemm, axis, dtype, amax, codes, tensor_amax)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype, t._version, op.scheme, gemm.hadamard, axis, dtype, codes or not _as_values(gemm, t))
        for k, _source, prepared in self.entries:
            if k == key:
                return prepared
        prepared = _prepare(t, op, gemm, axis, dtype, amax, codes, tensor_amax)
        self.entries = [(key, t, prepared), *self.entries[: self.size - 1]]
        return prepared

    def two_amaxes(self, t: torch.Tensor, rows: Operand, rows_gemm: Gemm, cols: Operand, cols_gemm: Gemm,
                   amax=None):
        """_two_amaxes(...), found once for the Linears that read the same tensor (nothing looked up
        or kept for operands that never pair their amaxes)."""
        if amax is not None or not _pairs_amaxes(rows, rows_gemm, cols, cols_gemm):
            return None
        if not self.enabled or torch.compiler.is_compiling():
            return _two_amaxes(t, rows, rows_gemm, cols, cols_gemm, amax)
        key = ("two amaxes", t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype, t._version, rows.scheme, cols.scheme, cols_gemm.hadamard)
        for k, _source, prepared in self.entries:
            if k == key:
                return prepared
        prepared = _two_amaxes(t, rows, rows_gemm, cols, cols_gemm, amax)
        self.entries = [(key, t, prepared), *self.entries[: self.size - 1]]
        return prepared

    def transposed(self, q: QuantizedTensor) -> QuantizedTensor:
        """_transpose(q), made once for the Linears that saved the same codes."""
        if not self.enabled or torch.compiler.is_compiling():
            return _transpose(q)
        d = q.data
        key = ("transposed", d.untyped_storage().data_ptr(), d.storage_offset(), tuple(d.shape), d._version)
        for k, _source, prepared in self.entries:
            if k == key:
                return prepared
        prepared = _transpose(q)
        self.entries = [(key, d, prepared), *self.entries[: self.size - 1]]
        return prepared

    def clear(self) -> None:
        self.entries = []


SHARED_OPERANDS = _SharedOperands()


def share_operands(on: bool) -> None:
    """Reuse an activation operand prepared for one Linear in the next Linear that reads the
    same tensor the same way (on by default; the results are the same bits either way)."""
    SHARED_OPERANDS.enabled = bool(on)
    SHARED_OPERANDS.clear()


@torch.no_grad()
def share_input_scales(model: nn.Module, *inputs, **kwargs) -> list[list[str]]:
    """Let the delayed-scaling Linears that read one tensor quantize it with one amax, so that a
    compiled graph casts it once for all of them (as it does under per-tensor current scaling):
    q_proj, k_proj and v_proj read one normalised input, gate_proj and up_proj another. Each
    such Linear records that tensor's amax into its own input history every step, so their
    histories hold the same numbers step after step; in separate buffers, though, which a
    compiled graph cannot know to be equal, so it casts the tensor once per Linear and keeps
    each cast's codes for the backward. After this, each of them reads the input amax of the
    group's last Linear in the forward's order — the one whose record comes last, so every
    member reads it before it changes, as each would read its own — and still records into
    its own history: the codes, scales and histories are those of unshared scaling, bit for
    bit, and a checkpoint is the same.

    Which Linears read one tensor is found by watching one forward of `model(*inputs, **kwargs)`
    (without gradients: no history records), not guessed from names (cross-attention's k and v
    read another tensor than its q). A group is shared only if each member ran once and their
    input histories and amaxes are equal now, as they are for Linears that have read one tensor
    since they were made (sharing keeps them so). The forward must call the members in the same
    order every time. Called again, it finds the groups afresh. Returns the groups shared, by
    module name in call order."""
    linears = {m: name for name, m in model.named_modules()
               if isinstance(m, QuantizedLinear) and m.delayed_scaling is not None}
    for m in linears:
        m._config.input_state = m.delayed_scaling
    if not linears:
        return []
    seen: list[tuple[QuantizedLinear, tuple, torch.Tensor]] = []

    def watch(module, args):
        x = args[0]  # kept until the forward is over: its storage cannot be freed and given to
        # a later tensor, whose key would then be this one's
        seen.append((module, (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape),
                              tuple(x.stride()), x.dtype, x._version), x))

    hooks = [m.register_forward_pre_hook(watch) for m in linears]
    try:
        model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    calls = collections.Counter(m for m, _, _ in seen)
    groups: dict[tuple, list[QuantizedLinear]] = {}
    for m, key, _ in seen:
        if calls[m] == 1:
            groups.setdefault(key, []).append(m)
    del seen
    shared = []
    for members in groups.values():
        owner = members[-1]
        o = owner.delayed_scaling
        if len(members) < 2 or not all(
                m.delayed_scaling.config == o.config and torch.equal(m.delayed_scaling.amax_history[0], o.amax_history[0])
                and torch.equal(m.delayed_scaling.amax[0], o.amax[0]) for m in members):
            continue
        for m in members:
            m._config.input_state = o
        shared.append([linears[m] for m in members])
    return shared


@torch.no_grad()
def set_weight_amaxes(model: nn.Module, amax_of=None) -> int:
    """Give every QuantizedLinear of the model whose quantizers use the weight's amax
    (`uses_weight_amax`) that amax before a forward (eager code: a compiled graph cannot check a
    weight's version): `amax_of(weight)`, or `amax_of(weight, dim=0)` for the columns' amaxes
    where the layer takes those (`weight_amax_dim`) — an `AdamW.weight_amax`, found as the
    optimizer wrote the weight — or, where that gives None (no step yet, a weight changed since)
    or no amax_of is given, one reduction of the weight here. Every forward then sees an amax, so
    a compiled graph is made once. Returns how many layers took theirs from amax_of."""
    n = 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear) and m.uses_weight_amax:
            dim = m.weight_amax_dim
            amax = None if amax_of is None else amax_of(m.weight) if dim is None else amax_of(m.weight, dim=dim)
            n += amax is not None
            if amax is None:
                amax = torch.linalg.vector_norm(m.weight.detach(), ord=float("inf"), dim=dim).float()
            m.set_weight_amax(amax)
    return n


def prepare_weights(model: nn.Module, in_place: bool = False, micro_batches: int | None = None,
                    compiled: bool = False) -> list:
    """QuantizedLinear.prepare_weight on every layer whose recipe reuses its weight operands
    (`in_place`: into the last step's tensors, for CUDA graphs; `micro_batches`: delayed
    scaling's weights too, for that many training forwards); returns those layers (each to be
    released before its weight changes).

    compiled=True makes every layer's operands (and history entries) in one function compiled
    by `convert.compile_model` (inductor) instead of layer by layer in eager mode: the same bits
    from a few fused kernels a layer, launched by one call, where eager mode launches dozens of
    small operations a layer, which on a GPU take the host longer than the casts take the
    device. It compiles on the first call, and again when the layers or `micro_batches` change."""
    if not compiled:
        return [m for m in model.modules()
                if isinstance(m, QuantizedLinear) and m.prepare_weight(in_place=in_place, micro_batches=micro_batches)]
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m._prepares(micro_batches)]
    if layers:
        for m in layers:  # amaxes given before the weight last changed are dropped here (a
            m._given_weight_amax()  # graph takes what it finds as given)
        for m, operands in zip(layers, _compiled_layers_operands()(layers, micro_batches)):
            m._hold(operands, in_place)
    return layers


def _layers_operands(layers: list, micro_batches: int | None) -> list:
    """Each layer's `_weight_operands`: the function `prepare_weights(compiled=True)` compiles."""
    return [m._weight_operands(micro_batches) for m in layers]


@functools.cache
def _compiled_layers_operands():
    from .convert import compile_model

    return compile_model(_layers_operands)


def _same_layout(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether b can be copied into a as it is: both None, or tensors of one shape, stride,
    dtype and device."""
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device


def _matmul(a, b, out_dtype: torch.dtype, recipe: Recipe, native, gemm: Gemm) -> torch.Tensor:
    """A · Bᵀ for prepared operands (quantized, values, or high-precision matrices) of `gemm`."""
    if isinstance(a, _Values) or isinstance(b, _Values):  # gemm.emulated_matmul's bf16 path
        A, B = (o.matrix if isinstance(o, _Values) else kernels.dequantize_matrix(o, torch.bfloat16, tensor_scale=False)
                for o in (a, b))
        return values_matmul(A, B, (a.tensor_scale, b.tensor_scale), out_dtype)
    if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor):
        return scaled_matmul(a, b, out_dtype=out_dtype, native=native, fast_accum=gemm.fast_accum)
    dtype = recipe.compute_dtype
    A = kernels.dequantize_matrix(a, dtype) if isinstance(a, QuantizedTensor) else a
    B = kernels.dequantize_matrix(b, dtype) if isinstance(b, QuantizedTensor) else b
    if dtype == torch.float32:
        with full_fp32():
            return (A @ B.t()).to(out_dtype)
    if out_dtype == torch.float32:
        return mm_fp32_out(A, B.t())
    return (A @ B.t()).to(out_dtype)


def _known_amaxes(gemm: Gemm, axis: int, known):
    """(block amaxes, tensor amax) of a weight operand of `gemm` quantized along `axis`, from the
    weight's own amaxes as given (`QuantizedLinear.set_weight_amax`), where they are the
    operand's (no transform): max |W| is its tensor amax; the columns' amaxes (one per column of
    W) are the block amaxes of the copy quantized along the columns (axis 0), and nothing of
    the other."""
    if known is None or gemm.hadamard is not None:
        return None, None
    if known.dim() == 0:
        return None, known
    return (known, None) if axis == 0 else (None, None)


def _weight_max(known):
    """max |W| where the weight's given amaxes (`QuantizedLinear.set_weight_amax`) are that one
    value, else None (none given, or its columns'): the amax a delayed-scaling history records
    for the weight, which `record` reads from W when None."""
    return known if known is not None and known.dim() == 0 else None


class _Config:
    """The non-tensor arguments of the autograd function (one per module)."""

    def __init__(self, recipe: Recipe, native, save_quantized_input: bool, state,
                 recompute_weight_values: bool = False):
        self.recipe, self.native = recipe, native
        self.save_quantized_input, self.state = save_quantized_input, state
        # delayed scaling: the state whose input amax quantizes the input (`share_input_scales`:
        # that of the last Linear reading the same tensor; else this Linear's own)
        self.input_state = state
        self.recompute_weight_values = recompute_weight_values
        self.cache_weight = False
        self.grad_enabled = True  # set per forward: whether autograd records it (a backward may follow)
        self.weight_cache: dict = {}  # axis → (weight version, quantized weight)
        # prepare_weight: the fprop and dgrad weight operands without their tensors (which enter
        # the autograd function as inputs)
        self.prepared: tuple | None = None

    def weight_operand(self, weight, op: Operand, gemm: Gemm, axis: int, dtype, amax, known_amax=None):
        """The weight prepared for one GEMM; with cache_weight, reused while the weight is
        unchanged (micro-batches of one optimizer step, evaluation). A weight with delayed-
        scaling amaxes or stochastic rounding is prepared afresh each time, as its definition
        asks; so is every weight while a graph is being traced. known_amax: the weight's own
        amax or its columns' amaxes, given (`QuantizedLinear.set_weight_amax`), used where they
        are the operand's (`_known_amaxes`). Cached, dgrad's copy is the fprop copy's codes
        transposed where those are its bits (`_codes_transposable`), as in `prepare_weight`."""
        reusable = (self.cache_weight and amax is None and op.rounding == "nearest"
                    and not torch.compiler.is_compiling())
        block_amaxes, tensor_amax = _known_amaxes(gemm, axis, known_amax)
        if not reusable:
            return _prepare(weight, op, gemm, axis, dtype, amax, tensor_amax=tensor_amax, block_amaxes=block_amaxes)
        key = (weight._version, weight.data_ptr(), weight.dtype, tuple(weight.shape))
        hit = self.weight_cache.get(axis)
        if hit is not None and hit[0] == key:
            return hit[1]
        rows = self.weight_cache.get(1)
        fp = self.recipe.fprop
        if (axis == 0 and rows is not None and rows[0] == key and isinstance(rows[1], QuantizedTensor)
                and _codes_transposable(fp.b, fp, op, gemm)):  # the fprop codes transposed (prepare_weight)
            prepared = _transpose(rows[1])
        else:
            prepared = _prepare(weight, op, gemm, axis, dtype, amax, True, tensor_amax, block_amaxes)  # as codes
        self.weight_cache[axis] = (key, prepared)
        return prepared


def _prepared_operands(cfg: _Config, tensors: tuple) -> tuple:
    """(fprop, dgrad) weight operands of `QuantizedLinear.prepare_weight` from their tensors
    (data, scale, tensor scale of each), or (None, None) when none were prepared."""
    if not tensors:
        return None, None
    return tuple(replace(q, data=d, scale=s, tensor_scale=ts)
                 for q, (d, s, ts) in zip(cfg.prepared, (tensors[:3], tensors[3:])))


class _QuantizedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, weight_amax, cfg: _Config, *prepared):
        recipe, state, dt = cfg.recipe, cfg.state, cfg.recipe.compute_dtype
        w_fprop, w_dgrad = _prepared_operands(cfg, prepared)
        ctx.n_prepared = len(prepared)
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        # delayed scaling: the amaxes chosen after the previous step, kept for backward too
        amax_in = cfg.input_state.amax_for("input") if state is not None else None
        amax_w = state.amax_for("weight") if state is not None else None

        if recipe.weight_qat is not None:  # QAT: the GEMMs see Q(W); W gets their gradient
            weight_amax = None  # W's, not Q(W)'s
            qat = recipe.weight_qat
            weight = quantize(weight, qat.scheme, rounding=qat.rounding).dequantize(weight.dtype)

        # ---- fprop: output = input @ weight_t ------------------------- (M, K) · (N, K)ᵀ
        fp, wg = recipe.fprop, recipe.wgrad
        # NVFP4: the input's tensor amax and its transformed columns' (for wgrad) in one read
        x_amaxes = None
        if cfg.grad_enabled and ctx.needs_input_grad[1] and not cfg.save_quantized_input:
            x_amaxes = SHARED_OPERANDS.two_amaxes(x2, fp.a, fp, wg.b, wg, amax_in)
        a = SHARED_OPERANDS.prepare(x2, fp.a, fp, 1, dt, amax_in,
                                    tensor_amax=x_amaxes[0] if x_amaxes is not None else None)
        if w_fprop is not None:  # prepared before this (compiled) graph: an input
            b = w_fprop
        elif recipe.weight_qat is not None:  # Q(W) is a new tensor each call: nothing to reuse
            b = _prepare(weight, fp.b, fp, 1, dt, amax_w)
        else:
            b = cfg.weight_operand(weight, fp.b, fp, 1, dt, amax_w, weight_amax)
        out = _matmul(a, b, x.dtype, recipe, cfg.native, fp)  # a drop-in: output in x's dtype
        if bias is not None:
            out = out + bias.to(out.dtype)
        if state is not None:
            state.record("input", x2)
            if w_fprop is None:  # (prepared: `prepare_weight` made the weight's entries for its forwards)
                state.record("weight", weight, amax=_weight_max(weight_amax))

        # save what the backward GEMMs need, and nothing else
        dg = recipe.dgrad
        ctx.input_q = ctx.input_t = None
        if isinstance(a, QuantizedTensor) and _transposable(fp.a, fp, wg.b, wg):
            ctx.input_q = replace(a, data=None, scale=None)  # wgrad transposes these codes
            saved = [weight, a.data, a.scale]
        elif cfg.save_quantized_input and wg.b.scheme is not None:
            input_t = SHARED_OPERANDS.prepare(x2, wg.b, wg, 0, dt, amax_in, codes=True)  # (K, M), along tokens
            ctx.input_t = replace(input_t, data=None, scale=None, tensor_scale=None)
            saved = [weight, input_t.data, input_t.scale, input_t.tensor_scale]
        else:
            saved = [weight, x2]  # as given (a converted model's activations are already in
            # the compute dtype)
        ctx.x_amax_at = None
        if x_amaxes is not None:  # wgrad's tensor amax of the input, after the input's tensors
            ctx.x_amax_at = len(saved)
            saved.append(x_amaxes[1])
        ctx.weight_amax_at = None
        if weight_amax is not None:  # the weight's own amax(es), for dgrad's column-wise copy
            ctx.weight_amax_at = len(saved)
            saved.append(weight_amax)
        # In a compiled graph, dgrad's column-wise weight takes the forward's one scale (the
        # weight is unchanged, so its amax is too) instead of reading the fp32 weight again for
        # its amax; eagerly the fused kernels make it, or the weight cache keeps it.
        ctx.weight_q = ctx.w_dgrad = ctx.w_values = None
        if w_dgrad is not None:  # prepared: its tensors saved last
            ctx.w_dgrad = cfg.prepared[1]
            saved += [w_dgrad.data, w_dgrad.scale, w_dgrad.tensor_scale]
        elif (isinstance(b, _Values) and amax_w is None and recipe.weight_qat is None
                and not cfg.recompute_weight_values and _square_transposable(fp.b, fp, dg.b, dg)):
            # square blocks (NVFP4's 16x16 weights): dgrad multiplies these values transposed
            # instead of reading the fp32 weight twice more (amax, values); they hold 2 bytes a
            # weight from the forward to the backward (memory.py counts them)
            ctx.w_values = True
            saved += [b.matrix, b.tensor_scale]
        elif (torch.compiler.is_compiling() and recipe.weight_qat is None and isinstance(b, QuantizedTensor)
                and b.scheme.scale_fmt.bits > 8 and _transposable(fp.b, fp, dg.b, dg)):
            ctx.weight_q = replace(b, data=None, scale=None)
            saved.append(b.scale)
        ctx.save_for_backward(*saved)
        ctx.cfg, ctx.amax_in, ctx.amax_w = cfg, amax_in, amax_w
        ctx.has_bias, ctx.x_shape, ctx.x_dtype = bias is not None, x.shape, x.dtype
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        cfg = ctx.cfg
        recipe, state, dt = cfg.recipe, cfg.state, cfg.recipe.compute_dtype
        weight = ctx.saved_tensors[0]
        g2 = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N)
        amax_g = state.amax_for("grad_output") if state is not None else None
        grad_input = grad_weight = grad_bias = None
        g_rows = None  # grad_output's row-wise operand, when dgrad makes one
        dg, wg = recipe.dgrad, recipe.wgrad
        # NVFP4: grad_output's tensor amax and its transformed columns' in one read
        g_amaxes = _two_amaxes(g2, dg.a, dg, wg.a, wg, amax_g) if ctx.needs_input_grad[1] else None

        # ---- dgrad: grad_input = grad_output @ weight ------------------ (M, N) · (K, N)ᵀ
        if ctx.needs_input_grad[0]:
            a = g_rows = _prepare(g2, dg.a, dg, 1, dt, amax_g,
                                  tensor_amax=g_amaxes[0] if g_amaxes is not None else None)
            if ctx.w_dgrad is not None:  # prepared with the fprop operand
                data, scale, tensor_scale = ctx.saved_tensors[-3:]
                b = replace(ctx.w_dgrad, data=data, scale=scale, tensor_scale=tensor_scale)
            elif ctx.w_values:  # the forward's square-block values, transposed
                values, tensor_scale = ctx.saved_tensors[-2:]
                b = _Values(values.t(), tensor_scale)
            elif ctx.weight_q is not None:  # the forward's scale, the weight's codes along N
                b = requantize(weight, replace(ctx.weight_q, scale=ctx.saved_tensors[-1]), axis=0, amax=ctx.amax_w)
            elif recipe.weight_qat is not None:  # column-wise: along N
                b = _prepare(weight, dg.b, dg, 0, dt, ctx.amax_w)
            else:
                known = ctx.saved_tensors[ctx.weight_amax_at] if ctx.weight_amax_at is not None else None
                b = cfg.weight_operand(weight, dg.b, dg, 0, dt, ctx.amax_w, known)
            grad_input = _matmul(a, b, ctx.x_dtype, recipe, cfg.native, dg).reshape(ctx.x_shape)

        # ---- wgrad: grad_weight = grad_output_t @ input ---------------- (N, M) · (K, M)ᵀ
        if ctx.needs_input_grad[1]:
            if isinstance(g_rows, QuantizedTensor) and _transposable(dg.a, dg, wg.a, wg):
                a = _transpose(g_rows)  # the same codes, column-wise
            else:  # column-wise: along tokens
                a = _prepare(g2, wg.a, wg, 0, dt, amax_g, tensor_amax=g_amaxes[1] if g_amaxes is not None else None)
            if ctx.input_q is not None:  # the forward's codes, transposed
                data, scale = ctx.saved_tensors[1:3]
                b = SHARED_OPERANDS.transposed(replace(ctx.input_q, data=data, scale=scale))
            elif ctx.input_t is not None:  # saved quantized: put its tensors back
                data, scale, tensor_scale = ctx.saved_tensors[1:4]
                b = replace(ctx.input_t, data=data, scale=scale, tensor_scale=tensor_scale)
            else:
                x_amax = ctx.saved_tensors[ctx.x_amax_at] if ctx.x_amax_at is not None else None
                b = SHARED_OPERANDS.prepare(ctx.saved_tensors[1], wg.b, wg, 0, dt, ctx.amax_in, tensor_amax=x_amax)
            grad_weight = _matmul(a, b, weight.dtype, recipe, cfg.native, wg)

        if state is not None:
            state.record("grad_output", g2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g2.float().sum(0)
        return grad_input, grad_weight, grad_bias, None, None, *([None] * ctx.n_prepared)


class QuantizedLinear(nn.Linear):
    """nn.Linear with its three GEMMs in a recipe's precision; parameters keep their dtype.

    recipe: a name from RECIPES or a Recipe. native: "auto" (native FP8 on Hopper where the
    shapes allow, emulation elsewhere), True (insist; an error if impossible), False (always
    emulate). save_quantized_input: keep only the quantized column-wise input for backward.
    recompute_weight_values: where the weight's blocks are square and its GEMMs multiply values
    (NVFP4's 16x16 weights on a GPU), quantize the weight again for the input-gradient GEMM
    instead of keeping the forward's values until backward (2 bytes a weight less memory
    between them, one more pass over the weight); the bits are the same either way.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        recipe: str | Recipe = "bf16",
        *,
        native: bool | str = "auto",
        save_quantized_input: bool = False,
        recompute_weight_values: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._configure(recipe, native, save_quantized_input, recompute_weight_values)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, recipe: str | Recipe, *, native="auto", save_quantized_input=False,
        recompute_weight_values=False,
    ) -> QuantizedLinear:
        """A QuantizedLinear that shares `linear`'s weight and bias Parameters (no copy)."""
        q = cls.__new__(cls)
        nn.Module.__init__(q)
        q.in_features, q.out_features = linear.in_features, linear.out_features
        q.weight, q.bias = linear.weight, linear.bias
        q.train(linear.training)
        q._configure(recipe, native, save_quantized_input, recompute_weight_values)
        return q

    def _configure(self, recipe, native, save_quantized_input, recompute_weight_values=False):
        self.recipe = get_recipe(recipe)
        if native not in ("auto", True, False):
            raise ValueError(f"native must be 'auto', True or False, not {native!r}")
        self.native = native
        self.delayed_scaling = None
        if self.recipe.delayed is not None:
            state = DelayedScalingState(self.recipe.delayed, self.recipe)
            self.delayed_scaling = state.to(self.weight.device)
        self._config = _Config(self.recipe, native, save_quantized_input, self.delayed_scaling,
                               recompute_weight_values)
        self._prepared: tuple = ()  # prepare_weight: the operands' tensors, inputs of the autograd function
        self._kept: tuple = ()  # prepare_weight(in_place=True): those tensors, kept for the next preparation
        self._prepared_version = -1  # and the weight's version when they were made
        self._weight_amax: torch.Tensor | None = None  # set_weight_amax: the weight's amax,
        self._weight_amax_version = -1  # given, and the weight's version then

    @property
    def save_quantized_input(self) -> bool:
        """Keep only the quantized column-wise input for backward (see the class docstring);
        may be switched between steps."""
        return self._config.save_quantized_input

    @save_quantized_input.setter
    def save_quantized_input(self, on: bool) -> None:
        self._config.save_quantized_input = bool(on)

    @property
    def recompute_weight_values(self) -> bool:
        """Quantize a square-block weight again for the input-gradient GEMM instead of keeping
        the forward's values (see the class docstring); may be switched between steps."""
        return self._config.recompute_weight_values

    @recompute_weight_values.setter
    def recompute_weight_values(self, on: bool) -> None:
        self._config.recompute_weight_values = bool(on)

    @property
    def cache_weight(self) -> bool:
        """Reuse the quantized weight while the weight is unchanged (off by default: the copy
        then stays in memory between steps). Worth it with gradient accumulation, where the
        micro-batches of a step share one weight, and for evaluation. "Unchanged" means the
        same storage and version counter: in-place updates through `weight.data` are not seen,
        so switch it off (which empties the cache) around such updates."""
        return self._config.cache_weight

    @cache_weight.setter
    def cache_weight(self, on: bool) -> None:
        self._config.cache_weight = bool(on)
        if not on:
            self._config.weight_cache.clear()

    def prepare_weight(self, *, in_place: bool = False, micro_batches: int | None = None) -> bool:
        """Quantize the weight's fprop and dgrad operands now (dgrad's as the fprop codes
        transposed where those are its bits: `_codes_transposable`), for every forward and backward
        until `release_weight`: in compiled graphs too, which take them as inputs instead of
        quantizing the weight again — so the micro-batches of one optimizer step share them
        under gradient accumulation (eager code has `cache_weight` for that). Only where the
        recipe reuses a weight operand (both quantized, rounded to nearest, no QAT; under
        delayed scaling only given `micro_batches`, below); returns whether it prepared them.
        The weight must not change before `release_weight`: an eager forward checks its
        version, a compiled graph cannot.

        micro_batches: under delayed scaling, the number of training forwards (the micro-batches
        of one optimizer step) that these operands serve, as Transformer Engine's
        `is_first_microbatch` serves them: the weight is quantized once, with the amax its next
        forward would have used, and the step's entries of the weight's amax history are made
        here, the weight's amax for the first micro-batch and 0 for each later one (TE casts the
        weight in the first micro-batch only, so the later ones write no amax into its history;
        a 0 adds nothing to the history's maximum). The forwards with these operands record no
        weight amax of their own. Without it, delayed scaling quantizes the weight in every
        forward, recording its amax each time, and nothing is prepared (the default: TE's
        `is_first_microbatch=None`).

        in_place=True writes the operands into the tensors of the last in-place preparation,
        kept since (allocated between `release_weight` and the next preparation), where their
        shapes and dtypes still match: compiled graphs take a module's tensors as inputs at
        fixed addresses, and CUDA graphs record again when one moves, as operands made afresh
        each step would. The bits are the same either way."""
        if not self._prepares(micro_batches):
            return False
        self._hold(self._weight_operands(micro_batches), in_place)
        return True

    def _prepares(self, micro_batches: int | None) -> bool:
        """Whether `prepare_weight(micro_batches=micro_batches)` prepares this layer's weight
        operands; a bad `micro_batches` is refused whatever the recipe."""
        if micro_batches is not None and (isinstance(micro_batches, bool) or not isinstance(micro_batches, int)
                                          or micro_batches < 1):
            raise ValueError(f"micro_batches must be a positive int, not {micro_batches!r}")
        r = self.recipe
        return not (r.weight_qat is not None or (self.delayed_scaling is not None and micro_batches is None)
                    or any(op.scheme is None or op.rounding != "nearest" for op, _, _ in self._weight_ops()))

    def _weight_ops(self):
        """(operand, GEMM, axis) of the weight's two quantized operands: fprop's, along the rows;
        dgrad's, along the columns."""
        r = self.recipe
        return (r.fprop.b, r.fprop, 1), (r.dgrad.b, r.dgrad, 0)

    @torch.no_grad()
    def _weight_operands(self, micro_batches: int | None) -> list[QuantizedTensor]:
        """The tensor work of `prepare_weight` (for a layer it prepares): the weight's two
        operands, and under delayed scaling the step's entries of the weight's amax history.
        Free of the module's bookkeeping, so that one compiled function can make every layer's
        (`prepare_weights(compiled=True)`)."""
        r, state = self.recipe, self.delayed_scaling
        known = self._given_weight_amax()
        # delayed scaling: the amax the next forward would quantize the weight with
        amax = state.amax_for("weight") if state is not None else None
        made = []
        for op, gemm, axis in self._weight_ops():
            if axis == 0 and _codes_transposable(r.fprop.b, r.fprop, op, gemm):
                # the fprop operand's codes transposed: a byte read and written a weight
                # instead of reading the fp32 weight again (a one-scale operand's scale a
                # tensor of its own: a compiled graph guards on inputs that alias)
                q = _transpose(made[0])
                made.append(replace(q, scale=q.scale.clone()) if q.scale is made[0].scale else q)
                continue
            block_amaxes, tensor_amax = _known_amaxes(gemm, axis, known)
            made.append(_prepare(self.weight, op, gemm, axis, r.compute_dtype, amax, True, tensor_amax,
                                 block_amaxes))
        if state is not None:  # the step's history entries: the weight's amax, then a 0 a micro-batch
            first = _weight_max(known)
            first = tensor_amax_of(self.weight) if first is None else first
            state.record_entries("weight", torch.cat([first.reshape(1).float(), first.new_zeros(micro_batches - 1,
                                                                                               dtype=torch.float)]))
        return made

    def _hold(self, made: list[QuantizedTensor], in_place: bool) -> None:
        """Keep the operands `_weight_operands` made for the forwards and backwards until
        `release_weight` (`prepare_weight`'s `in_place` as there)."""
        cfg = self._config
        shells = tuple(replace(q, data=None, scale=None, tensor_scale=None) for q in made)
        if cfg.prepared != shells:  # kept when equal: a compiled graph guards on this object
            cfg.prepared = shells
        self._prepared_version = self.weight._version
        fresh = tuple(t for q in made for t in (q.data, q.scale, q.tensor_scale))
        if in_place and len(self._kept) == len(fresh) and all(map(_same_layout, self._kept, fresh)):
            for old, new in zip(self._kept, fresh):
                if old is not None:
                    old.copy_(new)
            fresh = self._kept
        self._kept = fresh if in_place else ()
        self._prepared = fresh

    def release_weight(self) -> None:
        """Drop the operands of `prepare_weight` (forwards quantize the weight again)."""
        self._prepared = ()

    @property
    def uses_weight_amax(self) -> bool:
        """Whether a quantizer of this layer's weight takes an amax of W (`set_weight_amax`):
        max |W| where the forward's weight operand has one scale for the tensor (FP8 tensorwise;
        delayed scaling, whose history records it) or a tensor level (NVFP4), under no
        transform; else its columns' amaxes where the input-gradient GEMM's copy of W has one
        scale per column (fp8_rowwise), under no transform and no delayed scaling
        (`weight_amax_dim` says which). Never with weight QAT."""
        return self._weight_amax_use() != "none"

    @property
    def weight_amax_dim(self) -> int | None:
        """The amax of W this layer's quantizers take (`uses_weight_amax`): None, max |W| over the
        whole tensor; 0, its maxima over dim 0, one per column."""
        return 0 if self._weight_amax_use() == "columns" else None

    def _weight_amax_use(self) -> str:
        r = self.recipe
        if r.weight_qat is not None:
            return "none"
        if r.fprop.b.scheme is not None and r.fprop.hadamard is None:
            s = get_scheme(r.fprop.b.scheme)
            if s.block == (-1, -1) or s.two_level:
                return "tensor"
        if r.dgrad.b.scheme is not None and r.dgrad.hadamard is None and r.delayed is None:
            s = get_scheme(r.dgrad.b.scheme)
            if s.block == (1, -1) and not s.two_level:  # one scale per column, along dim 0
                return "columns"
        return "none"

    def set_weight_amax(self, amax: torch.Tensor | None) -> None:
        """Give the weight's amax, max |W| (a 0-d fp32 tensor on its device, NaN if W holds
        NaN), as it is now — the fused AdamW finds it while writing W (`AdamW.weight_amax`) —
        so that the per-tensor quantizers of W (FP8 tensorwise's, delayed scaling's amax
        history, NVFP4's tensor level) take it instead of reading W for it; or, where the layer
        takes those (`weight_amax_dim` 0), its columns' amaxes (in_features fp32 values: max |W|
        over dim 0), for the input-gradient GEMM's copy of W with one scale per column. None
        forgets it. The quantized weight is the same bits either way when it is W's amax.

        It holds while W is unchanged: an eager forward checks W's version counter and reads W
        again once it moved; a compiled graph cannot check, so whoever gives it gives it again
        before every forward (`set_weight_amaxes`; the trainer and `bench train` do, each step,
        from their AdamW)."""
        columns = self.weight_amax_dim == 0
        n = self.in_features if columns else 1
        if amax is not None and (not isinstance(amax, torch.Tensor) or amax.numel() != n
                                 or amax.dtype != torch.float32 or amax.device != self.weight.device):
            what = f"{n} fp32 values (its columns' amaxes)" if columns else "one fp32 value"
            raise ValueError(f"set_weight_amax takes {what} on {self.weight.device} (or None)")
        self._weight_amax = None if amax is None else amax.reshape(-1) if columns else amax.reshape(())
        self._weight_amax_version = self.weight._version

    def _given_weight_amax(self) -> torch.Tensor | None:
        """The amax `set_weight_amax` gave: dropped (None) once the weight's version has moved,
        where that can be checked (not while a graph is traced, which takes it as given)."""
        if (self._weight_amax is not None and not torch.compiler.is_compiling()
                and self.weight._version != self._weight_amax_version):
            self._weight_amax = None  # W changed since: its quantizers read it again
        return self._weight_amax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:  # an empty batch (an expert that got no tokens): no operand to
            # quantize, no amax to record; the output is empty and the gradients are zeros
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return nn.functional.linear(x, self.weight.to(x.dtype), bias)
        if self.delayed_scaling is not None:
            self.delayed_scaling.recording = self.training and torch.is_grad_enabled()
        self._config.grad_enabled = torch.is_grad_enabled()  # (the autograd function's forward runs without)
        prepared = self._prepared
        if prepared and not torch.compiler.is_compiling() and self.weight._version != self._prepared_version:
            raise RuntimeError("the weight changed after prepare_weight(); call release_weight() before "
                               "changing it, or prepare_weight() again")
        return _QuantizedLinearFn.apply(x, self.weight, self.bias, self._given_weight_amax(), self._config,
                                        *prepared)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"
