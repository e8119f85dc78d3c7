"""The reference quantizer: `quantize(x, scheme) -> QuantizedTensor`, in plain torch.

THIS IS THE SPEC. Every fast kernel must produce the same codes and scales bit for bit.

    x (any shape) ── move `axis` last, flatten the rest ──► X (R, C), float32
    X ── zero-pad to whole blocks ──► (R/br, br, C/bc, bc) view, one scale per block
       amax per block (over real elements: the zero padding never raises an amax)
       scale per block (scaling.py: fp32 amax/max, power of two, or NVFP4 two-level)
       elements: cast(X / scale) (two-level: cast(X × enc)), saturating, to the element format
    codes ── packed along the last dimension (fp4: 2 per byte, fp6: 4 per 3 bytes) ──► data

`axis` names the dimension the blocks run along: the GEMM's inner dimension. The default, the
last one, is the row-wise copy; `axis=0` on a (M, K) matrix gives the column-wise copy that a
backward GEMM needs, stored as the (K, M) matrix with blocks along M, with no transpose by the
caller. Either way `dequantize()` returns a tensor of the original shape and layout.

Stochastic rounding draws one noise value per element of X, in X's row-major order.

A block whose amax is NaN or ±inf stores a NaN scale (scaling.py), so it dequantizes to NaN
whatever its element format can express, and zero codes. Quantized by a given amax (delayed
scaling's), its codes are those the given amax's scale makes instead, as for any other block:
x / scale cast saturating (±inf to ±max), a NaN element to the format's NaN code (0 in a format
without one); so a given amax's codes never wait on the tensor's own amax, and a compiled graph
can make them in the read that finds it. An empty tensor round-trips.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .codes import code_table, pack, packed_size, unpack
from .rounding import (
    CHUNK_ELEMENTS,
    Rounding,
    check_float_tensor,
    check_rounding,
    draw_noise,
    round_to_codes,
    work_dtype,
)
from .scaling import amax_scale, block_amax, exact_reciprocal, nan_where_not_finite, pow2_scale, two_level_scales
from .schemes import Scheme, get_scheme

# `hold`: a value a compiled graph stores once, where it is made, for every kernel that reads it.
# Left to itself, inductor computes a cheap value again in each kernel that reads it: a cast's
# fp64 reciprocal of its scale (a division and the scale's own arithmetic) for every element of
# the codes' kernel, or a cast's FP8 codes once for each GEMM and for the transpose that read
# them through dtype views (docs/kernels-notes.md, v79 to v81). Outside a compiled graph the
# operator is a copy; under inductor (its lowering, `hold_lowering`) it copies nothing.
_LIB = torch.library.Library("fewerbits", "FRAGMENT")
_LIB.define("hold(Tensor t) -> Tensor")
for _key in ("CPU", "CUDA"):
    _LIB.impl("hold", lambda t: t.clone(memory_format=torch.contiguous_format), _key)
torch.library.register_fake("fewerbits::hold", lambda t: t.new_empty(t.shape), lib=_LIB)


def held(t: torch.Tensor) -> torch.Tensor:
    """t (detached, row-major) stored by the kernel that computes it in a graph inductor
    compiles with `hold_lowering` registered (compile_model registers it), and read back by
    every kernel that uses it; a copy elsewhere. For compiled graphs only: the same values
    either way."""
    return torch.ops.fewerbits.hold(t.detach())


@functools.cache
def hold_lowering() -> None:
    """Register inductor's lowering of `hold`: the argument realized as a row-major buffer of its
    own dtype in the kernel that computes it (a dtype view of a value no kernel stores is
    stored as the view, by that kernel), or, stored already, returned as it is (a row-major
    copy only of a stored value laid out otherwise). No kernel and no call of its own."""
    from torch._inductor import ir
    from torch._inductor.lowering import register_lowering

    @register_lowering(torch.ops.fewerbits.hold.default, type_promotion_kind=None)
    def _hold(t):
        if isinstance(t.data, ir.BaseView) and not ir.is_storage_and_layout(t):
            # a view (a DtypeView: FP8 codes read as uint8) of an unstored value: its values,
            # as a pointwise node of the view's dtype, are what is stored (the GEMMs then view
            # that buffer as FP8 without a copy)
            t = ir.Pointwise.create(device=t.get_device(), dtype=t.get_dtype(), inner_fn=t.make_loader(),
                                    ranges=list(t.get_size()))
        t.realize()
        return ir.ExternKernel.require_contiguous(t)


@dataclass
class QuantizedTensor:
    """The stored form of a quantized tensor: packed codes, scales, and how to read them."""

    data: torch.Tensor  #: uint8 (R, packed C): element codes, blocked axis last, packed
    scale: torch.Tensor  #: (R/br, C/bc) block scales: float32 (fp32) or uint8 codes (e8m0, e4m3)
    scheme: Scheme  #: how it was quantized
    shape: torch.Size  #: shape of the original tensor
    axis: int  #: dimension of the original tensor that the blocks run along (non-negative)
    tensor_scale: torch.Tensor | None = None  #: fp32 per-tensor decode scale (two-level only)

    @property
    def matrix_shape(self) -> tuple[int, int]:
        """(R, C) of the 2-D view that was quantized: C is the length of `axis`."""
        return _matrix_shape(self.shape, self.axis)

    @property
    def nbytes(self) -> int:
        """True storage size: packed data, block scales and the per-tensor scale."""
        extra = self.tensor_scale.nbytes if self.tensor_scale is not None else 0
        return self.data.nbytes + self.scale.nbytes + extra

    @property
    def device(self) -> torch.device:
        return self.data.device

    def codes(self) -> torch.Tensor:
        """Unpacked element codes, (R, C) uint8."""
        return unpack(self.data, self.scheme.elem, self.matrix_shape[1])

    def block_scales(self) -> torch.Tensor:
        """Decode scale of each block as float32 (without the per-tensor scale)."""
        if self.scale.dtype == torch.uint8:  # 8-bit scale codes: every uint8 is a valid code
            return code_table(self.scheme.scale_fmt, self.scale.device)[self.scale.to(torch.int64)]
        return self.scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """data × scale (× the per-tensor scale), in the original shape, as `dtype`."""
        return _from_matrix(self.dequantize_matrix(), self.shape, self.axis).to(dtype)

    def dequantize_matrix(
        self, dtype: torch.dtype = torch.float32, *, tensor_scale: bool = True
    ) -> torch.Tensor:
        """The (R, C) matrix as stored (blocked axis last), dequantized; computed in float32.

        tensor_scale=False leaves out the per-tensor scale of two-level schemes (a GEMM applies
        it to its fp32 result instead).
        """
        rows, cols = self.matrix_shape
        br, bc = _block_shape(self.scheme, rows, cols)
        # unpacked codes are below 2^bits, the table's length: a lookup with nothing to check
        values = code_table(self.scheme.elem, self.data.device)[self.codes().to(torch.int64)]
        values = values * _per_element(self.block_scales(), br, bc, 0, rows, cols)
        if tensor_scale and self.tensor_scale is not None:
            values = values * self.tensor_scale
        return values.to(dtype)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor({self.scheme.name}: {self.scheme.describe()}, "
            f"shape={tuple(self.shape)}, axis={self.axis}, nbytes={self.nbytes})"
        )


def quantize(
    x: torch.Tensor,
    scheme: str | Scheme,
    *,
    scale_rule: str | None = None,
    rounding: Rounding = "nearest",
    generator: torch.Generator | None = None,
    axis: int = -1,
    amax: torch.Tensor | None = None,
    tensor_amax: torch.Tensor | None = None,
    block_amaxes: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize `x` by `scheme` (a name from SCHEMES or a Scheme); x is first made float32.

    scale_rule: override the scheme's rule ("amax", "floor", "rceil", "ceil", "even"; on fp32
    scales a power-of-two rule gives power-of-two fp32 scales). rounding: "nearest" or
    "stochastic" (noise from `generator`). axis: the dimension the blocks run along.
    amax: use this amax instead of the tensor's own to set the scales (one value per block,
    or one for all: delayed scaling); values beyond it saturate. A block that holds NaN or
    ±inf still gets a NaN scale, but its codes are those of the given amax's scale (a NaN
    element: the format's NaN code, or 0), not zeros: they do not depend on x's own amax.
    tensor_amax: x's own amax, max |x| (NaN if x holds NaN), where the caller has it already
    (the fused AdamW finds a weight's as it writes it); a scheme of one block for the tensor, or
    a two-level scheme's tensor level, takes it instead of reducing x for it. It must be x's
    amax: the codes are those of quantize(x, scheme) only then (an amax to quantize by instead
    is `amax`).
    block_amaxes: x's own blocks' amaxes, one per block (in any shape holding as many; NaN for
    a block holding NaN), where the caller has them already (the fused AdamW finds a weight's
    columns' as it writes it), taken instead of reducing x for them; like tensor_amax, they
    must be x's. (A kernel that finds them in the read that makes the codes may not read them.)
    """
    plan = make_plan(x, scheme, scale_rule=scale_rule, rounding=rounding, generator=generator,
                     axis=axis, amax=amax, tensor_amax=tensor_amax, block_amaxes=block_amaxes)
    codes = [
        element_codes(plan.X[r0:r1], plan.block_values(r0, r1), plan.scheme,
                      None if plan.noise is None else plan.noise[r0:r1], reciprocal=plan.block_reciprocals(r0, r1),
                      nan_free=plan.nan_free)
        for r0, r1 in _row_chunks(plan.rows, plan.cols, plan.X.device)
    ]
    codes = torch.cat(codes) if codes else plan.X.new_zeros(plan.rows, plan.cols, dtype=torch.uint8)
    return plan.finish(pack(codes, plan.scheme.elem))


