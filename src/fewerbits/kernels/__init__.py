"""Fast paths for the reference quantizer, and the one switch that chooses them.

    set_backend("auto")        Triton for CUDA tensors when Triton imports (outside torch.compile),
                               the reference otherwise
    set_backend("triton")      Triton for every tensor outside torch.compile (CPU tensors too,
                               under TRITON_INTERPRET=1: for tests)
    set_backend("reference")   the plain-torch reference everywhere

Inside graphs torch.compile traces, the reference's operations are compiled instead, except the
bf16 values of emulated GEMM operands, which come from the one-pass kernel called as an operator
(`values_in_one_kernel`), FP8's codes of 1x128 and 128x128 blocks, which come from the same
kernel as another operator (`codes_in_one_kernel`), the transposed copies of one-byte codes,
which come from the tiled transpose kernel called as an operator (`transpose_in_one_kernel`),
and NVFP4's two tensor amaxes of an input or a gradient, found in one read by an operator
(`two_amaxes`).

`quantize()` here takes the reference's arguments and returns the reference's bits, and
`dequantize_matrix()` gives `QuantizedTensor.dequantize_matrix`'s values in one kernel
(kernels/dequant.py):

    1 × bc and bc × bc blocks (MX, NVFP4 1x16   one kernel reads the tensor once: block amax,
      and 16x16, FP8 1x128 and 128x128)         scale rule, codes, packing (kernels/rowblock.py)
    one block per row or per tensor, fp32       one reduction for the amax (an amax override
      scales (FP8 rowwise, tensorwise, delayed)   applies where it is finite), then the same
                                                kernel: scale rule, scales, codes
    every other scheme, or an amax override     the reference's `make_plan` (amaxes, scales),
                                                then one kernel for the element pass (cast.py)

Stochastic rounding gives the same bits too: the one-read kernels draw the reference's seed and
compute each element's noise from it (rounding.noise_bits); the element pass reads the
reference's noise.
CPU runs use the reference unless asked otherwise.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..codes import pack, packed_size
from ..quantize import QuantizedTensor, block_grid, check_block_amaxes, check_tensor_amax, make_plan, matrix_view
from ..quantize import _normalize_axis as normalize_axis
from ..quantize import quantize as reference_quantize
from ..rounding import check_float_tensor, check_rounding, draw_seed
from ..schemes import SCHEMES, get_scheme

BACKENDS = ("auto", "triton", "reference")
_backend = "auto"


def set_backend(name: str) -> None:
    """Choose how `quantize` runs: "auto", "triton" or "reference"."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "triton" and not triton_available():
        raise RuntimeError("the triton backend needs the triton package (pip install triton)")
    _backend = name


def backend() -> str:
    return _backend


_TRITON = importlib.util.find_spec("triton") is not None  # looked up once: torch.compile cannot trace find_spec


def triton_available() -> bool:
    return _TRITON


