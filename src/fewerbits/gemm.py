"""Scaled matmul of two quantized operands: native FP8 on Hopper, exact emulation elsewhere.

`scaled_matmul(a, b)` computes  C = A · Bᵀ  where A is a's (M, K) matrix and B is b's (N, K)
matrix, both quantized along K (their `matrix_shape` ends in K). This one form serves all three
GEMMs of a Linear, because `quantize(..., axis=0)` stores the column-wise copies as the
transposed matrix:

    output      = input  @ weightᵀ      a = input (M, K),         b = weight (N, K)
    grad_input  = grad   @ weight       a = grad (M, N),          b = weight, axis=0 → (K, N)
    grad_weight = gradᵀ  @ input        a = grad, axis=0 → (N, M), b = input, axis=0 → (K, M)

Native paths (CUDA capability 9.x, cuBLAS through torch), FP8 elements with fp32 scales:

    tensor × tensor     torch._scaled_mm, one scale each          (E4M3 or E5M2, not E5M2×E5M2)
    row × row           torch._scaled_mm, scale_a (M, 1), scale_b (1, N)     (E4M3 only)
    1x128 × 128x128     aten._scaled_mm_v2, BlockWise1x128 × BlockWise128x128     (E4M3 only)
    1x128 × 1x128       aten._scaled_mm_v2, BlockWise1x128 × BlockWise1x128       (E4M3 only)

    layouts: mat_a = A (M, K) row-major; mat_b = Bᵀ, i.e. B (N, K) row-major seen as (K, N)
    column-major, no copy. 1x128 scales are (rows, K/128) with stride (1, rows); 128x128 scales
    are padded to a multiple of 4 blocks along K and passed as (K/128, N/128), stride (1, K/128).

Everything else (MXFP8/6/4, NVFP4, and any scheme on CPU) is emulated: dequantize, then one
matmul with fp32 accumulation. On a GPU the dequantized operands are bf16 where that is exact —
FP8/FP6/FP4 values times power-of-two scales, and NVFP4's E2M1 × E4M3 products, whose fp32
per-tensor scales are applied to the fp32 result as the hardware does — otherwise fp32 (with
TF32 off). On a CPU every emulated GEMM is an fp32 matmul of exact fp32 operands.

`native="auto"` takes the native path when the device and the shapes allow it and emulates
otherwise; `native=True` insists (an error names the device and says why), `native=False`
always emulates.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .quantize import QuantizedTensor

# Looked up once: native_reason runs inside compiled graphs, where an operator lookup would break them.
_BLOCKWISE_MM = hasattr(F, "ScalingType") and hasattr(torch.ops.aten, "_scaled_mm_v2")

FP8 = ("fp8_e4m3", "fp8_e5m2")


def _kind(q: QuantizedTensor) -> str | None:
    """The cuBLAS scaling kind of one operand, or None if no native kernel takes it."""
    return scheme_kind(q.scheme)


def scheme_kind(s) -> str | None:
    """The cuBLAS scaling kind of a scheme's operands, or None if no native kernel takes them."""
    if s.elem.name not in FP8 or s.scale_fmt.name != "fp32":
        return None
    return {(-1, -1): "tensor", (1, -1): "row", (1, 128): "1x128", (128, 128): "128x128"}.get(
        s.block
    )


def native_reason(a: QuantizedTensor, b: QuantizedTensor) -> str | None:
    """Why a · bᵀ cannot run natively here (None if it can)."""
    why = _why_not_native(a, b)
    return None if why is None else why[0].format(**why[1])


