"""The reference on a CUDA device gives the CPU's bits (run with `pytest -m cuda` on a GPU).

CPU runs deselect these (pyproject's addopts: -m "not cuda").
"""

import numpy as np
import pytest
import torch

from fewerbits import FORMATS, SCHEMES, cast, get_scheme, quantize
from conftest import CAST_FORMATS, all_bf16_values
from test_quantize import MX, hard_matrix

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", autouse=True)
def need_cuda():
    assert torch.cuda.is_available(), "these tests need a CUDA device (pytest -m cuda)"


@pytest.mark.parametrize("name", CAST_FORMATS + ["e8m0", "int8", "tf32"])
def test_cast_on_cuda_equals_cpu(name):
    x = torch.from_numpy(all_bf16_values())
    assert torch.equal(
        cast(x.cuda(), name).cpu().view(torch.int32), cast(x, name).view(torch.int32)
    )


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_cast_equals_torch_hardware_conversion(name):
    """torch's own fp8 conversion on the GPU, clamped first (torch 2.11 does not saturate)."""
    fmt = FORMATS[name]
    x = torch.from_numpy(all_bf16_values()).cuda()
    x = x[torch.isfinite(x)]
    ours = cast(x, name)
    theirs = x.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).float()
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


@pytest.mark.parametrize(
    "name, rule",
    [(n, s.scale_rule) for n, s in SCHEMES.items()]
    + [(n, r) for n in MX for r in ("rceil", "ceil", "even")]
    + [("fp8_e4m3_row", "rceil")],
)
def test_quantize_on_cuda_equals_cpu(name, rule):
    scheme = get_scheme(name, rule)
    x = torch.from_numpy(hard_matrix(300, 520, specials=scheme.block != (-1, -1)))
    for axis in (-1, 0):
        cpu, gpu = quantize(x, scheme, axis=axis), quantize(x.cuda(), scheme, axis=axis)
        assert torch.equal(gpu.data.cpu(), cpu.data)
        assert torch.equal(gpu.scale.cpu().view(torch.uint8), cpu.scale.view(torch.uint8))
        if scheme.two_level:
            assert torch.equal(gpu.tensor_scale.cpu(), cpu.tensor_scale)
        deq_gpu, deq_cpu = gpu.dequantize().cpu(), cpu.dequantize()
        assert torch.equal(torch.isnan(deq_gpu), torch.isnan(deq_cpu))
        assert torch.equal(deq_gpu.nan_to_num(), deq_cpu.nan_to_num())