def uses_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels run for x now. Never inside a graph torch.compile traces:
    its compiler fuses the reference's operations itself (into kernels of its own; the bits
    are the reference's either way), except the values of `values_in_one_kernel`, the codes of
    `codes_in_one_kernel` and the transposes of `transpose_in_one_kernel`, which it calls as
    operators."""
    if _backend == "reference" or torch.compiler.is_compiling():
        return False
    return _backend == "triton" or (x.is_cuda and triton_available())


def _matrix_and_seed(x: torch.Tensor, rounding: str, generator, axis: int):
    """The reference's checks, then (axis, the (R, C) view with `axis` last, the seed of the
    stochastic-rounding noise the reference would draw, or None)."""
    check_float_tensor(x)
    check_rounding(rounding)
    ax = normalize_axis(axis, x.dim())
    X = matrix_view(x.detach(), ax)
    return ax, X, draw_seed(x.device, generator) if rounding == "stochastic" else None


def quantize(x: torch.Tensor, scheme, *, scale_rule=None, rounding="nearest", generator=None,
             axis=-1, amax=None, tensor_amax=None, block_amaxes=None) -> QuantizedTensor:
    """`fewerbits.quantize` with Triton kernels where the backend says so (same arguments)."""
    kwargs = dict(scale_rule=scale_rule, rounding=rounding, generator=generator, axis=axis, amax=amax,
                  tensor_amax=tensor_amax, block_amaxes=block_amaxes)
    if not uses_triton(x):
        scheme_ = get_scheme(scheme, scale_rule)
        if amax is None and codes_in_one_kernel(x, scheme_, axis):  # a compiled graph: the kernel's operator
            ax, X, seed = _matrix_and_seed(x, rounding, generator, axis)
            if block_amaxes is not None:
                block_amaxes = check_block_amaxes(block_amaxes, block_grid(scheme_, x.shape, ax), x.device)
            columns = _as_stored(x, ax)
            codes, scales = torch.ops.fewerbits.rowblock_codes(x.detach() if columns else X, scheme_.name,
                                                               scheme_.scale_rule, seed, block_amaxes, columns)
            return QuantizedTensor(codes, scales, scheme_, x.shape, ax)
        if _read_twice(x, scheme_, amax, tensor_amax):
            x = _stored(x)
        return reference_quantize(x, scheme, **kwargs)
    from . import rowblock
    from .cast import cast_codes

    scheme_ = get_scheme(scheme, scale_rule)
    if amax is not None and not scheme_.elem.has_nan:  # a NaN element's code under a given amax
        return reference_quantize(x, scheme, **kwargs)  # is 0 there, which no kernel makes
    if tensor_amax is not None:
        tensor_amax = check_tensor_amax(tensor_amax, x.device)
    if block_amaxes is not None:
        block_amaxes = check_block_amaxes(block_amaxes, block_grid(scheme_, x.shape, axis), x.device)
    if rowblock.supported(scheme_) and amax is None:  # amax, scales and codes in one kernel (which
        # finds the blocks' amaxes in the read that makes their codes: given ones are not read)
        ax, X, seed = _matrix_and_seed(x, rounding, generator, axis)
        codes, scales, tensor_scale = rowblock.quantize_rowblocks(X, scheme_, seed, tensor_amax=tensor_amax)
        return QuantizedTensor(codes, scales, scheme_, x.shape, ax, tensor_scale)

    if rowblock.amax_supported(scheme_) and x.numel():  # one reduction, then one kernel
        ax, X, seed = _matrix_and_seed(x, rounding, generator, axis)
        codes, scales = rowblock.quantize_with_amax(X, scheme_, seed, amax, tensor_amax=tensor_amax,
                                                    block_amaxes=block_amaxes)
        if scheme_.elem.bits == 6:
            codes = pack(codes, scheme_.elem)
        return QuantizedTensor(codes, scales, scheme_, x.shape, ax)

    plan = make_plan(x, scheme, **kwargs)
    elem = plan.scheme.elem
    codes = cast_codes(plan.X, plan.factor, plan.br, plan.bc, elem, multiply=plan.scheme.two_level,
                       noise=plan.noise, pack=True)
    if elem.bits == 6:  # fp6 packs four codes into three bytes after the kernel
        codes = pack(codes, elem)
    return plan.finish(codes)


def _read_twice(x: torch.Tensor, scheme, amax, tensor_amax) -> bool:
    """Whether a graph torch.compile traces reads x in two kernels to quantize it with the
    reference's operations: one scale per tensor found from x itself (no amax given), a
    reduction over all of x before any code can be made; the codes' pass reads x again. Only
    for a contiguous x, which `_stored` keeps in its own layout (a view with other strides
    is left to inductor, as before)."""
    return (torch.compiler.is_compiling() and amax is None and tensor_amax is None
            and scheme.block == (-1, -1) and not scheme.two_level and x.is_contiguous())


def _stored(x: torch.Tensor) -> torch.Tensor:
    """x, to be stored where a compiled graph computes it (inductor's `force_stride_order`
    with x's own strides: no copy of a tensor that is stored already). Left to itself,
    inductor computes a fused producer's elements again in each kernel that reads them: a
    SwiGLU's output in the amax's kernel and again in the cast's, its gradients (the sigmoid,
    a correctly rounded division, the products rounded to bf16) likewise. Those kernels ran no
    faster in the H200's step than alone on an H100, whose counters found the forward's two
    issuing instructions in 72–82% of their cycles: with the H200's 1.4× the memory rate, their
    instructions set their time there (docs/kernels-notes.md, v78). Stored, each is read back by
    a cast of a few instructions an element."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers the operator under any backend)

    x = x.detach()  # (codes carry no gradient; the operator has no derivative)
    return torch.ops.prims.inductor_force_stride_order(x, x.stride())