def _why_not_native(a: QuantizedTensor, b: QuantizedTensor) -> tuple[str, dict] | None:
    """`native_reason` as a message template and its values, formatted only where the message is
    shown: in a compiled graph a token count is a symbolic size, and formatting it into a
    string would make dynamo specialise the graph to that one count (torch 2.11: the recompiled
    quantized Linear then failed to trace its autograd function)."""
    why = _device_reason(a.device)
    if why is not None:
        return why
    ka, kb = _kind(a), _kind(b)
    pair = (ka, kb)
    elems = (a.scheme.elem.name, b.scheme.elem.name)
    if None in pair:
        return "no native kernel for {a} × {b}", {"a": a.scheme.name, "b": b.scheme.name}
    (m, k), (n, k2) = a.matrix_shape, b.matrix_shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {a.matrix_shape} · {b.matrix_shape}ᵀ")
    if pair == ("tensor", "tensor"):
        if elems == ("fp8_e5m2", "fp8_e5m2"):
            return "cuBLAS has no E5M2 × E5M2 kernel", {}
        if k % 16 or n % 16:
            return "K={k} and N={n} must be multiples of 16 for torch._scaled_mm", {"k": k, "n": n}
        return None
    if "fp8_e5m2" in elems:
        return "{ka} × {kb} scaling takes E4M3 operands only", {"ka": ka, "kb": kb}
    if pair == ("row", "row"):
        if k % 16 or n % 16:
            return "K={k} and N={n} must be multiples of 16 for torch._scaled_mm", {"k": k, "n": n}
        return None
    if pair in (("1x128", "128x128"), ("1x128", "1x128")):
        if not _BLOCKWISE_MM:
            return "torch {v} has no blockwise scaled matmul (aten._scaled_mm_v2)", {"v": torch.__version__}
        if k % 128 or n % 128 or m % 128:
            return "M={m}, N={n} and K={k} must be multiples of 128 for blockwise FP8", {"m": m, "n": n, "k": k}
        return None
    return "no native kernel for {ka} × {kb} scaling", {"ka": ka, "kb": kb}


def _device_reason(dev: torch.device) -> tuple[str, dict] | None:
    """Why `dev` takes no native FP8 GEMM (`_why_not_native`'s form), or None on a Hopper GPU."""
    if dev.type != "cuda":
        return "device {dev} has no FP8 matrix units (native FP8 needs a CUDA GPU of capability 9.x)", {"dev": dev}
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] != 9:  # (the name only here: torch.compile cannot trace a call that returns a str)
        name = torch.cuda.get_device_name(dev)
        return ("{name} (sm_{major}{minor}) is not a Hopper GPU; fewerbits' native FP8 paths are measured on sm_90",
                {"name": name, "major": cap[0], "minor": cap[1]})
    return None


def scaled_matmul(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    native: bool | str = "auto",
    fast_accum: bool = False,
) -> torch.Tensor:
    """C = A · Bᵀ for two quantized operands, fp32 accumulation, output in `out_dtype`.

    fast_accum: a native GEMM keeps its sums in the tensor cores' accumulator, without
    promoting them to fp32 (`recipes.Gemm.fast_accum`); emulation accumulates in fp32 either way."""
    if a.matrix_shape[1] != b.matrix_shape[1]:
        raise ValueError(f"inner dimensions differ: {a.matrix_shape} · {b.matrix_shape}ᵀ")
    if native not in ("auto", True, False):
        raise ValueError(f"native must be 'auto', True or False, not {native!r}")
    if native is not False:
        if _why_not_native(a, b) is None:
            return _native(a, b, out_dtype, fast_accum)
        if native is True:
            raise RuntimeError(f"native scaled matmul unavailable: {native_reason(a, b)}; use native=False to emulate")
    return emulated_matmul(a, b, out_dtype)


# -- native -------------------------------------------------------------------------------------


def _fp8(q: QuantizedTensor) -> torch.Tensor:
    return q.data.view(q.scheme.elem.torch_dtype)