def test_stochastic_rounding_on_cuda_is_unbiased_and_reproducible():
    x = torch.full((1_000_000,), 2.3, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = cast(x, "fp4_e2m1", rounding="stochastic", generator=gen)
    assert set(a.unique().tolist()) == {2.0, 3.0}
    assert abs(a.double().mean().item() - float(np.float32(2.3))) < 5 * np.sqrt(0.3 * 0.7 / 1e6)
    b = cast(x, "fp4_e2m1", rounding="stochastic", generator=torch.Generator("cuda").manual_seed(0))
    assert torch.equal(a, b)


# -- scaled matmul: native against emulated ------------------------------------------------------

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fewerbits as fb  # noqa: E402
from fewerbits.gemm import emulated_matmul, native_reason, scaled_matmul  # noqa: E402

NATIVE_PAIRS = [
    ("fp8_e4m3_tensor", "fp8_e4m3_tensor", None),
    ("fp8_e5m2_tensor", "fp8_e4m3_tensor", None),
    ("fp8_e4m3_row", "fp8_e4m3_row", None),
    ("fp8_e4m3_row", "fp8_e4m3_row", "rceil"),
    ("fp8_e4m3_1x128", "fp8_e4m3_128x128", None),
    ("fp8_e4m3_1x128", "fp8_e4m3_1x128", None),
]
# The stated tolerance: both paths multiply the same quantized values with fp32 accumulation
# and differ only in how the sum is formed. Hopper's FP8 tensor cores keep fewer bits in their
# accumulator than fp32 (DeepSeek-V3 §3.3.2 measured about 14 on H800; cuBLAS promotes partial
# sums to fp32 only periodically), so an fp32 result agrees to 5e-4 relative (Frobenius), about
# 2^-11; a bf16 result adds at most one bf16 rounding difference: 3e-3.
TOLERANCE = {torch.float32: 5e-4, torch.bfloat16: 3e-3}


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor", "fp8_e4m3_row", "fp8_e4m3_1x128",
                                  "fp8_e4m3_128x128", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
def test_quantizer_compiled_on_cuda_equals_cpu(name):
    """The quantizer as compile_model compiles it on a GPU (Triton code from inductor, FP8 codes
    from the native conversion, correctly rounded division) against the reference on a CPU, bit
    for bit, along both axes: what every compiled Linear runs instead of our Triton kernels."""
    scheme = get_scheme(name)
    x = torch.from_numpy(hard_matrix(300, 520, specials=scheme.block != (-1, -1)))

    def q(t, axis):
        out = quantize(t, scheme, axis=axis)
        return out.data, out.scale, out.tensor_scale

    torch._dynamo.reset()
    compiled = fb.compile_model(q, fullgraph=True)
    for axis in (1, 0):
        data, scale, tensor_scale = compiled(x.cuda(), axis)
        ref = quantize(x, scheme, axis=axis)
        assert torch.equal(data.cpu(), ref.data), axis
        assert torch.equal(scale.cpu().view(torch.uint8), ref.scale.view(torch.uint8)), axis
        if scheme.two_level:
            assert torch.equal(tensor_scale.cpu(), ref.tensor_scale)
    torch._dynamo.reset()


@pytest.mark.parametrize("a_name, b_name, rule", NATIVE_PAIRS)
@pytest.mark.parametrize("m, k, n", [(256, 512, 384), (384, 640, 256), (1024, 4096, 1024)])
def test_native_equals_emulated(a_name, b_name, rule, m, k, n):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda") * torch.rand(m, 1, device="cuda") * 10
    b = torch.randn(n, k, device="cuda")
    qa, qb = fb.quantize(a, a_name, scale_rule=rule), fb.quantize(b, b_name, scale_rule=rule)
    assert native_reason(qa, qb) is None
    errors = {}
    for out_dtype in (torch.float32, torch.bfloat16):
        native = scaled_matmul(qa, qb, out_dtype=out_dtype, native=True).float()
        emulated = emulated_matmul(qa, qb, out_dtype=out_dtype).float()
        errors[out_dtype] = ((native - emulated).norm() / emulated.norm()).item()
    # the emulation is the exact product of the quantized values, up to fp32 summation
    exact_q = qa.dequantize_matrix().double() @ qb.dequantize_matrix().double().t()
    emulated = emulated_matmul(qa, qb, out_dtype=torch.float32).double()
    emulation_error = ((emulated - exact_q).norm() / exact_q.norm()).item()
    print(f"\nnative vs emulated {a_name} x {b_name} ({rule}) {m}x{k}x{n}: "
          f"fp32 {errors[torch.float32]:.2e}, bf16 {errors[torch.bfloat16]:.2e}; "
          f"emulated vs float64 {emulation_error:.1e}")
    assert emulation_error < 1e-6
    for dtype, err in errors.items():
        assert err <= TOLERANCE[dtype]
    exact = a @ b.t()  # and it is the right product (E5M2 operands: about 25 dB)
    assert ((native - exact).norm() / exact.norm()) < 0.08


@pytest.mark.parametrize("a_name, b_name", [("fp8_e4m3_tensor", "fp8_e4m3_tensor"),
                                            ("fp8_e5m2_tensor", "fp8_e4m3_tensor"), ("fp8_e4m3_row", "fp8_e4m3_row")])
def test_fast_accumulation_stays_near_the_exact_product(a_name, b_name):
    """use_fast_accum (the FP8 recipes' forward GEMM) against a float64 product of the same
    quantized values, beside the promoting GEMM, at an inner dimension of 4096: the hardware's
    accumulator is undocumented (DeepSeek-V3 §3.3.2: about 14 bits), so only a bound is checked."""
    torch.manual_seed(0)
    a = torch.randn(1024, 4096, device="cuda") * torch.rand(1024, 1, device="cuda") * 10
    b = torch.randn(1024, 4096, device="cuda")
    qa, qb = fb.quantize(a, a_name), fb.quantize(b, b_name)
    exact = qa.dequantize_matrix().double() @ qb.dequantize_matrix().double().t()
    errors = {}
    for fast in (False, True):
        out = scaled_matmul(qa, qb, out_dtype=torch.float32, native=True, fast_accum=fast).double()
        errors[fast] = ((out - exact).norm() / exact.norm()).item()
    print(f"\n{a_name} x {b_name}, K=4096, relative to the exact product: promoting {errors[False]:.2e}, "
          f"fast {errors[True]:.2e}")
    assert errors[False] < 5e-4 and errors[True] < 5e-3, errors


def test_native_column_wise_operands():
    """dgrad and wgrad shapes: the column-wise copies go through the native kernels too."""
    torch.manual_seed(0)
    g, w, x = (torch.randn(512, 256, device="cuda"), torch.randn(256, 384, device="cuda"),
               torch.randn(512, 384, device="cuda"))
    for tile, block in (("fp8_e4m3_1x128", "fp8_e4m3_128x128"), ("fp8_e4m3_row", "fp8_e4m3_row")):
        dgrad = scaled_matmul(fb.quantize(g, tile), fb.quantize(w, block, axis=0), out_dtype=torch.float32, native=True)
        wgrad = scaled_matmul(fb.quantize(g, tile, axis=0), fb.quantize(x, tile, axis=0), out_dtype=torch.float32, native=True)
        assert ((dgrad - g @ w).norm() / (g @ w).norm()) < 0.05
        assert ((wgrad - g.t() @ x).norm() / (g.t() @ x).norm()) < 0.05


def test_native_refusals_are_explained():
    q4 = fb.quantize(torch.randn(64, 64, device="cuda"), "mxfp4")
    q8 = fb.quantize(torch.randn(64, 64, device="cuda"), "fp8_e5m2_tensor")
    assert "no native kernel" in native_reason(q4, q4)
    assert "E5M2 × E5M2" in native_reason(q8, q8)
    with pytest.raises(RuntimeError, match="native=False to emulate"):
        scaled_matmul(q4, q4, native=True)
    odd = fb.quantize(torch.randn(64, 100, device="cuda"), "fp8_e4m3_tensor")
    assert "multiples of 16" in native_reason(odd, odd)


@pytest.mark.parametrize("name", list(fb.RECIPES))
def test_every_recipe_trains_on_cuda(name):
    torch.manual_seed(0)
    layer = fb.QuantizedLinear(512, 384, recipe=name).cuda()
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().square().mean().backward()
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert torch.isfinite(layer.weight.grad).all() and torch.isfinite(x.grad).all()
    ref = nn.functional.linear(x.float(), layer.weight)
    cos = nn.functional.cosine_similarity(y.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.95


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_rowwise", "fp8_blockwise", "mxfp8", "nvfp4_naive", "nvfp4"])
def test_inductor_compiles_a_converted_model_on_cuda(name):
    """Forward and backward of a model compiled with compile_model (native FP8 GEMMs on
    operands that inductor quantized) against eager mode, which quantizes with the Triton
    kernels: the same bits up to the order of fp32 sums. nvfp4 rounds its gradients
    stochastically, with other noise compiled than eager: its gradients are only checked to be
    finite (nvfp4_naive checks the same formats without the noise)."""
    from test_convert import eager_then_compiled, two_linears

    torch._dynamo.reset()
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    eager, grads, out, compiled_grads = eager_then_compiled(two_linears(name, "cuda"), x)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    assert rel(out, eager) < 1e-3
    if fb.get_recipe(name).dgrad.a.rounding == "stochastic":
        assert all(torch.isfinite(c).all() for c in compiled_grads)
    else:
        assert all(rel(c, g) < 1e-3 for c, g in zip(compiled_grads, grads))
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_rowwise", "fp8_blockwise"])
def test_compiled_linears_take_token_counts_that_native_fp8_cannot(name):
    """An MoE's experts see another token count at each call. Compiled, the count becomes a
    dynamic size, and where it is no multiple of 16 (of 128 for blockwise) the weight-gradient
    GEMM runs emulated: deciding so once formatted the count into a message, which specialised
    the graph, and torch 2.11's dynamo then failed to trace the quantized Linear (an
    AssertionError at 3000 tokens, on the H200; docs/kernels-notes.md, v44). Below 128 tokens
    the column-wise 1x128 codes hold one block along the tokens, which the operator's scales
    count symbolically: their dequantization read each element's scale at its column (wrong
    weight gradients, then NaN; v46). Seven counts in turn, compiled against eager mode: the
    same output and gradients up to the order of fp32 sums."""
    from test_convert import two_linears

    torch._dynamo.reset()
    model = two_linears(name, "cuda")
    compiled = fb.compile_model(model)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    for n in (1024, 2048, 1536, 3000, 777, 100, 20):
        x = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
        runs = []
        for run in (model, compiled):
            xr = x.clone().requires_grad_()
            out = run(xr)
            out.float().square().sum().backward()
            runs.append([out, xr.grad] + [p.grad for p in model.parameters()])
            model.zero_grad(set_to_none=True)
        assert all(rel(c, e) < 1e-3 for e, c in zip(*runs)), n
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe, block", [("fp8_blockwise", 128), ("mxfp4", 32), ("nvfp4", 16)])
def test_compiled_reference_linears_take_a_count_of_one_whole_block(recipe, block):
    """On the reference backend (the quantizer traced op by op, as on a CPU), a dynamic token
    count of exactly one block specialised the compiled graph, and torch 2.11's dynamo then
    failed to trace the quantized Linear (an AssertionError on the H200: an MoE expert given 128
    tokens; docs/kernels-notes.md v47). Six counts in turn, compiled against eager mode: the
    same output and gradients bit for bit."""
    from fewerbits import kernels
    from test_convert import graphs_for_token_counts

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False)).cuda()
    fb.convert(model, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    kernels.set_backend("reference")
    try:
        graphs_for_token_counts(model, (512, 530, block, block - 3, 300, 2 * block))  # asserts the bits
    finally:
        kernels.set_backend("auto")
        torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4_naive", "nvfp4_naive"])
def test_one_compiled_emulated_linear_equals_eager_on_cuda(name):
    """One converted Linear's forward on the GPU three ways — eagerly on the Triton kernels,
    eagerly on the reference, compiled — multiplies the same exactly representable values, so
    the outputs may differ only by the order of fp32 sums. (Two compiled nvfp4 Linears differed
    from eager mode by 2.3%: this places the difference.)"""
    from fewerbits import kernels
    from test_convert import two_linears

    torch._dynamo.reset()
    layer = two_linears(name, "cuda")[0]
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) * 3
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    with torch.no_grad():
        eager = layer(x)
        kernels.set_backend("reference")
        try:
            reference = layer(x)
        finally:
            kernels.set_backend("auto")
        compiled = fb.compile_model(layer)(x)
    errors = {"triton vs reference": rel(eager, reference), "compiled vs reference": rel(compiled, reference)}
    assert all(e < 1e-5 for e in errors.values()), errors
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4_naive"])
def test_two_compiled_emulated_linears_equal_eager_with_and_without_autograd_on_cuda(name):
    """Two compiled nvfp4 Linears in training differed from eager mode by 2.3% while one
    compiled Linear without autograd matched it: the same two Linears compiled without
    autograd, and forward-only with autograd (the training graph's forward), and the first
    Linear alone with autograd, each against eager mode — which of them differs places the
    fault (the graph's fusion across the two Linears, or autograd's partition)."""
    from test_convert import two_linears

    model = two_linears(name, "cuda")
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) * 3
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    errors = {}
    for label, module, grad in [("two Linears, no autograd", model, False),
                                ("two Linears, autograd forward", model, True),
                                ("first Linear, autograd forward", model[0], True)]:
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            eager = module(x)
            compiled = fb.compile_model(module)(x)
        errors[label] = rel(compiled, eager)
    torch._dynamo.reset()
    assert all(e < 1e-3 for e in errors.values()), errors