def requantize(x: torch.Tensor, q: QuantizedTensor, axis: int, amax: torch.Tensor | None = None) -> QuantizedTensor:
    """x quantized along `axis` with the one decode scale of q, x's own quantization (one fp32
    scale per tensor, rounding to nearest): quantize(x, q.scheme, axis=axis) without the amax
    pass, since a tensor's amax and so its scale do not depend on the axis. A Linear's backward
    uses it in compiled graphs for the weight's column-wise copy, with the forward's scale; it
    makes the element pass over the whole matrix at once (eagerly `quantize` goes by slices).
    amax: the amax q was quantized by (delayed scaling's), whose scale makes the codes where
    q's is NaN (x holds NaN or ±inf): quantize(x, q.scheme, axis=axis, amax=amax)."""
    scheme = q.scheme
    if scheme.block != (-1, -1) or scheme.two_level or scheme.scale_fmt.bits <= 8:
        raise ValueError(f"requantize needs one fp32 scale per tensor, not {scheme.name}")
    ax = _normalize_axis(axis, x.dim())
    X = _to_matrix(x.detach(), ax)
    scale = q.scale.float().reshape(1, 1)
    factor = scale if amax is None else amax_scale(check_amax(amax, scale).reshape(1, 1), scheme.elem)
    reciprocal = held(exact_reciprocal(factor)) if torch.compiler.is_compiling() else None
    codes = element_codes(X, factor, scheme, reciprocal=reciprocal, nan_free=amax is None)
    return assemble(pack(codes, scheme.elem), scale, scheme, x.shape, ax)


