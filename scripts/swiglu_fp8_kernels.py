"""The kernels of a SwiGLU MLP between per-tensor FP8 Linears, compiled as the trainer compiles a
block, under variants of the compile options and of how the per-tensor casts read their input;
or `bench train`'s step under such variants.

    PYTHONPATH=src python3 scripts/swiglu_fp8_kernels.py [--variants base flat ...] [--tokens 8192]
    PYTHONPATH=src python3 scripts/swiglu_fp8_kernels.py --step --variants base flat -- <bench train args>

The MLP is llama3-8b-8layers' (d 4096, ffn 14336; fp32 master weights, bf16 activations) under
fp8_tensorwise, forward and backward on `--tokens` rows. For each variant it prints the step's
median time (CUDA events), each kernel's GPU time a step (torch.profiler) and whether the
output and every gradient equal the first variant's bit for bit; with --ncu it runs one step
after the warm-up in an NVTX range named "measured" instead, for Nsight Compute. Variants:

  base             the library as it is: compile_model's options, the amax as its rows' maxima,
                   a per-tensor cast's input stored before its amax and its codes read it
  unstored         that input not stored: inductor computes it again in each of the two kernels
  unheld           without the library's holds (`quantize.held` as the identity): a per-tensor
                   or per-row cast's fp64 reciprocal of its scale computed again, with the
                   scale, a division, for every element of the codes' kernel, and its FP8 codes
                   not held (under torch 2.13 stored once per reader; v79 to v81)
  flat             the amax as one reduction over the whole tensor, `vector_norm(x, inf)`
  realize_opcount_10  inductor's realize_opcount_threshold at 10 (stores more of what is reused)
  no_div_rounding  without correctly rounded division (not eager mode's bits: a diagnostic)
  no_emulate       without emulate_precision_casts (not eager mode's bits: a diagnostic)
  cdt              inductor's coordinate_descent_tuning on
  zeroed           a given amax's (delayed scaling's) codes zeroed where the tensor's own amax is
                   not finite, as before v84: the codes wait on that amax (fp8_delayed only)
  clamped          FP8 codes clamped to ±max by `clamp` (NaN-propagating maxima and minima in
                   inductor's kernels), as before v85, not by two selects
  int_amax         the amax as the integer maximum of the magnitudes' fp32 bit patterns (NaN's
                   above +inf's): the same value but a NaN's payload, in fewer instructions an
                   element in the fused casts (v85's count) but hardly faster (v86)

With --step, `fewerbits bench train` runs once per variant in one process (the variants that
leave compile_model's options alone), each compiling its arms afresh.
"""

import argparse
import contextlib
import dataclasses
import importlib
import statistics
import sys

import torch
import torch._inductor.config as inductor_config

from fewerbits.convert import _division_rounding, compile_model

# the modules (the package's names `quantize` and `linear` are its functions)
quantize_mod = importlib.import_module("fewerbits.quantize")
linear_mod = importlib.import_module("fewerbits.linear")
rounding_mod = importlib.import_module("fewerbits.rounding")
kernels_mod = importlib.import_module("fewerbits.kernels")


def flat_amax(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, ord=float("inf"))


def zeroed_plan(make_plan):
    """make_plan as before v84: under a given amax, a block whose own amax is not finite (its
    stored scale NaN) gets a NaN factor, so zero codes that depend on its own amax."""
    def plan(x, scheme, *, amax=None, **kwargs):
        out = make_plan(x, scheme, amax=amax, **kwargs)
        if amax is None:
            return out
        return dataclasses.replace(out, factor=torch.where(torch.isfinite(out.scales), out.factor, out.scales),
                                   nan_free=True)
    return plan


def requantize_by_scale(requantize):
    """requantize as before v84: the codes by q's stored scale alone, given amax or not."""
    return lambda x, q, axis, amax=None: requantize(x, q, axis)


def clamped_codes(native_fp8_codes):
    """native_fp8_codes as before v85: the saturation by clamp."""
    def codes(v, fmt, *, nan_free=False):
        code = v.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).view(torch.uint8)
        if nan_free:
            return code
        sign_bit = 1 << (fmt.exp_bits + fmt.man_bits)
        nan_code = torch.where(torch.signbit(v), fmt.nan_code | sign_bit, fmt.nan_code).to(torch.uint8)
        return torch.where(torch.isnan(v), nan_code, code)
    return codes