def _native(a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    mat_a, mat_b = _fp8(a), _fp8(b).t()  # (M, K) row-major; (K, N) column-major, no copy
    kind = (_kind(a), _kind(b))
    if kind[0] in ("tensor", "row"):
        sa, sb = a.scale, b.scale
        if kind[0] == "tensor":
            sa, sb = sa.reshape(()), sb.reshape(())
        else:
            sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)  # (M, 1), (1, N)
        return torch._scaled_mm(mat_a, mat_b, sa, sb, out_dtype=out_dtype, use_fast_accum=fast_accum)
    st = F.ScalingType
    sa = a.scale.t().contiguous().t()  # (M, K/128), stride (1, M)
    if kind[1] == "1x128":
        sb, recipe_b = b.scale.t().contiguous().t(), st.BlockWise1x128
    else:
        pad = -b.scale.shape[1] % 4  # cuBLAS wants the K/128 blocks padded to a multiple of 4
        sb, recipe_b = F.pad(b.scale, (0, pad)).t(), st.BlockWise128x128  # (K/128, N/128)
    # The operator F.scaled_mm calls, named as an aten operator: torch 2.11's dynamo does not trace
    # torch._scaled_mm_v2 (a graph break per GEMM), but traces every aten operator.
    return torch.ops.aten._scaled_mm_v2.default(
        mat_a, mat_b, [sa], [st.BlockWise1x128.value], [], [sb], [recipe_b.value], [], None, out_dtype,
        [], fast_accum,
    )


# -- emulated -----------------------------------------------------------------------------------


def _bf16_exact(q: QuantizedTensor) -> bool:
    """Are q's dequantized values (without a per-tensor scale) exact in bf16?"""
    return bf16_exact(q.scheme)


def bf16_exact(s) -> bool:
    """Are a scheme's dequantized values (without a per-tensor scale) exact in bf16?"""
    return s.elem.man_bits <= 3 and (s.pow2 or s.two_level)


def emulated_in_bf16(sa, sb) -> bool:
    """Does a GEMM of these two schemes' operands always run emulated, on bf16 operands on a
    GPU (no native kernel takes the pair, and both dequantize exactly to bf16)?"""
    return (scheme_kind(sa) is None or scheme_kind(sb) is None) and bf16_exact(sa) and bf16_exact(sb)


@contextlib.contextmanager
def full_fp32():
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def emulated_matmul(a: QuantizedTensor, b: QuantizedTensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """A · Bᵀ from the dequantized operands with fp32 accumulation (see the module docstring)."""
    on_gpu = a.device.type == "cuda"
    from . import kernels  # the one-kernel dequantization where the backend allows it

    if on_gpu and _bf16_exact(a) and _bf16_exact(b):
        A = kernels.dequantize_matrix(a, torch.bfloat16, tensor_scale=False)
        B = kernels.dequantize_matrix(b, torch.bfloat16, tensor_scale=False)
        return values_matmul(A, B, (a.tensor_scale, b.tensor_scale), out_dtype)
    A = kernels.dequantize_matrix(a, tensor_scale=False)
    B = kernels.dequantize_matrix(b, tensor_scale=False)
    with full_fp32():
        out = A @ B.t()
    return _tensor_scaled(out, (a.tensor_scale, b.tensor_scale), out_dtype)


def values_matmul(A: torch.Tensor, B: torch.Tensor, tensor_scales, out_dtype=torch.bfloat16) -> torch.Tensor:
    """A · Bᵀ of two bf16 matrices of dequantized values, fp32 accumulation, then the per-tensor
    scales (None where there is none) on the fp32 result: the emulated GEMM's bf16 path."""
    return _tensor_scaled(mm_fp32_out(A, B.t()), tensor_scales, out_dtype)


def _tensor_scaled(out: torch.Tensor, tensor_scales, out_dtype) -> torch.Tensor:
    for ts in tensor_scales:  # per-tensor scales (NVFP4) multiply the fp32 accumulator
        if ts is not None:
            out = out * ts
    return out.to(out_dtype)


def mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 × bf16/fp16 with fp32 accumulation and an fp32 result."""
    if a.is_cuda and _HAS_MM_OUT_DTYPE:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()  # the products of bf16 values are exact in fp32


_HAS_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")