def element_codes(chunk, block_factor, scheme: Scheme, noise=None, *, reciprocal=None, nan_free=True):
    """The element pass: codes of x scaled by its block's factor (the spec of every kernel).

    reciprocal: fp64 1 / scale per element (not with two-level schemes or noise), for x / scale
    as x · reciprocal rounded once to fp32 (`scaling.exact_reciprocal` says why it is the same
    quotient); the NaN-scale blocks are then found from it (finite exactly where the scale is:
    a scale is positive and finite, or NaN), so that a compiled kernel reads it alone.
    nan_free: the factors come from x's own amaxes, so a NaN element has a NaN factor; False
    for a given amax's factors, where a NaN element takes the format's NaN code (0 without one)."""
    if scheme.two_level:
        scaled = chunk * block_factor  # x × enc, the product rounded in fp32
    elif reciprocal is not None:
        scaled = (chunk.double() * reciprocal).float()
    else:
        scaled = chunk / block_factor  # x / scale: exact for powers of two, else rounded in fp32
    finite = torch.isfinite(block_factor if reciprocal is None else reciprocal)
    scaled = torch.where(finite, scaled, 0.0)  # NaN-scale blocks: 0 codes
    # from x's own amaxes no NaN is left: a NaN element makes its block's amax, so its scale,
    # NaN (and ±inf too); the other quotients are finite or ±inf (a scale or enc is finite and
    # nonzero). From a given amax a NaN element's quotient is NaN
    if not nan_free and not scheme.elem.has_nan:
        scaled = torch.where(torch.isnan(scaled), 0.0, scaled)
    return round_to_codes(scaled, scheme.elem, noise=noise, nan_free=nan_free)