def values_in_one_kernel(x: torch.Tensor, scheme) -> bool:
    """Whether `quantized_values` makes x's values in the one Triton kernel: 1 × bc and square
    blocks, on the Triton backend — inside graphs torch.compile traces too, as an operator the
    compiler calls without looking in (`fewerbits::rowblock_values`), for a registry scheme.
    The compiler's own fusion of the reference quantizer and a dequantization gives the same
    values but ran slower than eager mode (docs/kernels-notes.md, v17)."""
    if not triton_available() or _backend == "reference":
        return False
    from . import rowblock

    scheme = get_scheme(scheme)
    if not rowblock.supported(scheme):
        return False
    if not torch.compiler.is_compiling():
        return uses_triton(x)
    return _graph_calls_operators(x) and _registry_scheme(scheme)


def _registry_scheme(scheme) -> bool:
    """Whether the scheme is a registry scheme under some scale rule (an operator's arguments
    name it by its name and rule)."""
    named = SCHEMES.get(scheme.name)
    # field by field: `named.with_rule(...) == scheme` builds a Scheme, which breaks the graph
    # torch.compile traces (torch 2.11: a dataclass made by dataclasses.replace)
    return (named is not None and named.elem == scheme.elem and named.block == scheme.block
            and named.scale_fmt == scheme.scale_fmt)


def _as_stored(x: torch.Tensor, axis: int) -> bool:
    """Whether an operator of a compiled graph takes the 2-D tensor x as it is, to quantize it
    along its columns (axis 0; the operators' `columns`), instead of its transposed view. One
    tensor then enters a graph's operators in one layout for both of its copies (rows for one
    GEMM, columns for another). Given the transposed view for the column-wise copy, inductor
    stored a tensor that one of the graph's kernels makes a second time, for that call alone
    (a SwiGLU's gradient: docs/kernels-notes.md, v29). The operators' `flexible_layout` (v30)
    does not cover this case: given the transposed view, the CPU's graph still makes the
    second buffer (tests/test_convert.py's SwiGLU storage test fails)."""
    return x.dim() == 2 and axis == 0


def _graph_calls_operators(x: torch.Tensor) -> bool:
    """Whether a graph torch.compile is tracing now calls the kernels' operators for x: Triton
    importable, and x on a GPU under the auto backend or anywhere under the triton backend."""
    return (triton_available() and _backend != "reference" and torch.compiler.is_compiling()
            and (_backend == "triton" or x.is_cuda))


def codes_in_one_kernel(x: torch.Tensor, scheme, axis: int = -1) -> bool:
    """Whether a graph torch.compile traces quantizes x by the one-read kernel (kernels/rowblock.py),
    called as the operator `fewerbits::rowblock_codes`, instead of compiling the reference's
    operations: FP8 codes of 1 × bc or square blocks with fp32 scales (fp8_blockwise's 1x128
    and 128x128), a registry scheme, on a CUDA tensor under the auto backend or any tensor
    under the triton backend. The kernels inductor made of those block amaxes, scales and codes
    (fused with the operations producing their tensors) took 37 ms of fp8_blockwise's 163-ms
    step on the H200, one of them 1.5 ms a call for a layer's SwiGLU gradients
    (docs/kernels-notes.md, v24); the kernel's codes took as long at first (168.8 against
    169.2 ms a step), and 162.8 ms once they were rounded by one addition (v25). Outside
    compiled graphs `quantize` calls the same kernel directly. (The operator takes any scheme
    the kernel does, 4-bit codes packed; MX codes, which compiled graphs make only for a saved
    quantized input, stay with inductor until timed.)

    Per-row FP8 codes quantized along another axis than x's last (fp8_rowwise's column-wise
    copies for the weight-gradient GEMM: one scale per column of x) come from the operator too
    (`rowblock.quantize_with_amax`: the columns' amaxes, then a kernel that reads x as memory
    holds it): inductor fused that reduction across rows with the cast and the operations
    producing x (one kernel took 11.4 ms of fp8_rowwise's step in 8 calls,
    docs/kernels-notes.md v26). So do long rows along x's last axis
    (`rowblock.rows_in_one_read`: one program a row, in one read), whose amaxes inductor found
    in looped reduction kernels fused with the operations producing x (10.4 ms of the step in
    16 calls, v27). Shorter rows along x's last axis stay with inductor, which reduces each row
    in the kernel that produces it."""
    if not _graph_calls_operators(x):
        return False
    from . import rowblock

    scheme = get_scheme(scheme)
    if not (scheme.elem.bits == 8 and scheme.scale_fmt.bits == 32 and not scheme.two_level
            and _registry_scheme(scheme)):
        return False
    if scheme.block == (1, -1):
        if x.dim() < 2:
            return False
        ax = normalize_axis(axis, x.dim())
        return ax != x.dim() - 1 or rowblock.LONG_ROW <= x.shape[ax] <= rowblock.ONE_READ_MAX
    return rowblock.supported(scheme)


