"""Fast paths for the reference quantizer, and the one switch that chooses them.

    set_backend("auto")        Triton for CUDA tensors when Triton imports, the reference otherwise
    set_backend("triton")      Triton always (CPU tensors too, under TRITON_INTERPRET=1: for tests)
    set_backend("reference")   the plain-torch reference everywhere

`quantize()` here takes the reference's arguments and returns the reference's bits: the scales,
amaxes and noise come from the reference's own `make_plan`; only the element pass (scale,
round, encode, pack: one read and one write of the tensor) runs as a kernel (kernels/cast.py).
CPU runs use the reference unless asked otherwise.
"""

from __future__ import annotations

import importlib.util

import torch

from ..codes import pack
from ..quantize import QuantizedTensor, make_plan
from ..quantize import quantize as reference_quantize

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


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def uses_triton(x: torch.Tensor) -> bool:
    if _backend == "reference":
        return False
    if _backend == "triton":
        return True
    return x.is_cuda and triton_available()


def quantize(x: torch.Tensor, scheme, **kwargs) -> QuantizedTensor:
    """`fewerbits.quantize` with the element pass in Triton where the backend says so."""
    if not uses_triton(x):
        return reference_quantize(x, scheme, **kwargs)
    from .cast import cast_codes

    plan = make_plan(x, scheme, **kwargs)
    elem = plan.scheme.elem
    codes = cast_codes(plan.X, plan.factor, plan.br, plan.bc, elem, multiply=plan.scheme.two_level,
                       noise=plan.noise, pack=True)
    if elem.bits == 6:  # fp6 packs four codes into three bytes after the kernel
        codes = pack(codes, elem)
    return plan.finish(codes)


__all__ = ["BACKENDS", "set_backend", "backend", "triton_available", "uses_triton", "quantize"]