def small_llama(name: str):
    """A two-block Llama on the GPU, every Linear under recipe `name` (seeded)."""
    from fewerbits.models import Llama, ModelConfig
    from fewerbits.train.precision import apply_recipe

    torch.manual_seed(0)
    cfg = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512, vocab_size=512, max_seq_len=128)
    model = Llama(cfg).cuda()
    apply_recipe(model, name, policy=fb.Policy(min_features=0, keep_last_blocks=0), device="cuda")
    return model


@pytest.mark.parametrize("name", ["bf16", "fp8_tensorwise", "fp8_delayed", "fp8_rowwise", "fp8_blockwise",
                                  "mxfp8", "mxfp4", "nvfp4"])
def test_the_trainers_model_compiles_to_one_graph_on_cuda(name):
    """On a GPU the quantized Linears take other paths than on a CPU (Triton kernels, native
    FP8 GEMMs): none of them may break the graph, or torch.compile runs most of a step eagerly."""
    torch._dynamo.reset()
    model = small_llama(name)
    ids = torch.randint(0, 512, (2, 128), device="cuda")
    explained = torch._dynamo.explain(model)(ids)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["fp8_tensorwise", "mxfp8", "mxfp4", "nvfp4"])
def test_a_compiled_training_step_never_waits_for_the_gpu(name):
    """After warm-up, the training step `bench train` times, compiled block by block, makes no
    call that synchronizes with the GPU: a host-to-device copy of a constant, or a device value
    read on the host, would stall the stream on every step (as the Hadamard matrix copied into
    each compiled backward did: docs/kernels-notes.md, v20)."""
    from fewerbits import bench

    torch._dynamo.reset()
    model = small_llama(name)
    ids = torch.randint(0, 512, (2, 129), device="cuda")
    step = bench.training_step(model, ids[:, :-1], ids[:, 1:], compile=False, blocks=True,
                               device=torch.device("cuda"))
    for _ in range(2):
        step()
    syncs = bench.synchronizing_calls(step)
    assert not syncs, (len(syncs), syncs[:2])
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["fp8_blockwise", "fp8_delayed"])
def test_a_training_step_replayed_as_cuda_graphs_trains_as_the_compiled_step(name):
    """`bench train --compile-mode reduce-overhead`: the step's compiled blocks replayed as CUDA
    graphs (recorded in a warm-up step, then replayed) train as the same step without them:
    step by step the losses agree to well within how much one step changes them (the
    attention's backward is not bitwise reproducible), so no replay reads a stale buffer."""
    from fewerbits import bench

    ids = torch.randint(0, 512, (2, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    losses = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        model = small_llama(name)
        step = bench.training_step(model, ids[:, :-1], ids[:, 1:], compile=False, blocks=True,
                                   device=torch.device("cuda"), mode=mode)
        got = []
        for _ in range(6):
            step()
            with torch.no_grad():
                got.append(F.cross_entropy(model(ids[:, :-1]).float().flatten(0, 1), ids[:, 1:].reshape(-1)).item())
        losses[mode] = got
    torch._dynamo.reset()
    a, b = torch.tensor(losses["default"]), torch.tensor(losses["reduce-overhead"])
    moved = (a[0] - a[-1]).abs()
    assert moved > 1e-3, losses
    assert (a - b).abs().max() < moved / 20, losses


def count_recordings(monkeypatch) -> list:
    """A list that gets an item for every CUDA graph that inductor's cudagraph trees record
    from now on (`CUDAGraphTreeManager.record_function`, counted through `monkeypatch`)."""
    import torch._inductor.cudagraph_trees as trees

    recorded = []
    record = trees.CUDAGraphTreeManager.record_function
    monkeypatch.setattr(trees.CUDAGraphTreeManager, "record_function",
                        lambda self, *a, **k: recorded.append(1) or record(self, *a, **k))
    return recorded


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_delayed", "mxfp4", "nvfp4"])
def test_cuda_graphs_are_recorded_once_and_then_replayed(name, monkeypatch):
    """Under reduce-overhead the step's compiled blocks record their CUDA graphs in one of the
    first steps and replay them in every later one. An input that moves between steps makes
    them record again, each recording step several times as long as a replayed one: the fused
    AdamW's weight amaxes, new tensors each step, did so under the per-tensor recipes for up to
    five steps (docs/kernels-notes.md, v41). Under mxfp4 and nvfp4 the first step failed: a
    constant that `device_constant` built and cached there was left in the graphs' memory pool
    (v43)."""
    from fewerbits import bench

    recorded = count_recordings(monkeypatch)
    torch._dynamo.reset()
    model = small_llama(name)
    ids = torch.randint(0, 512, (2, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    step = bench.training_step(model, ids[:, :-1], ids[:, 1:], compile=False, blocks=True,
                               device=torch.device("cuda"), mode="reduce-overhead")
    per_step = []
    for _ in range(7):
        before = len(recorded)
        step()
        per_step.append(len(recorded) - before)
    torch._dynamo.reset()
    assert sum(per_step[:2]) > 0 and per_step[2:] == [0] * 5, per_step


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_rowwise"])
def test_a_step_that_leaves_a_weight_out_records_no_graph_again(name, monkeypatch):
    """Under reduce-overhead, a step whose optimizer finds a weight without a gradient (an
    expert that got no tokens in an MoE model) makes no graph record again, in that step or
    after it: the fused AdamW keeps every weight's amax slots (fp8_rowwise's columns' too) where
    they were, and the weight left out keeps its last amax (docs/kernels-notes.md, v48). Before,
    the others' amaxes moved to a new buffer in that step and again in the next."""
    from fewerbits import bench
    from fewerbits.train.optim import AdamW

    recorded = count_recordings(monkeypatch)
    torch._dynamo.reset()
    model = small_llama(name)
    weight = model.layers[1].mlp.down_proj.weight
    calls, step_of = [], AdamW.step

    def leaving_out(self, *a, **k):  # the fifth step updates every parameter but `weight`
        calls.append(1)
        if len(calls) == 5:
            weight.grad = None
        return step_of(self, *a, **k)

    monkeypatch.setattr(AdamW, "step", leaving_out)
    ids = torch.randint(0, 512, (2, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    step = bench.training_step(model, ids[:, :-1], ids[:, 1:], compile=False, blocks=True,
                               device=torch.device("cuda"), mode="reduce-overhead")
    per_step, kept = [], None
    for i in range(8):
        before = len(recorded)
        if i == 4:
            kept = weight.detach().clone()
        step()
        per_step.append(len(recorded) - before)
        if i == 4:
            assert torch.equal(weight.detach(), kept)  # left out: not updated
    torch._dynamo.reset()
    assert sum(per_step[:2]) > 0 and per_step[2:] == [0] * 6, per_step


def trainer_tokens(path):
    """A learnable .bin of token ids (vocabulary 256): a pattern a tiny model picks up in steps."""
    i = np.arange(60_000)
    (i * 7 % 251 + i // 97 % 5).astype(np.uint16).tofile(path)
    return str(path)


@pytest.mark.parametrize("name", ["fp8_blockwise", "fp8_delayed"])
def test_the_trainer_accumulates_gradients_across_cuda_graph_replays(name, tmp_path):
    """`train --compile-blocks --compile-mode reduce-overhead --grad-accum 2`: the gradients of a
    step's first micro-batch, which its replayed backward can leave in the CUDA graphs' memory,
    survive the second micro-batch's replay. After four steps the weights are those of the same
    run without CUDA graphs to within a twentieth of how far they moved from their initial
    values (the attention's backward is not bitwise reproducible), and so are the losses,
    step by step, and the validation loss (evaluated under the graphs too)."""
    from safetensors.torch import load_file

    from fewerbits.models import Llama, get_preset
    from fewerbits.train import TrainConfig, train
    from fewerbits.train.metrics import read_metrics

    data = trainer_tokens(tmp_path / "tokens.bin")
    runs = {}
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        out = tmp_path / (mode or "default")
        train(TrainConfig(recipe=name, preset="tiny", data=data, vocab_size=256, steps=4, batch_size=4,
                          seq_len=64, grad_accum=2, compile_blocks=True, compile_mode=mode, eval_every=2,
                          eval_windows=8, log_every=1, progress=False, tensorboard=False, out=str(out),
                          device="cuda"))
        runs[mode] = load_file(out / "checkpoint" / "model.safetensors"), read_metrics(out)
    torch._dynamo.reset()
    torch.manual_seed(0)  # the trainer's initial weights (seed 0)
    init = Llama(get_preset("tiny", 256)).state_dict()
    (a, metrics_a), (b, metrics_b) = runs[None], runs["reduce-overhead"]
    keys = [k for k in init if init[k].is_floating_point()]
    assert keys and all(k in a and k in b for k in keys), set(init) - set(a)
    moved = sum((a[k].cpu() - init[k]).double().norm() ** 2 for k in keys) ** 0.5
    apart = sum((a[k] - b[k]).double().norm() ** 2 for k in keys) ** 0.5
    assert moved > 0.1 and apart < moved / 20, (apart, moved)
    losses = {key: [torch.tensor([r[k] for r in m if k in r]) for m in (metrics_a, metrics_b)]
              for key, k in (("train", "loss"), ("val", "val_loss"))}
    fell = losses["train"][0][0] - losses["train"][0][-1]
    assert fell > 0.1, losses
    for key, n in (("train", 4), ("val", 2)):
        la, lb = losses[key]
        assert len(la) == len(lb) == n and (la - lb).abs().max() < fell / 20, (key, la, lb)


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_blockwise", "nvfp4"])
def test_the_trainer_records_its_cuda_graphs_once(name, tmp_path, monkeypatch):
    """The trainer under reduce-overhead with gradient accumulation records its graphs in the
    first steps and replays them after: an operand prepared once a step for the micro-batches
    (`prepare_weight`) or an amax that moved would make the blocks record again in every step
    (docs/kernels-notes.md, v40–v42)."""
    from fewerbits.train import TrainConfig, train
    from fewerbits.train.optim import AdamW

    recorded, per_step = count_recordings(monkeypatch), []
    step = AdamW.step

    def counted(self, *a, **k):  # the recordings of this step's micro-batches
        per_step.append(len(recorded) - sum(per_step))
        return step(self, *a, **k)

    monkeypatch.setattr(AdamW, "step", counted)
    torch._dynamo.reset()
    train(TrainConfig(recipe=name, preset="tiny", data=trainer_tokens(tmp_path / "tokens.bin"), vocab_size=256,
                      steps=7, batch_size=4, seq_len=64, grad_accum=2, compile_blocks=True,
                      compile_mode="reduce-overhead", eval_every=10**6, eval_windows=4, checkpoint_every=0,
                      progress=False, tensorboard=False, out=str(tmp_path / "run"), device="cuda"))
    torch._dynamo.reset()
    assert len(per_step) == 7 and sum(per_step[:2]) > 0 and per_step[2:] == [0] * 5, per_step


def test_conversion_keeps_what_native_fp8_cannot_take():
    model = nn.Sequential(nn.Linear(1024, 1000), nn.GELU(), nn.Linear(1000, 1024), nn.Linear(1024, 128)).cuda()
    report = fb.convert(model, "fp8_blockwise")
    why = {r.name: (r.got, r.reason) for r in report.layers}
    assert why["0"] == ("bfloat16", "native FP8 needs dims divisible by 128")
    assert why["3"][0] == "bfloat16" and "too small" in why["3"][1]
    model2 = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024)).cuda()
    assert [r.got for r in fb.convert(model2, "fp8_tensorwise").layers] == ["fp8_tensorwise"] * 2
    model3 = nn.Sequential(nn.Linear(1024, 1000), nn.Linear(1000, 8)).cuda()
    assert [r.got for r in fb.convert(model3, "mxfp4").layers] == ["mxfp4"] * 2  # emulated: any shape


def test_the_kernels_quotient_gives_the_gpus_division_bits():
    """A slice of scripts/verify_quotient.py (which checks all 2^46 pairs of significands in
    about a minute): `rowblock._quotient` against the GPU's `tl.div_rn` for 32 runs of 256
    divisor significands spread over [1, 2), each against every dividend significand, and for
    2^27 random pairs over the whole range."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "verify_quotient.py"
    spec = importlib.util.spec_from_file_location("verify_quotient", path)
    vq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vq)
    assert vq.random_pairs(1) == 0
    assert vq.all_significands(1 / 1024) == 0