@dataclass
class Plan:
    """Everything before the element pass: the 2-D view, the scales, the noise."""

    x_shape: torch.Size
    axis: int
    scheme: Scheme
    X: torch.Tensor  #: (R, C) float32, blocked axis last (a view where the layout allows)
    br: int
    bc: int
    scales: torch.Tensor  #: decode scale per block, float32
    factor: torch.Tensor  #: per block: the divisor (scale) or, two-level, the multiplier enc
    tensor_scale: torch.Tensor | None
    noise: torch.Tensor | None  #: int32 noise bits per element (stochastic rounding)
    nan_free: bool = True  #: the factors come from x's own amaxes (False: a given amax's, finite at a NaN element)

    @property
    def rows(self) -> int:
        return self.X.shape[0]

    @property
    def cols(self) -> int:
        return self.X.shape[1]

    def block_values(self, r0: int, r1: int) -> torch.Tensor:
        return _per_element(self.factor, self.br, self.bc, r0, r1, self.cols)

    def block_reciprocals(self, r0: int, r1: int) -> torch.Tensor | None:
        """fp64 1 / scale of each element's block, where compiled graphs multiply by it: one
        scale per tensor or per row (a value a GPU kernel computes once per row of its tile),
        elements rounded to nearest; None where they divide. (For smaller blocks inductor
        computed the fp64 reciprocal for every element, and the casts were slower than by
        division: docs/kernels-notes.md, v14.)"""
        if (self.scheme.two_level or self.noise is not None or not _whole(self.bc, self.cols)
                or not torch.compiler.is_compiling()):
            return None
        # held: stored once where the scales are made, rather than computed again with the
        # scale for every element of the codes' kernel (docs/kernels-notes.md, v79 to v81);
        # compiled, the rows are one chunk, so a plan holds its reciprocals once
        return _per_element(held(exact_reciprocal(self.factor)), self.br, self.bc, r0, r1, self.cols)

    def finish(self, data: torch.Tensor) -> QuantizedTensor:
        """The QuantizedTensor from packed element codes."""
        return assemble(data, self.scales, self.scheme, self.x_shape, self.axis, self.tensor_scale)


def assemble(data, scales, scheme: Scheme, shape, axis: int, tensor_scale=None) -> QuantizedTensor:
    """A QuantizedTensor from packed codes and float32 block scales (stored as codes if 8-bit)."""
    fmt = scheme.scale_fmt
    if fmt.bits <= 8:
        stored = round_to_codes(scales.to(work_dtype(scales.dtype, fmt)), fmt)
    else:
        stored = scales.float()
    # row-major (R, C) codes, as the native GEMMs read them; a no-op eagerly, and in a compiled
    # graph it keeps the compiler from returning the transposed view of an axis-0 quantization.
    # Compiled, the codes of 8-bit elements with fp32 scales (the native FP8 GEMMs' operands)
    # are held: made as FP8 values viewed as uint8, they are stored once, for both GEMMs and
    # the transpose that read one input's codes, not once for each (docs/kernels-notes.md, v81)
    data = data.contiguous()
    if torch.compiler.is_compiling() and scheme.elem.bits == 8 and fmt.bits == 32:
        data = held(data)
    return QuantizedTensor(data, stored, scheme, shape, axis, tensor_scale)