def int_amax(tensor_amax_of):
    """tensor_amax_of by the integer maximum of |x|'s fp32 bit patterns (the rows' maxima, then
    theirs), for fp32, bf16 and fp16 tensors holding an element."""
    def amax(x):
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or x.numel() == 0:
            return tensor_amax_of(x)
        bits = x.float().view(torch.int32) & 0x7FFFFFFF
        top = bits.amax(dim=-1).amax() if x.dim() >= 2 else bits.amax()
        return top.view(torch.float32).to(x.dtype)
    return amax


# name: (patches [(module, attribute, the replacement made from the original)], compile options,
# global inductor config)
VARIANTS = {
    "base": ([], {}, {}),
    "flat": ([(quantize_mod, "tensor_amax_of", lambda _: flat_amax),
              (linear_mod, "tensor_amax_of", lambda _: flat_amax)], {}, {}),
    "unstored": ([(kernels_mod, "_read_twice", lambda _: lambda *args: False)], {}, {}),
    "unheld": ([(quantize_mod, "held", lambda _: lambda t: t)], {}, {}),
    "realize_opcount_10": ([], {}, {"realize_opcount_threshold": 10}),
    "no_div_rounding": ([], {k: False for k in _division_rounding()}, {}),
    "no_emulate": ([], {"emulate_precision_casts": False}, {}),
    "cdt": ([], {}, {"coordinate_descent_tuning": True}),
    "zeroed": ([(quantize_mod, "make_plan", zeroed_plan), (linear_mod, "requantize", requantize_by_scale)], {}, {}),
    "clamped": ([(rounding_mod, "native_fp8_codes", clamped_codes)], {}, {}),
    "int_amax": ([(quantize_mod, "tensor_amax_of", int_amax), (linear_mod, "tensor_amax_of", int_amax)], {}, {}),
}


@contextlib.contextmanager
def patched(patches):
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, make in patches:
        setattr(module, name, make(getattr(module, name)))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def mlp_variant(name, args, reference):
    from torch.profiler import ProfilerActivity, profile

    from fewerbits.models.llama import SwiGLU
    from fewerbits.train.precision import apply_recipe

    patches, options, config = VARIANTS[name]
    dev = torch.device("cuda")
    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = SwiGLU(4096, 14336).to(dev)
    apply_recipe(mlp, args.recipe, device=dev)
    x = torch.randn(args.tokens, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(args.tokens, 4096, device=dev, dtype=torch.bfloat16)
    with patched(patches), inductor_config.patch(config):
        f = compile_model(mlp, options=options)

        def step():
            out = f(x)
            out.backward(dy)
            return out

        out = step()
        results = [out.detach(), x.grad] + [p.grad for p in mlp.parameters()]
        for _ in range(3):
            x.grad = None
            mlp.zero_grad(set_to_none=True)
            step()
        if args.ncu:  # one step inside an NVTX range, for `ncu --nvtx --nvtx-include measured/`
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("measured")
            step()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            return results
        times = []
        for _ in range(args.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profile_iters):
                step()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0:
            rows.append((e.self_device_time_total / args.profile_iters / 1e3, e.count // args.profile_iters, e.key))
    rows.sort(reverse=True)
    same = "" if reference is None else (
        f"; bits equal to {args.variants[0]}'s: {all(torch.equal(r, s) for r, s in zip(results, reference))}")
    triton = sum(ms for ms, _, key in rows if key.startswith("triton_") or key.endswith("_kernel"))
    print(f"\n=== {name}: {statistics.median(times):.3f} ms a step (median of {args.iters}; fastest "
          f"{min(times):.3f}), {sum(r[0] for r in rows):.3f} ms of kernels, {triton:.3f} of them Triton's{same}")
    for ms, n, key in rows[: args.top]:
        print(f"  {ms:7.3f} {n:3d}  {key[:140]}")
    return results


def step_variant(name, bench_args):
    from fewerbits.cli import main as cli

    patches, options, config = VARIANTS[name]
    if options:
        raise SystemExit(f"variant {name} sets compile options, which bench train does not take")
    print(f"\n=== bench train, variant {name}", flush=True)
    torch._dynamo.reset()
    with patched(patches), inductor_config.patch(config):
        return cli(["bench", "train", *bench_args])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--recipe", default="fp8_tensorwise")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--profile-iters", type=int, default=3)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--ncu", action="store_true", help="no timing: one step after warm-up in an NVTX range 'measured'")
    p.add_argument("--step", action="store_true", help="run bench train (the arguments after --) per variant")
    args = p.parse_args(ours)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    if args.step:
        for name in args.variants:
            rc = step_variant(name, bench_args)
            if rc:
                return rc
        return 0
    reference = None
    for name in args.variants:
        results = mlp_variant(name, args, reference)
        reference = results if reference is None else reference
    return 0


if __name__ == "__main__":
    sys.exit(main())