# The operators are defined with torch.library.Library rather than torch.library.custom_op:
# a compiled step calls the values operator hundreds of times, and custom_op's Python wrapper
# (autograd and aliasing checks) cost several times the dispatch of a plain registration.
# The three operators that read a tensor the graph makes take it in any layout (they read any
# strides): inductor then realizes a tensor that two of them read once, where the default
# constraint (the eager strides, exactly) made it copy the tensor for each call that got it
# unrealized or as a view — the H200's compiled SwiGLU wrote its output h twice, once for the
# down projection's row-wise codes and once for its column-wise codes (docs/kernels-notes.md
# v29, v30).
_ANY_LAYOUT = (torch.Tag.flexible_layout,)
_LIB = torch.library.Library("fewerbits", "DEF")
_LIB.define("rowblock_values(Tensor X, str scheme, str scale_rule, Tensor? seed, int[] hadamard_signs, "
            "Tensor? tensor_amax=None, bool columns=False) -> (Tensor, Tensor)", tags=_ANY_LAYOUT)
_LIB.define("two_amaxes(Tensor X, int[] hadamard_signs) -> Tensor", tags=_ANY_LAYOUT)
_LIB.define("rowblock_codes(Tensor X, str scheme, str scale_rule, Tensor? seed, Tensor? block_amaxes=None, "
            "bool columns=False) -> (Tensor, Tensor)", tags=_ANY_LAYOUT)
_LIB.define("transpose_codes(Tensor x) -> Tensor")


@functools.cache
def _hadamard_with(signs: tuple[int, ...]):
    from ..hadamard import Hadamard

    return Hadamard(len(signs), signs=signs)


def _hadamard_of(signs):
    return _hadamard_with(tuple(signs)) if len(signs) else None