def make_plan(x, scheme, *, scale_rule=None, rounding="nearest", generator=None, axis=-1, amax=None,
              tensor_amax=None, block_amaxes=None) -> Plan:
    """Check the arguments, view x as (R, C), compute every block's scale and draw the noise."""
    check_float_tensor(x)
    check_rounding(rounding)
    scheme = get_scheme(scheme, scale_rule)
    axis = _normalize_axis(axis, x.dim())
    X = _to_matrix(x.detach(), axis)
    rows, cols = X.shape
    br, bc = _block_shape(scheme, rows, cols)
    if tensor_amax is not None:
        tensor_amax = check_tensor_amax(tensor_amax, X.device)
    if block_amaxes is not None:
        block_amaxes = check_block_amaxes(block_amaxes, block_grid(scheme, x.shape, axis), X.device)
    if block_amaxes is not None and X.numel():
        actual = block_amaxes  # the blocks' own, given
    elif tensor_amax is not None and _whole(br, rows) and _whole(bc, cols) and X.numel():
        actual = tensor_amax.reshape(1, 1)  # the one block's amax, given
    else:
        actual = _block_amaxes(x.detach(), X, br, bc, axis)  # (R/br, C/bc)
    overridden = amax is not None
    if amax is None:
        amax = actual
    else:  # the codes by the given amax; the scales stored NaN where x's own amax is not (below)
        amax = check_amax(amax, actual).expand(actual.shape)
    tensor_scale = None
    # Per block: the scale to store, and the factor the elements are divided or multiplied by.
    if scheme.two_level:
        if tensor_amax is None or overridden or not amax.numel():  # else the given one: x's own
            tensor_amax = amax.amax() if amax.numel() else amax.new_zeros(())
        scales, tensor_scale, factor = two_level_scales(amax, tensor_amax, scheme.elem, scheme.scale_fmt)
    elif scheme.pow2:
        scales = factor = pow2_scale(amax, scheme.elem, scheme.scale_rule, scheme.scale_fmt)
    else:
        scales = factor = amax_scale(amax, scheme.elem)
    if overridden:
        scales = nan_where_not_finite(scales, actual)
    noise = draw_noise((rows, cols), x.device, generator) if rounding == "stochastic" else None
    return Plan(x.shape, axis, scheme, X, br, bc, scales, factor, tensor_scale, noise, not overridden)


def check_amax(amax, actual: torch.Tensor) -> torch.Tensor:
    """An amax to quantize by (delayed scaling's), as fp32 in the shape of the blocks' actual
    amaxes `actual` on their device: one value for all blocks, or one per block in any shape
    holding as many (a per-row scheme's (R,) or (R, 1)); a clear error for anything else, which
    would otherwise broadcast against the blocks into scales of another shape."""
    if not isinstance(amax, torch.Tensor) or not amax.is_floating_point():
        raise ValueError(f"amax must be a floating-point tensor, not {type(amax).__name__}"
                         + (f" of {amax.dtype}" if isinstance(amax, torch.Tensor) else ""))
    if amax.numel() not in (1, actual.numel()):
        raise ValueError(f"amax must hold one value for all blocks or one per block ({actual.numel()}), "
                         f"not {amax.numel()} (shape {tuple(amax.shape)})")
    amax = amax.float().to(actual.device)
    return amax.reshape(()) if amax.numel() == 1 else amax.reshape(actual.shape)


