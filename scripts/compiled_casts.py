"""What a compiled cast costs on a GPU: `quantize` compiled by `compile_model`, in variants.

    PYTHONPATH=src python3 scripts/compiled_casts.py [--rows 8192] [--cols 14336]
        [--schemes fp8_e4m3_tensor fp8_e4m3_row fp8_e4m3_1x128 ...]

Part 1, per-tensor FP8 and its transposed codes (what a Linear's backward makes of grad_output):
the cast alone, the cast writing the transposed copy in the same kernel, the same with the
element pass dividing instead of multiplying by the fp64 reciprocal, the transposed copy made
by our tiled Triton transpose as an opaque custom op instead, and torchao's form of the cast
(x × 448/amax; not our codes) for comparison. Part 2, per scheme and axis: the element pass
dividing against multiplying by the fp64 reciprocal of each block's scale (which the library
does for one scale per tensor or per row: `quantize.Plan.block_reciprocals`), and whether both
give the same codes. Medians of 30 runs, CUDA events, one process.
"""

import argparse
import sys
from unittest import mock

import torch

import fewerbits as fb
from fewerbits.benchmark import time_ms
from fewerbits.scaling import exact_reciprocal

quantize_module = sys.modules["fewerbits.quantize"]
plan_cls = quantize_module.Plan


@torch.library.custom_op("fewerbits_bench::transpose", mutates_args=())
def opaque_transpose(x: torch.Tensor) -> torch.Tensor:
    from fewerbits.kernels.transpose import transpose

    return transpose(x)


@opaque_transpose.register_fake
def _(x):
    return x.new_empty(x.shape[1], x.shape[0])


def dividing():
    """The element pass divides (the per-block reciprocal is never offered)."""
    return mock.patch.object(plan_cls, "block_reciprocals", lambda self, r0, r1: None)


def multiplying():
    """The element pass multiplies by the fp64 reciprocal whatever the block (the library does
    so for one scale per tensor or per row only)."""
    def every_block(self, r0, r1):
        if self.scheme.two_level or self.noise is not None:
            return None
        recip = exact_reciprocal(self.factor)
        return quantize_module._per_element(recip, self.br, self.bc, r0, r1, self.cols)

    return mock.patch.object(plan_cls, "block_reciprocals", every_block)


def cast(x):
    q = fb.quantize(x, "fp8_e4m3_tensor")
    return q.data, q.scale


def cast_and_transposed(x):
    q = fb.quantize(x, "fp8_e4m3_tensor")
    return q.data, q.data.t().contiguous(), q.scale


def cast_then_opaque_transpose(x):
    q = fb.quantize(x, "fp8_e4m3_tensor")
    return q.data, opaque_transpose(q.data), q.scale


def torchao_form(x):
    amax = x.abs().amax().float()
    codes = (x.float() * (448.0 / amax.clamp(min=1e-12))).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, codes.t().contiguous()


def timed(fn, x, device):
    torch._dynamo.reset()
    compiled = fb.compile_model(fn)
    out = compiled(x)
    return time_ms(lambda: compiled(x), 30, 3, device), out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=14336)
    p.add_argument("--schemes", nargs="+", default=["fp8_e4m3_tensor", "fp8_e4m3_row", "fp8_e4m3_1x128",
                                                    "fp8_e4m3_128x128", "mxfp8_e4m3", "mxfp4"])
    args = p.parse_args(argv)
    device = torch.device("cuda")
    x = torch.randn(args.rows, args.cols, device=device, dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.rows} x {args.cols} bf16, ms")
    base = timed(cast_and_transposed, x, device)[1]
    for name, fn, patch in [("cast", cast, None), ("cast + transposed, one kernel", cast_and_transposed, None),
                            ("the same, dividing", cast_and_transposed, dividing),
                            ("cast, then opaque Triton transpose", cast_then_opaque_transpose, None),
                            ("torchao's form + transposed (not our codes)", torchao_form, None)]:
        if patch:
            with patch():
                ms, out = timed(fn, x, device)
        else:
            ms, out = timed(fn, x, device)
        same = "" if fn in (cast, torchao_form) else all(torch.equal(a, b) for a, b in zip(out[:2], base[:2]))
        print(f"  {name:45s} {ms:7.3f}  {'same codes' if same else ''}")
    for scheme in args.schemes:
        for axis in (1, 0):
            fn = lambda t: (lambda q: (q.data, q.scale))(fb.quantize(t, scheme, axis=axis))  # noqa: E731
            with dividing():
                div_ms, div_out = timed(fn, x, device)
            with multiplying():
                mul_ms, mul_out = timed(fn, x, device)
            same = torch.equal(div_out[0], mul_out[0])
            print(f"  {scheme:18s} axis {axis}: dividing {div_ms:.3f}, by the reciprocal {mul_ms:.3f}"
                  f"{'' if same else '  CODES DIFFER'}")
    return 0


if __name__ == "__main__":
    main()