def _rowblock_values(X: torch.Tensor, scheme: str, scale_rule: str, seed: torch.Tensor | None,
                     hadamard_signs, tensor_amax: torch.Tensor | None = None,
                     columns: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-kernel values of the (R, C) matrix X (columns: of X.t(), X given as stored,
    `_as_stored`) as an operator for compiled graphs: (the bf16 values, the per-tensor decode
    scale (NVFP4), else an empty tensor); with hadamard_signs, the values of the Hadamard
    transform with those signs, applied by the kernel; with tensor_amax, NVFP4's tensor amax
    given (`two_amaxes`)."""
    from . import rowblock

    X = X.t() if columns else X
    values, _, s_dec = rowblock.quantize_rowblocks(X, get_scheme(scheme, scale_rule), seed, values=True,
                                                   hadamard=_hadamard_of(hadamard_signs), tensor_amax=tensor_amax)
    return values, s_dec if s_dec is not None else X.new_empty((0,), dtype=torch.float32)


def _two_amaxes(X: torch.Tensor, hadamard_signs) -> torch.Tensor:
    from . import rowblock

    return rowblock.two_amaxes(X, _hadamard_with(tuple(hadamard_signs)))


def _operand_shape(X, columns: bool) -> tuple[int, int]:
    """(R, C) of the matrix an operator quantizes: X's, or X.t()'s where it takes X as stored."""
    R, C = X.shape
    return (C, R) if columns else (R, C)


def _rowblock_values_fake(X, scheme, scale_rule, seed, hadamard_signs, tensor_amax=None, columns=False):
    shape = () if get_scheme(scheme).two_level else (0,)
    R, C = _operand_shape(X, columns)
    return X.new_empty((R, C), dtype=torch.bfloat16), X.new_empty(shape, dtype=torch.float32)


def _rowblock_codes(X: torch.Tensor, scheme: str, scale_rule: str, seed: torch.Tensor | None,
                    block_amaxes: torch.Tensor | None = None, columns: bool = False):
    """`quantize`'s codes and stored block scales of the (R, C) matrix X (columns: of X.t(), X
    given as stored, `_as_stored`) by the one-read kernel (one block per row:
    `rowblock.quantize_with_amax`, which takes the rows' amaxes where block_amaxes gives them),
    as an operator for compiled graphs (`codes_in_one_kernel`)."""
    from . import rowblock

    X = X.t() if columns else X
    s = get_scheme(scheme, scale_rule)
    if s.block == (1, -1):  # one scale per row
        return rowblock.quantize_with_amax(X, s, seed, block_amaxes=block_amaxes)
    codes, scales, _ = rowblock.quantize_rowblocks(X, s, seed)
    return codes, scales


def _rowblock_codes_fake(X, scheme, scale_rule, seed, block_amaxes=None, columns=False):
    s = get_scheme(scheme, scale_rule)
    (br, bc), (R, C) = s.block, _operand_shape(X, columns)
    bc = C if bc == -1 else bc  # one block per row
    codes = X.new_empty((R, packed_size(C, s.elem.bits)), dtype=torch.uint8)
    scale_dtype = torch.uint8 if s.scale_fmt.bits <= 8 else torch.float32
    return codes, X.new_empty((-(-R // br), -(-C // bc)), dtype=scale_dtype)


def quantized_values(x: torch.Tensor, scheme, *, rounding="nearest", generator=None, axis=-1, hadamard=None,
                     tensor_amax: torch.Tensor | None = None, block_amaxes: torch.Tensor | None = None):
    """(bf16 matrix, per-tensor decode scale or None): the values an emulated GEMM multiplies —
    `quantize(x, ...).dequantize_matrix(bf16, tensor_scale=False)` and its `tensor_scale` — for
    a scheme whose values are exact in bf16; with `hadamard`, those of
    `hadamard.transform(x, dim=axis)`. 1 × bc and square blocks on the Triton backend make them
    in one kernel that never stores the codes (`values_in_one_kernel`), which applies the
    transform itself where its size is the block's (`rowblock.hadamard_fusable`); otherwise
    transform, quantize, then dequantize. tensor_amax: for NVFP4, the amax of what is quantized
    (x, or its transform), from `two_amaxes`; the one kernel then reads x once instead of twice
    (elsewhere it is not needed: the reference finds the same amax itself). block_amaxes: x's
    blocks' own amaxes (`quantize`'s), taken where x is quantized to codes first (the one kernel
    finds them as it reads the blocks)."""
    scheme_ = get_scheme(scheme)
    if values_in_one_kernel(x, scheme_):
        from . import rowblock

        ax = normalize_axis(axis, x.dim())
        if hadamard is not None and not rowblock.hadamard_fusable(scheme_, hadamard, x.shape[ax]):
            x, hadamard = hadamard.transform(x, dim=ax), None
        _, X, seed = _matrix_and_seed(x, rounding, generator, ax)
        if uses_triton(x):
            values, _, tensor_scale = rowblock.quantize_rowblocks(X, scheme_, seed, values=True, hadamard=hadamard,
                                                                  tensor_amax=tensor_amax)
            return values, tensor_scale
        signs = list(hadamard.sign_vector()) if hadamard is not None else []
        columns = _as_stored(x, ax)
        values, tensor_scale = torch.ops.fewerbits.rowblock_values(x.detach() if columns else X, scheme_.name,
                                                                   scheme_.scale_rule, seed, signs, tensor_amax,
                                                                   columns)
        return values, tensor_scale if scheme_.two_level else None
    if hadamard is not None:
        x = hadamard.transform(x, dim=axis)
    q = quantize(x, scheme_, rounding=rounding, generator=generator, axis=axis,
                 block_amaxes=block_amaxes if hadamard is None else None)
    return dequantize_matrix(q, torch.bfloat16, tensor_scale=False), q.tensor_scale


def two_amaxes_in_one_read(x: torch.Tensor, scheme, hadamard) -> bool:
    """Whether `two_amaxes` serves x (2-D, (R, C)) for `scheme`: a two-level scheme (NVFP4) whose
    values come from the one kernel (`values_in_one_kernel`), quantized along C as it is and
    along R under `hadamard`, which the kernel applies itself (its size the block's, R a
    multiple of it)."""
    if hadamard is None or x.dim() != 2 or not values_in_one_kernel(x, scheme):
        return False
    from . import rowblock

    scheme = get_scheme(scheme)
    return scheme.two_level and rowblock.hadamard_fusable(scheme, hadamard, x.shape[0])


def two_amaxes(x: torch.Tensor, hadamard) -> torch.Tensor:
    """fp32 [max |x|, max |hadamard.transform(x.t())|] of a 2-D tensor in one read (NaN
    propagating; `two_amaxes_in_one_read` says where): NVFP4's tensor amaxes of a tensor that
    one GEMM quantizes along its rows and another, under a Hadamard transform, along its
    columns (an input for the forward and weight-gradient GEMMs, a gradient for the input- and
    weight-gradient GEMMs) — passed to `quantized_values` as `tensor_amax`. In a compiled graph
    the kernel runs as the operator `fewerbits::two_amaxes`."""
    from . import rowblock

    x = x.detach()
    if uses_triton(x):
        return rowblock.two_amaxes(x, hadamard)
    return torch.ops.fewerbits.two_amaxes(x, list(hadamard.sign_vector()))


def transpose_in_one_kernel(x: torch.Tensor) -> bool:
    """Whether a compiled graph transposes the one-byte codes x by the tiled kernel
    (kernels/transpose.py), called as the operator `fewerbits::transpose_codes`: on a CUDA
    tensor under the auto backend, or any tensor under the triton backend. Inductor otherwise
    fuses the transposed store into whatever kernel makes the codes; where that kernel is a
    row reduction (an RMSNorm backward that recomputes the forward's input codes), each byte
    is stored to another 32-byte sector (docs/kernels-notes.md, v18)."""
    return _graph_calls_operators(x) and x.dim() == 2 and x.element_size() == 1


def _transpose_codes(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() for a 2-D tensor of one-byte codes, by the tiled kernel."""
    from .transpose import transpose

    return transpose(x)


for _key in ("CPU", "CUDA"):
    _LIB.impl("rowblock_values", _rowblock_values, _key)
    _LIB.impl("transpose_codes", _transpose_codes, _key)
    _LIB.impl("two_amaxes", _two_amaxes, _key)
    _LIB.impl("rowblock_codes", _rowblock_codes, _key)
torch.library.register_fake("fewerbits::rowblock_values", _rowblock_values_fake, lib=_LIB)
torch.library.register_fake("fewerbits::two_amaxes", lambda X, signs: X.new_empty((2,), dtype=torch.float32),
                            lib=_LIB)
torch.library.register_fake("fewerbits::rowblock_codes", _rowblock_codes_fake, lib=_LIB)
torch.library.register_fake("fewerbits::transpose_codes", lambda x: x.new_empty((x.shape[1], x.shape[0])), lib=_LIB)


def transpose_codes(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() of a 2-D tensor of one-byte codes: the tiled kernel eagerly where
    `uses_triton`, the operator in a compiled graph where `transpose_in_one_kernel`, else torch's
    copy (same bytes every way)."""
    if transpose_in_one_kernel(x):
        return torch.ops.fewerbits.transpose_codes(x)
    if uses_triton(x):
        from .transpose import transpose

        return transpose(x)
    return x.t().contiguous()


def dequantize_matrix(q: QuantizedTensor, dtype: torch.dtype = torch.float32, *,
                      tensor_scale: bool = True) -> torch.Tensor:
    """`q.dequantize_matrix(dtype, tensor_scale=...)`, in one Triton kernel where the backend
    says so and the codes are 8- or 4-bit (same bits)."""
    if uses_triton(q.data):
        from . import dequant

        if dequant.supported(q, dtype):
            return dequant.dequantize_matrix(q, dtype, tensor_scale=tensor_scale)
    return q.dequantize_matrix(dtype, tensor_scale=tensor_scale)


__all__ = ["BACKENDS", "set_backend", "backend", "triton_available", "uses_triton", "quantize",
           "quantized_values", "values_in_one_kernel", "codes_in_one_kernel", "dequantize_matrix",
           "transpose_codes", "transpose_in_one_kernel", "two_amaxes", "two_amaxes_in_one_read"]