def block_grid(scheme: Scheme, shape, axis: int) -> tuple[int, int]:
    """How many blocks of `scheme` a tensor of `shape` quantized along `axis` has: (down the
    rows, along them) of its (R, C) view, as its scales are laid out."""
    rows, cols = _matrix_shape(torch.Size(shape), _normalize_axis(axis, len(shape)))
    br, bc = _block_shape(scheme, rows, cols)
    return -(-rows // br), -(-cols // bc)


def check_block_amaxes(block_amaxes, grid: tuple[int, int], device) -> torch.Tensor:
    """Given block amaxes as fp32 of the blocks' shape `grid` on `device`; a clear error for
    anything but one floating-point value per block."""
    n = grid[0] * grid[1]
    if not isinstance(block_amaxes, torch.Tensor) or not block_amaxes.is_floating_point() or block_amaxes.numel() != n:
        got = (f"{block_amaxes.numel()} {block_amaxes.dtype} values" if isinstance(block_amaxes, torch.Tensor)
               else type(block_amaxes).__name__)
        raise ValueError(f"block_amaxes must hold one floating-point value per block ({n}), not {got}")
    return block_amaxes.float().to(device).reshape(grid)


def check_tensor_amax(tensor_amax, device) -> torch.Tensor:
    """A given tensor amax as a 0-d fp32 tensor on `device`; a clear error for anything else."""
    if not isinstance(tensor_amax, torch.Tensor) or tensor_amax.numel() != 1 or not tensor_amax.is_floating_point():
        raise ValueError("tensor_amax must be a one-element floating-point tensor (the tensor's max |x|)")
    return tensor_amax.float().to(device).reshape(())


def _block_amaxes(x: torch.Tensor, X: torch.Tensor, br: int, bc: int, axis: int) -> torch.Tensor:
    """Every block's amax, float32 (R/br, C/bc). A block of the whole tensor or of whole rows of
    X (one scale per tensor, per row) is reduced in x's own layout: the same values (a maximum is
    exact, and abs commutes with the conversion to fp32), but a compiler given X, the transposed
    view of an axis-0 quantization, emitted a reduction that read memory across its rows."""
    rows, cols = X.shape
    if X.numel() and x.dim() and _whole(bc, cols):
        if _whole(br, rows):
            return tensor_amax_of(x).float().reshape(1, 1)
        if br == 1:
            return x.abs().amax(dim=axis).float().reshape(rows, 1)
    return block_amax(_blocked(X, br, bc))


def tensor_amax_of(x: torch.Tensor) -> torch.Tensor:
    """max |x| in x's dtype, NaN propagating; for two or more dimensions, taken as the rows'
    maxima, then their maximum (the same number). Compiled, inductor runs a row reduction
    as one kernel that can also make what is computed from each row (a cast with a known scale),
    where a reduction over the whole tensor runs as passes of its own; and delayed scaling's
    amax of a tensor (linear.py), written alike, is merged with its quantizer's into one
    (docs/kernels-notes.md v33)."""
    if x.dim() >= 2:
        return torch.linalg.vector_norm(x, ord=float("inf"), dim=-1).amax()
    return torch.linalg.vector_norm(x, ord=float("inf"))


def fake_quantize(x: torch.Tensor, scheme: str | Scheme, *, dtype=torch.float32, **kwargs):
    """quantize(x, scheme, **kwargs).dequantize(dtype): the values a GEMM would see."""
    return quantize(x, scheme, **kwargs).dequantize(dtype)


def quantized_nbytes(shape, scheme: str | Scheme, axis: int = -1) -> int:
    """Bytes that quantize() stores for a tensor of `shape`, without quantizing anything."""
    scheme = get_scheme(scheme)
    shape = torch.Size(shape)
    axis = _normalize_axis(axis, len(shape))
    rows, cols = _matrix_shape(shape, axis)
    br, bc = _block_shape(scheme, rows, cols)
    n_scales = -(-rows // br) * -(-cols // bc)
    scale_bytes = n_scales * (1 if scheme.scale_fmt.bits <= 8 else 4)
    return rows * packed_size(cols, scheme.elem.bits) + scale_bytes + (4 if scheme.two_level else 0)


# -- the 2-D view -------------------------------------------------------------------------------


def _normalize_axis(axis: int, ndim: int) -> int:
    if ndim == 0:
        if axis not in (0, -1):
            raise ValueError(f"axis {axis} is out of range for a 0-d tensor")
        return 0
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def _matrix_shape(shape: torch.Size, axis: int) -> tuple[int, int]:
    """(R, C): C the length of `axis`, R the product of the other dimensions."""
    if len(shape) == 0:
        return 1, 1
    return math.prod([s for i, s in enumerate(shape) if i != axis]), shape[axis]


def matrix_view(x: torch.Tensor, axis: int) -> torch.Tensor:
    """(R, C) view of x with `axis` last, in x's dtype (a copy only where the layout needs one)."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.movedim(axis, -1).reshape(_matrix_shape(x.shape, axis))


def _to_matrix(x: torch.Tensor, axis: int) -> torch.Tensor:
    """(R, C) float32 matrix of x with `axis` last."""
    return matrix_view(x, axis).float()


def _from_matrix(m: torch.Tensor, shape: torch.Size, axis: int) -> torch.Tensor:
    if len(shape) == 0:
        return m.reshape(())
    moved = [s for i, s in enumerate(shape) if i != axis] + [shape[axis]]
    return m.reshape(moved).movedim(-1, axis)


def _block_shape(scheme: Scheme, rows: int, cols: int) -> tuple[int, int]:
    """The scheme's block with -1 resolved to the whole extent (at least 1)."""
    br, bc = scheme.block
    return (max(rows, 1) if br == -1 else br), (max(cols, 1) if bc == -1 else bc)


def _whole(block: int, extent: int) -> bool:
    """Whether a block spans the whole extent, known without a guard on a symbolic size: in a
    graph compiled for dynamic token counts, asking whether a block of 128 spans a count that is
    128 just then would specialise the graph to that count (torch 2.11's dynamo then failed to
    trace the quantized Linear; docs/kernels-notes.md v47). A block that only happens to span it
    takes the general path (blocked amaxes; a division rather than a reciprocal's product), to
    the same amaxes and codes."""
    return statically_known_true(block == extent)


def _blocked(m: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """Zero-pad (R, C) to whole blocks and view it as (R/br, br, C/bc, bc)."""
    rows, cols = m.shape
    padded = torch.nn.functional.pad(m, (0, -cols % bc, 0, -rows % br))
    return padded.reshape(padded.shape[0] // br, br, padded.shape[1] // bc, bc)


def _per_element(per_block: torch.Tensor, br: int, bc: int, r0: int, r1: int, cols: int):
    """The value of each element's block for rows r0:r1 of the (R, C) matrix, broadcastable to
    (r1 − r0, C): a block spanning all rows or all columns stays a broadcast dimension."""
    nbr, nbc = per_block.shape
    if torch.compiler.is_compiling():
        # each element's block by index arithmetic: torch 2.13's inductor (C++) miscompiled the
        # repeated-then-cut form below when the columns do not fill the last block. A single
        # block along an axis is given a dimension of a constant size 1: in a graph compiled for
        # dynamic sizes the blocks along the tokens are counted symbolically (the quantizer's
        # blocked amaxes; an operator's scales, kernels' `rowblock_codes`), a count that only a
        # guard makes 1, and broadcast from such a dimension inductor indexed the values by
        # each element's column instead of its block (docs/kernels-notes.md, v45 and v46)
        arange = functools.partial(torch.arange, device=per_block.device)
        rows = per_block[None, 0] if nbr == 1 else per_block[_block_of(arange(r0, r1), br)]
        return rows[:, 0, None] if nbc == 1 else rows[:, _block_of(arange(cols), bc)]
    if nbr == 1:
        rows = per_block
    elif br == 1:
        rows = per_block[r0:r1]
    else:
        rows = per_block[r0 // br : -(-r1 // br)].repeat_interleave(br, 0)[r0 % br : r0 % br + r1 - r0]
    return rows if nbc == 1 else rows.repeat_interleave(bc, 1)[:, :cols]


def _block_of(index: torch.Tensor, block: int) -> torch.Tensor:
    """index // block, in a graph being compiled: on a CPU as a right shift where the block is
    a power of two. torch 2.13's inductor (C++) splits a loop whose index it divides by an
    integer into whole blocks, dropping the remainder when the extent is not a multiple of the
    divisor: the elements of a last, partial block were never written (a 128x128-block weight
    of at most 128 rows and 200 columns kept 72 columns of uninitialised codes). It does not
    split at a shift."""
    if index.device.type == "cpu" and block & (block - 1) == 0:
        return index >> (block.bit_length() - 1)
    return index // block


def _row_chunks(rows: int, cols: int, device: torch.device):
    """(r0, r1) ranges of whole rows holding about CHUNK_ELEMENTS elements each (on a CPU;
    a GPU takes 256 times more per slice, where launches, not caches, are the cost). One range
    in a graph being compiled: the compiler fuses the element pass and keeps no temporaries,
    and slices would only add a concatenating copy."""
    if torch.compiler.is_compiling():
        return [(0, rows)]
    per_chunk = CHUNK_ELEMENTS * (256 if device.type == "cuda" else 1)
    step = max(1, per_chunk // max(cols, 1))
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
