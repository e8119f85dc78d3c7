"""QuantizedLinear and the recipes on CPU: accuracy floors, stabilisers, state, memory."""

import collections
import dataclasses
import math

import pytest
import torch
import torch.nn as nn

import fewerbits as fb
from fewerbits.diagnostics import sqnr_db
from fewerbits.gemm import scaled_matmul
from fewerbits.linear import _prepare

# SQNR floors (dB) for a 2-layer MLP (256 → 512 → 256, GELU, 512 tokens, seed 0): output,
# input gradient, and the weight gradients of both layers, against the same MLP in fp32.
# Measured values sit 1 – 2 dB above these. Why they are where they are: a round trip costs
# about 31 dB in E4M3 and E2M3, 25 dB in E5M2 and E3M2, 19 – 20 dB in FP4 (docs/numerics.md);
# a GEMM with two quantized operands adds their errors (≈ −3 dB), and the errors of two layers
# (and of the forward pass, through GELU's derivative, into the gradients) add again.
FLOORS = {
    "fp32": (100, 100, 100),
    "bf16": (44, 45, 45),
    "fp16": (62, 63, 63),
    "fp8_delayed": (23.5, 19.5, 19.5),  # E4M3 forward, E5M2 gradients
    "fp8_tensorwise": (23.5, 19.5, 19.5),
    "fp8_rowwise": (24, 23.5, 23),  # E4M3 everywhere
    "fp8_blockwise": (24, 23.5, 23),
    "mxfp8": (24, 23.5, 23),
    "mxfp6": (23, 19.5, 19.5),  # E2M3 forward, E3M2 gradients
    "mxfp4_fwd": (10, 17, 12),  # FP4 forward, FP8 backward (gradients still see the FP4 forward)
    "mxfp4": (10, 9, 9.5),
    "mxfp4_naive": (10, 10, 10),
    "nvfp4": (12, 10, 10.5),
    "nvfp4_naive": (12.5, 12, 12),
    "mxfp4_qat_experts": (24, 23.5, 23),  # no experts in this MLP: fp8_blockwise throughout
}


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))


def run(model, x, g):
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.float().backward(g)
    return y.detach().float(), x.grad, [model[0].weight.grad, model[2].weight.grad]


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(1)
    x, g = torch.randn(512, 256), torch.randn(512, 256)
    return x, g, run(mlp(), x, g)


def test_every_recipe_has_floors():
    assert set(FLOORS) == set(fb.RECIPES)


@pytest.mark.parametrize("name", list(fb.RECIPES))
def test_recipe_accuracy_against_fp32(name, reference):
    x, g, (y_ref, gx_ref, gw_ref) = reference
    model = mlp()
    report = fb.convert(model, name, policy=fb.Policy(keep=()))
    assert len(report.converted) == 2 and isinstance(model[0], fb.QuantizedLinear)
    torch.manual_seed(2)
    y, gx, gw = run(model, x, g)
    out_floor, gx_floor, gw_floor = FLOORS[name]
    assert sqnr_db(y_ref, y) >= out_floor
    assert sqnr_db(gx_ref, gx) >= gx_floor
    for ref, got in zip(gw_ref, gw):
        assert got.dtype == torch.float32 and sqnr_db(ref, got) >= gw_floor
    if name != "fp32":
        assert not torch.equal(y, y_ref)  # quantization (or rounding) really happened
    assert model[0](x[:2].bfloat16()).dtype == torch.bfloat16  # output in the input's dtype


def test_parameters_are_shared_and_bias_stays_high_precision():
    model = mlp()
    w, b = model[0].weight, model[0].bias
    fb.convert(model, "mxfp4", policy=fb.Policy(keep=()))
    assert model[0].weight is w and model[0].bias is b and w.dtype == torch.float32
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 256)).float().sum().backward()
    opt.step()  # the optimizer's parameters are the converted module's
    assert b.grad is not None and b.grad.dtype == torch.float32
    sd = model.state_dict()
    assert set(sd) == {"0.weight", "0.bias", "2.weight", "2.bias"}


# -- the stabilisers ----------------------------------------------------------------------------


def test_hadamard_leaves_the_product_unchanged():
    torch.manual_seed(0)
    a, b = torch.randn(300, 77) * 10, torch.randn(200, 77)
    for h in (fb.Hadamard(16), fb.Hadamard(32, seed=5), fb.Hadamard(128), fb.Hadamard(4, signs=(1, -1, -1, 1))):
        ah, bh = h.transform(a), h.transform(b)
        assert ah.shape[1] % h.size == 0
        ref = (a.double() @ b.double().t())
        err = ((ah @ bh.t()).double() - ref).norm() / ref.norm()
        assert err < 1e-5
        q = h.matrix()
        assert torch.allclose(q @ q.t(), torch.eye(h.size), atol=1e-6)
    assert fb.Hadamard(16, seed=1).sign_vector() != fb.Hadamard(16, seed=2).sign_vector()
    with pytest.raises(ValueError, match="power of two"):
        fb.Hadamard(24)
    with pytest.raises(ValueError, match="signs"):
        fb.Hadamard(4, signs=(1, 1, 1))


def heavy_tailed(rows, cols, seed):
    """Student-t (ν = 2) entries: many moderate outliers in every channel."""
    torch.manual_seed(seed)
    return torch.distributions.StudentT(2.0).sample((rows, cols))


def wgrad_sqnr(recipe, g, x):
    """SQNR of one weight-gradient GEMM gᵀx under a recipe's wgrad operands."""
    gemm = fb.get_recipe(recipe).wgrad if isinstance(recipe, str) else recipe.wgrad
    a = _prepare(g, gemm.a, gemm, 0, torch.bfloat16)
    b = _prepare(x, gemm.b, gemm, 0, torch.bfloat16)
    return sqnr_db(g.t() @ x, scaled_matmul(a, b, out_dtype=torch.float32))


def test_hadamard_transform_is_the_butterfly_in_float32():
    """`transform` is x·Q, computed in one fixed order (signs, butterfly stages 1, 2, 4, …, then
    × fp32(1/√h)): on small integers the sums are exact, so the result is the exact product
    (an independent oracle: float64 matmul with the ±1 matrix) times fp32(1/√h), once rounded;
    on general input within fp32 rounding of x @ Q; along dim 0 the same numbers."""
    torch.manual_seed(1)
    for h in (fb.Hadamard(16, seed=2), fb.Hadamard(32, seed=4), fb.Hadamard(8, signs=(1, -1, 1, 1, -1, -1, 1, -1))):
        x = torch.randint(-50, 50, (9, 3 * h.size)).float()
        signed = (h.matrix().double() * math.sqrt(h.size)).round()  # D·H, entries ±1
        exact = (x.double().reshape(9, 3, h.size) @ signed).reshape(9, -1)
        expected = (exact.float() * torch.tensor(h.scale, dtype=torch.float32))
        assert torch.equal(h.transform(x), expected)
        assert h.scale == float(torch.tensor(1 / math.sqrt(h.size), dtype=torch.float32))
        g = torch.randn(7, 2 * h.size) * 100
        ref = (g.double().reshape(7, 2, h.size) @ h.matrix().double()).reshape(7, -1)
        assert ((h.transform(g).double() - ref).abs() <= 1e-5 * ref.abs().max()).all()
        assert torch.equal(h.transform(g.t().contiguous(), dim=0), h.transform(g).t())


def test_hadamard_transform_traced_builds_no_constant_from_a_list():
    """Traced by torch.compile, the transform makes its sign vector on the device from integer
    words: a constant built from a list would be copied from the host on every call of the
    compiled graph (on a GPU, a wait for the whole stream each time). Same bits as eager."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    for h in (fb.Hadamard(16, seed=3), fb.Hadamard(32, seed=0), fb.Hadamard(64, seed=1)):
        torch._dynamo.reset()
        graphs.clear()
        x = torch.randn(8, 2 * h.size)
        compiled = torch.compile(lambda t: h.transform(t, dim=-1), backend=capture, fullgraph=True)
        assert torch.equal(compiled(x).view(torch.int32), h.transform(x).view(torch.int32))
        nodes = [n for g in graphs for n in g.graph.nodes]
        assert nodes and not any(n.op == "call_function" and n.target is torch.tensor for n in nodes)
    torch._dynamo.reset()


def test_graphs_compiled_again_for_a_transform_of_another_size_train():
    """nvfp4 (a 16-point transform of the weight-gradient operands) compiled, then mxfp4 (32)
    through the same code: the recompiled graph's backward holds the other size and factor as
    constants (torch.compile turns a number attribute that changed into a symbolic one, which
    its autograd-function backward could not carry), and both give eager mode's gradients."""

    class Two(nn.Module):  # a forward of its own: no other test's graphs in its cache
        def __init__(self, recipe):
            super().__init__()
            self.a, self.b = fb.QuantizedLinear(64, 96, recipe=recipe), fb.QuantizedLinear(96, 32, recipe=recipe)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    torch._dynamo.reset()
    x = torch.randn(2, 16, 64)
    for recipe in ("nvfp4", "mxfp4"):
        grads = []
        for compiled in (False, True):
            torch.manual_seed(0)
            model = Two(recipe)
            xx = x.clone().requires_grad_()
            (torch.compile(model, backend="aot_eager") if compiled else model)(xx).square().sum().backward()
            grads.append([xx.grad] + [p.grad for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads)), recipe


def test_hadamard_raises_mxfp4_weight_gradient_sqnr_on_outliers():
    g, x = heavy_tailed(1024, 256, 0), heavy_tailed(1024, 256, 1)
    naive = fb.get_recipe("mxfp4_naive")
    with_hadamard = dataclasses.replace(naive, wgrad=dataclasses.replace(naive.wgrad, hadamard=fb.Hadamard(32)))
    torch.manual_seed(0)
    full = wgrad_sqnr("mxfp4", g, x)  # Hadamard and stochastic rounding together
    assert wgrad_sqnr(with_hadamard, g, x) > wgrad_sqnr(naive, g, x) + 1.5
    assert full > wgrad_sqnr(naive, g, x)
    gauss_g, gauss_x = torch.randn(1024, 256), torch.randn(1024, 256)  # nothing to spread
    assert abs(wgrad_sqnr(with_hadamard, gauss_g, gauss_x) - wgrad_sqnr(naive, gauss_g, gauss_x)) < 0.5


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4"])
def test_mean_of_stochastic_gradients_loses_the_bias(name):
    """Averaged over draws, SR gradients approach fp32; round-to-nearest stays where it is.

    The other operand of each gradient GEMM (weight, input) is rounded to nearest in both, so
    its error stays; removing grad_output's error can gain at most about 3 dB.
    """
    recipe = fb.get_recipe(name)
    nearest = dataclasses.replace(
        recipe,
        dgrad=dataclasses.replace(recipe.dgrad, a=dataclasses.replace(recipe.dgrad.a, rounding="nearest")),
        wgrad=dataclasses.replace(recipe.wgrad, a=dataclasses.replace(recipe.wgrad.a, rounding="nearest")),
    )
    torch.manual_seed(0)
    layer = nn.Linear(128, 64)
    x, g = torch.randn(256, 128), torch.randn(256, 64)
    xr = x.clone().requires_grad_()
    (layer(xr) * g).sum().backward()
    gx_ref, gw_ref = xr.grad.clone(), layer.weight.grad.clone()

    def grads(r):
        q = fb.QuantizedLinear.from_linear(layer, r)
        layer.weight.grad = None
        xq = x.clone().requires_grad_()
        (q(xq).float() * g).sum().backward()
        return xq.grad, layer.weight.grad.clone()

    rne_gx, rne_gw = grads(nearest)
    draws = [grads(recipe) for _ in range(200)]
    mean_gx = torch.stack([d[0] for d in draws]).mean(0)
    mean_gw = torch.stack([d[1] for d in draws]).mean(0)
    single_gx = draws[0][0]
    assert sqnr_db(gx_ref, mean_gx) > sqnr_db(gx_ref, rne_gx) + 1
    assert sqnr_db(gw_ref, mean_gw) > sqnr_db(gw_ref, rne_gw) + 1
    assert sqnr_db(gx_ref, single_gx) < sqnr_db(gx_ref, rne_gx)  # one draw is noisier


def test_stochastic_dgrad_is_unbiased():
    """E[grad_input] over SR draws = E[Q(g)] · W_q, and E[Q(g)] is g except where it saturates.

    With block scales fixed by g's amaxes, stochastic rounding is unbiased for every value
    inside ±6 · scale; a block maximum whose E4M3 scale rounded down lands above 6 and is
    clipped to it (in every draw). The mean of 400 draws must sit on that expectation.
    """
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    x, g = torch.randn(128, 64), torch.randn(128, 32)
    recipe = fb.get_recipe("nvfp4")
    w_q = fb.quantize(layer.weight.detach(), recipe.dgrad.b.scheme, axis=0).dequantize()
    q_g = fb.quantize(g, recipe.dgrad.a.scheme)  # only its scales are used
    scale = q_g.block_scales().repeat_interleave(16, 1) * q_g.tensor_scale  # per element
    expected_g = (g / scale).clamp(-6, 6) * scale
    exact = expected_g @ w_q
    q = fb.QuantizedLinear.from_linear(layer, recipe)
    draws = []
    for _ in range(400):
        xq = x.clone().requires_grad_()
        (q(xq).float() * g).sum().backward()
        draws.append(xq.grad)
    draws = torch.stack(draws)
    std_err = draws.std(0) / 20  # of a 400-draw mean
    inside = ((draws.mean(0) - exact).abs() <= 4 * std_err + 1e-5).float().mean()
    assert inside > 0.995
    biased = ((draws.mean(0) - g @ w_q).abs() <= 4 * std_err + 1e-5).float().mean()
    assert biased < inside  # ignoring the saturation would not explain the draws


# -- state and memory -------------------------------------------------------------------------


def test_fp8_delayed_state_round_trips_through_state_dict():
    torch.manual_seed(0)
    model = mlp()
    fb.convert(model, "fp8_delayed", policy=fb.Policy(keep=()))
    layer = model[0]
    x = torch.randn(64, 256)
    first = layer(x)  # step 1 uses the initial scale 1 (amax = 448)
    assert layer.delayed_scaling.amax[0].item() == x.abs().max().item()
    for _ in range(3):
        model(torch.randn(64, 256) * 2).float().sum().backward()
    sd = model.state_dict()
    assert sd["0.delayed_scaling.amax_history"].shape == (3, 1024)
    assert (sd["0.delayed_scaling.amax_history"] > 0).sum(1).tolist() == [4, 4, 3]  # 4 forwards, 3 backwards
    fresh = mlp(1)
    fb.convert(fresh, "fp8_delayed", policy=fb.Policy(keep=()))
    fresh.load_state_dict(sd)
    for key in ("amax_history", "amax"):
        assert torch.equal(getattr(fresh[0].delayed_scaling, key), getattr(layer.delayed_scaling, key))
    probe = torch.randn(16, 256)
    assert torch.equal(fresh(probe), model(probe))
    assert not torch.equal(first, layer(x))  # the scale moved on from its initial 1


def test_delayed_scaling_uses_past_amaxes():
    layer = fb.QuantizedLinear(32, 32, recipe="fp8_delayed")
    state = layer.delayed_scaling
    layer(torch.full((4, 32), 1000.0))  # step 1: scale 1, so 1000 saturates to 448
    assert state.amax[0].item() == 1000.0
    out = layer(torch.full((4, 32), 0.001))  # step 2: quantized with amax 1000 (delayed)
    q = fb.quantize(torch.full((4, 32), 0.001), "fp8_e4m3_tensor", amax=torch.tensor(1000.0))
    assert q.block_scales().item() == pytest.approx(1000 / 448)
    assert state.amax[0].item() == 1000.0  # the history still remembers the large step
    assert out.shape == (4, 32)


@pytest.mark.parametrize("amax_compute", ["max", "most_recent"])
def test_a_steps_history_entries_at_once_are_those_of_a_record_each(amax_compute):
    """DelayedScalingState.record_entries(role, amaxes) leaves the history and the next amax as
    `record` does with one entry after another (Transformer Engine's rule: each record writes
    its amax into the window, takes the window's maximum, or that amax, unless it is 0 or not
    finite, when the amax stays, and moves the window on): windows of 1 to 5 entries, batches
    longer than the window, zeros, inf and NaN; and it records whatever `recording` says."""
    import random

    from fewerbits.linear import ROLES, DelayedScalingState

    recipe = fb.get_recipe("fp8_delayed")
    rng = random.Random(0)
    values = [0.0, 0.0, 0.25, 1.5, 3.0, 1000.0, float("inf"), float("nan")]
    for length in (1, 2, 3, 5):
        config = fb.DelayedScaling(history_len=length, amax_compute=amax_compute)
        want, got = DelayedScalingState(config, recipe), DelayedScalingState(config, recipe)
        got.recording = False
        for _ in range(12):
            amaxes = torch.tensor([rng.choice(values) for _ in range(rng.randint(1, 7))])
            role = rng.choice(ROLES)
            for a in amaxes:
                want.record(role, None, amax=a)
            got.record_entries(role, amaxes)
            assert torch.allclose(got.amax_history, want.amax_history, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(got.amax, want.amax)


def test_delayed_scaling_records_the_amax_of_the_whole_tensor_eager_and_compiled():
    """The recorded amax is max |t| over the whole tensor, taken through its rows' maxima: equal
    to `t.abs().max()` where finite, inf for ±inf, NaN for any NaN, eagerly and under inductor;
    and it is what `DelayedScalingState.record` puts into the history."""
    from fewerbits.linear import DelayedScalingState
    from fewerbits.quantize import tensor_amax_of as _amax

    recipe = fb.get_recipe("fp8_delayed")

    torch.manual_seed(0)
    base = torch.randn(37, 129) * 3
    cases = [base, base.bfloat16(), base.reshape(3, 37, 43), base[0], torch.zeros(5, 7)]
    for k, bad in enumerate([float("inf"), float("-inf"), float("nan")]):
        t = base.clone()
        t[k * 11 + 2, 100] = bad
        cases.append(t)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(_amax, fullgraph=True, dynamic=False)
        for t in cases:
            expected = t.float().abs().max()
            state = DelayedScalingState(recipe.delayed, recipe)
            state.record("input", t)
            recorded = state.amax_history[0, -1]  # the newest entry, after the window moved on
            for got, dtype in ((_amax(t), t.dtype), (compiled(t), t.dtype), (recorded, torch.float32)):
                assert got.dim() == 0 and got.dtype == dtype
                assert torch.equal(got.float(), expected) or (got.isnan() and expected.isnan()), (t.shape, got, expected)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("name", ["fp8_blockwise", "mxfp4", "nvfp4"])
def test_saving_the_quantized_input(name):
    torch.manual_seed(0)
    base = nn.Linear(128, 64)
    x, g = torch.randn(256, 128).bfloat16(), torch.randn(256, 64)  # activations arrive in bf16

    def grads_and_saved(save_q):
        q = fb.QuantizedLinear.from_linear(base, name, save_quantized_input=save_q)
        base.weight.grad = None
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size() if t.data_ptr() != base.weight.data_ptr() else 0)
            return t

        xq = x.clone().requires_grad_()
        torch.manual_seed(5)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = q(xq)
        (y.float() * g).sum().backward()
        return xq.grad, base.weight.grad.clone(), sum(saved)


    gx0, gw0, bytes_hp = grads_and_saved(False)
    gx1, gw1, bytes_q = grads_and_saved(True)
    assert torch.equal(gx0, gx1) and torch.equal(gw0, gw1)
    assert bytes_hp == 256 * 128 * 2  # the bf16 input
    assert bytes_q <= bytes_hp * 0.6  # the FP8 / FP4 column-wise copy and its scales


def test_recipe_registry_and_errors():
    with pytest.raises(ValueError, match="valid recipes: fp32, bf16"):
        fb.get_recipe("fp7")
    with pytest.raises(ValueError, match="valid recipes"):
        fb.QuantizedLinear(8, 8, recipe="int3")
    with pytest.raises(ValueError, match="per-tensor"):
        fb.Recipe("bad", fprop=fb.Gemm(fb.Operand("mxfp4"), fb.Operand("mxfp4")), delayed=fb.DelayedScaling())
    with pytest.raises(ValueError, match="stochastic rounding needs"):
        fb.Operand(None, "stochastic")
    r = fb.get_recipe("nvfp4")
    assert r.wgrad.hadamard.size == 16 and r.dgrad.a.rounding == "stochastic"
    assert r.fprop.b.scheme.block == (16, 16) and r.fprop.a.rounding == "nearest"
    assert fb.get_recipe("fp16").loss_scaling == "dynamic"
    assert fb.get_recipe("fp8_delayed").delayed.history_len == 1024
    assert "Hadamard 32" in str(fb.get_recipe("mxfp4").wgrad)


def test_fast_accumulation_is_asked_for_per_gemm(monkeypatch):
    """The FP8 recipes' forward GEMM accumulates fast and their gradient GEMMs promote to fp32,
    as Transformer Engine and torchao define them; blockwise promotes everywhere. Each GEMM of a
    Linear hands its own flag to scaled_matmul (a user recipe may set it on any GEMM)."""
    import fewerbits.linear as linear

    fast_forward = {"fp8_tensorwise", "fp8_delayed", "fp8_rowwise"}
    for name, r in fb.RECIPES.items():
        want = name in fast_forward
        assert (r.fprop.fast_accum, r.dgrad.fast_accum, r.wgrad.fast_accum) == (want, False, False), name
        assert ("fast accumulation" in str(r.fprop)) == want and "fast" not in str(r.dgrad), name
    with pytest.raises(ValueError, match="fast_accum must be True or False"):
        fb.Gemm(fast_accum="yes")

    seen = []
    real = linear.scaled_matmul

    def record(a, b, **kw):
        seen.append(kw["fast_accum"])
        return real(a, b, **kw)

    monkeypatch.setattr(linear, "scaled_matmul", record)
    e4 = fb.Operand("fp8_e4m3_tensor")
    for recipe, want in ((fb.get_recipe("fp8_tensorwise"), [True, False, False]),
                         (fb.Recipe("acc", fprop=fb.Gemm(e4, e4), dgrad=fb.Gemm(e4, e4, fast_accum=True),
                                    wgrad=fb.Gemm(e4, e4)), [False, True, False])):
        seen.clear()
        layer = fb.QuantizedLinear(64, 32, recipe=recipe)
        layer(torch.randn(16, 64, requires_grad=True)).sum().backward()
        assert seen == want, recipe.name


def test_weight_qat_is_straight_through():
    """The GEMMs see the fake-quantized weight; the master weight gets that gradient as is."""
    recipe = fb.get_recipe("mxfp4_qat_experts").experts
    torch.manual_seed(0)
    layer = nn.Linear(256, 128, bias=False)
    x, g = torch.randn(64, 256), torch.randn(64, 128)
    q = fb.QuantizedLinear.from_linear(layer, dataclasses.replace(recipe, fprop=fb.Gemm(), dgrad=fb.Gemm(), wgrad=fb.Gemm(), compute_dtype=torch.float32))
    xq = x.clone().requires_grad_()
    y = q(xq)
    w_q = fb.fake_quantize(layer.weight.detach(), "mxfp4")
    assert torch.allclose(y, x @ w_q.t(), rtol=1e-5, atol=1e-5)  # forward with Q(W)
    assert not torch.allclose(y, x @ layer.weight.detach().t(), rtol=1e-3, atol=1e-3)
    (y * g).sum().backward()
    assert torch.allclose(layer.weight.grad, g.t() @ x, rtol=1e-5, atol=1e-5)  # straight through
    assert torch.allclose(xq.grad, g @ w_q, rtol=1e-5, atol=1e-5)


def test_user_recipe():
    recipe = fb.Recipe(
        "e5m2_everywhere",
        fprop=fb.Gemm(fb.Operand("fp8_e5m2_tensor"), fb.Operand("fp8_e5m2_tensor")),
        wgrad=fb.Gemm(fb.Operand("mxfp6_e3m2", "stochastic"), fb.Operand("mxfp6_e3m2"), fb.Hadamard(64)),
    )
    layer = fb.QuantizedLinear(64, 32, recipe=recipe)
    x = torch.randn(100, 64, requires_grad=True)
    layer(x).float().sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == (32, 64)
    assert "recipe=e5m2_everywhere" in repr(layer)


def test_native_path_asked_for_on_cpu_names_the_device():
    layer = fb.QuantizedLinear(64, 64, recipe="fp8_tensorwise", native=True)
    with pytest.raises(RuntimeError, match="device cpu .*native=False to emulate"):
        layer(torch.randn(16, 64))
    with pytest.raises(ValueError, match="native must be"):
        fb.QuantizedLinear(64, 64, recipe="fp8_tensorwise", native="yes")


def test_three_dimensional_inputs():
    layer = fb.QuantizedLinear(64, 48, recipe="nvfp4")
    x = torch.randn(2, 50, 64, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 50, 48) and y.dtype == torch.float32
    y.float().sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == torch.float32


def test_cached_weight_is_reused_until_the_weight_changes(monkeypatch):
    import fewerbits.linear as L

    calls = []
    real = L._prepare
    monkeypatch.setattr(L, "_prepare", lambda t, op, *a, **k: (calls.append(t.shape), real(t, op, *a, **k))[1])
    torch.manual_seed(0)
    layer = fb.QuantizedLinear(64, 32, recipe="fp8_tensorwise")
    w_shape = layer.weight.shape
    x = torch.randn(16, 64, requires_grad=True)
    reference = layer(x)
    reference.sum().backward()
    grads = [x.grad.clone(), layer.weight.grad.clone()]
    weight_preps = lambda: sum(s == w_shape for s in calls)  # noqa: E731
    assert weight_preps() == 2  # off by default: fprop and dgrad each prepare the weight
    layer.cache_weight = True
    calls.clear()
    for _ in range(3):  # three micro-batches of one step
        x.grad = layer.weight.grad = None
        out = layer(x)
        out.sum().backward()
        # the same values as without the cache
        assert torch.equal(out, reference) and torch.equal(x.grad, grads[0])
        assert torch.equal(layer.weight.grad, grads[1])
    assert weight_preps() == 1  # once a step, not once per micro-batch: dgrad transposes fprop's codes
    blockwise = fb.QuantizedLinear(300, 200, recipe="fp8_blockwise")  # square blocks: transposed too
    xb = torch.randn(16, 300, requires_grad=True)
    got = []
    for cache in (False, True, True):
        blockwise.cache_weight = cache
        calls.clear()
        xb.grad = None
        blockwise(xb).square().sum().backward()
        got.append((sum(s == blockwise.weight.shape for s in calls), xb.grad))
    assert [n for n, _ in got] == [2, 1, 0]  # uncached; cached, once a step; then reused
    assert torch.equal(got[0][1], got[1][1]) and torch.equal(got[0][1], got[2][1])
    with torch.no_grad():
        layer.weight.mul_(0.5)  # an optimizer step: the version counter moves
    calls.clear()
    changed = layer(x)
    assert weight_preps() == 1 and not torch.equal(changed, reference)
    layer.cache_weight = False
    assert layer._config.weight_cache == {}
    # delayed scaling and stochastic weights are never reused: their definition asks for a fresh cast
    delayed = fb.QuantizedLinear(64, 32, recipe="fp8_delayed")
    delayed.cache_weight = True
    calls.clear()
    delayed(x).sum().backward()
    delayed(x).sum().backward()
    assert weight_preps() == 4


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4"])
def test_prepared_weights_enter_compiled_graphs_as_inputs_without_changing_a_bit(recipe, in_place):
    """prepare_weight quantizes the fprop and dgrad weight operands once, in eager code; a
    compiled graph takes them as inputs (one graph over steps whose weights change), and the
    micro-batches of each step get the bits of eager mode without them. In place, the second
    step's operands are written into the first step's tensors (the addresses CUDA graphs
    recorded); otherwise they are new tensors."""
    from torch._dynamo.utils import counters

    def make():
        torch.manual_seed(0)
        return nn.Sequential(fb.QuantizedLinear(64, 96, recipe=recipe), nn.GELU(),
                             fb.QuantizedLinear(96, 32, recipe=recipe))

    x = torch.randn(2, 16, 64)

    def steps(model, forward, prepare):
        seen, where = [], []
        for _ in range(2):  # two optimizer steps of two micro-batches
            layers = [m for m in model if isinstance(m, fb.QuantizedLinear) and prepare
                      and m.prepare_weight(in_place=in_place)]
            assert len(layers) == (2 if prepare else 0)
            where.append([t.data_ptr() for m in layers for t in m._prepared if t is not None])
            for micro in range(2):
                xx = (x + micro).requires_grad_()
                y = forward(xx)
                y.square().sum().backward()
                seen += [y.detach(), xx.grad]
            for m in layers:
                m.release_weight()
            seen += [p.grad.clone() for p in model.parameters()]
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad)
                    p.grad = None
        assert not prepare or (where[0] == where[1]) == in_place, where
        return seen

    eager = make()
    reference = steps(eager, eager, False)
    model = make()
    torch._dynamo.reset()  # no graph of another parametrization is reused
    compiled = torch.compile(model, backend="aot_eager")
    counters.clear()
    got = steps(model, compiled, True)
    assert all(torch.equal(a, b) for a, b in zip(reference, got)) and len(got) == len(reference)
    assert counters["stats"]["unique_graphs"] == 1  # the new operands of step 2 recompiled nothing
    # the graph multiplies the prepared operands, not the weight: a weight changed behind
    # their back changes nothing compiled, and an eager forward refuses it
    layer = model[0]
    assert layer.prepare_weight()
    before = compiled(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    assert torch.equal(compiled(x), before)
    with pytest.raises(RuntimeError, match="changed after prepare_weight"):
        model(x)
    layer.release_weight()
    assert not torch.equal(model(x), before)


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_delayed", "nvfp4", "fp8_rowwise"])
def test_a_given_weight_amax_changes_no_bit(recipe):
    """set_weight_amax(max |W|, or its columns' for fp8_rowwise's input-gradient weight): the
    forward, both gradients and the delayed-scaling history are those of a layer that finds the
    amax itself; the amax given is the one used (a third of it saturates the largest weights:
    other bits); a weight changed since is read again; a bad amax is refused."""
    torch.manual_seed(0)
    layer = fb.QuantizedLinear(256, 128, recipe=recipe)
    assert layer.uses_weight_amax
    x = torch.randn(64, 256, requires_grad=True)

    def run(amax, give=True):
        torch.manual_seed(1)  # the same stochastic-rounding noise each time
        if give:
            layer.set_weight_amax(amax)
        if layer.delayed_scaling is not None:
            layer.delayed_scaling.amax_history.zero_()
            layer.delayed_scaling.amax.fill_(1.0)
        y = layer(x)
        y.square().sum().backward()
        got = [y.detach(), x.grad, layer.weight.grad]
        if layer.delayed_scaling is not None:
            got.append(layer.delayed_scaling.amax_history.clone())
        x.grad = layer.weight.grad = layer.bias.grad = None
        return got

    same = lambda a, b: all(torch.equal(u, v) for u, v in zip(a, b))  # noqa: E731
    own = run(None)
    dim = layer.weight_amax_dim
    assert dim == (0 if recipe == "fp8_rowwise" else None)
    amax = layer.weight.detach().abs().amax() if dim is None else layer.weight.detach().abs().amax(dim)
    assert same(run(amax), own)
    assert not same(run(amax / 3), own)
    layer.set_weight_amax(amax / 3)
    with torch.no_grad():
        layer.weight.mul_(1.0)  # the version moves: the amax given no longer holds
    assert same(run(None, give=False), own) and layer._weight_amax is None
    with pytest.raises(ValueError, match="set_weight_amax takes (one fp32 value|256 fp32 values)"):
        layer.set_weight_amax(torch.ones(2))
    assert not fb.QuantizedLinear(64, 32, recipe="mxfp8").uses_weight_amax


def test_set_weight_amaxes_gives_every_layer_an_amax():
    """From the optimizer where it has one (AdamW.weight_amax), else by a reduction of the
    weight there: every layer that uses one gets max |W|, and the count says how many came
    from the optimizer."""
    from fewerbits.linear import set_weight_amaxes

    torch.manual_seed(0)
    model = nn.Sequential(fb.QuantizedLinear(64, 96, recipe="fp8_tensorwise"), nn.GELU(),
                          fb.QuantizedLinear(96, 32, recipe="mxfp8"), fb.QuantizedLinear(32, 8, recipe="nvfp4"),
                          fb.QuantizedLinear(8, 16, recipe="fp8_rowwise"))
    given = {(model[0].weight, None): model[0].weight.detach().abs().amax(),
             (model[4].weight, 0): model[4].weight.detach().abs().amax(0)}
    asked = []

    def amax_of(w, dim=None):
        asked.append(dim)
        return given.get((w, dim))

    assert set_weight_amaxes(model, amax_of) == 2 and sorted(asked, key=str) == [0, None, None]
    assert set_weight_amaxes(model) == 0
    for m in (model[0], model[3]):
        assert torch.equal(m._weight_amax, m.weight.detach().abs().amax())
    assert torch.equal(model[4]._weight_amax, model[4].weight.detach().abs().amax(0))
    assert model[2]._weight_amax is None


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_blockwise", "fp8_rowwise", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("special", ["finite", "inf", "nan"])
def test_prepared_dgrad_weights_are_the_quantizers_bits(recipe, special):
    """prepare_weight's two operands are the reference quantizer's bits along each axis, scales
    included: under one scale (fp8_tensorwise) or square 8-bit blocks (fp8_blockwise) the dgrad
    copy is the fprop codes transposed, which must equal quantizing the weight along dim 0, for
    sizes that do not divide the block, an all-zero block, and a weight holding inf or NaN; the
    other recipes quantize it again."""
    torch.manual_seed(0)
    layer = fb.QuantizedLinear(300, 200, recipe=recipe)  # weight (200, 300): ragged 128x128 blocks
    with torch.no_grad():
        layer.weight[:128, 128:256] = 0.0
        layer.weight.mul_(torch.logspace(-3, 3, 300))  # blocks of other scales
        if special != "finite":
            layer.weight[150, 7] = float(special)
    assert layer.prepare_weight()
    W, r = layer.weight.detach(), layer.recipe
    for q, op, axis in zip(layer._config.prepared, (r.fprop.b, r.dgrad.b), (1, 0)):
        data, scale, tensor_scale = layer._prepared[:3] if axis == 1 else layer._prepared[3:]
        want = fb.quantize(W, op.scheme, axis=axis)
        assert q.axis == want.axis and q.shape == want.shape and q.scheme == want.scheme
        assert torch.equal(data.view(torch.uint8), want.data.view(torch.uint8)), (axis, op.scheme)
        assert torch.equal(scale.view(torch.uint8), want.scale.view(torch.uint8)), (axis, op.scheme)
        assert (tensor_scale is None) == (want.tensor_scale is None)
        assert tensor_scale is None or torch.equal(tensor_scale, want.tensor_scale)


def test_prepare_weight_refuses_weights_that_are_not_reused():
    """Delayed scaling without micro_batches (the amax history moves with every cast) and an
    unquantized weight operand leave nothing to prepare; micro_batches must be a positive int."""
    for recipe in ("fp8_delayed", "bf16"):
        layer = fb.QuantizedLinear(64, 32, recipe=recipe)
        assert not layer.prepare_weight() and layer._prepared == ()
    layer = fb.QuantizedLinear(64, 32, recipe="fp8_delayed")
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(ValueError, match="micro_batches must be a positive int"):
            layer.prepare_weight(micro_batches=bad)
    assert layer.delayed_scaling.amax_history.abs().sum() == 0  # nothing recorded by a refusal


@pytest.mark.parametrize("recipe", ["fp8_delayed", "fp8_blockwise"])
def test_compiled_preparation_gives_the_eager_preparations_bytes(recipe):
    """prepare_weights(compiled=True) makes every layer's weight operands in one function that
    inductor compiles: the bytes of the eager preparation, layer by layer — operands, scales,
    and under delayed scaling (three micro-batches) every history and amax — over three steps
    whose weights change (ragged 128x128 blocks, an all-zero block, then a NaN), in place: the
    later steps' operands written into the first step's tensors. The second step recompiles
    nothing; the third finds one layer's given amax stale (its weight changed since), which the
    compiled preparation drops, as the eager one does, rather than quantize by it."""
    from torch._dynamo.utils import counters

    from fewerbits.linear import prepare_weights, set_weight_amaxes

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(fb.QuantizedLinear(300, 200, recipe=recipe), fb.QuantizedLinear(200, 64, recipe=recipe))
        with torch.no_grad():
            model[0].weight[:128, 128:256] = 0.0
            model[0].weight.mul_(torch.logspace(-3, 3, 300))
        return model

    def steps(model, compiled):
        seen, where = [], []
        n = 3 if recipe == "fp8_delayed" else None
        for step in range(3):
            if step < 2:
                set_weight_amaxes(model)
            layers = prepare_weights(model, in_place=True, micro_batches=n, compiled=compiled)
            assert layers == list(model)
            where.append([t.data_ptr() for m in layers for t in m._prepared if t is not None])
            # operands and scales as bytes; histories and amaxes as numbers (a NaN amax's sign
            # bit is the reduction's: a NaN either way)
            seen += [t.reshape(-1).view(torch.uint8).clone() for m in layers for t in m._prepared if t is not None]
            seen += [b.clone() for m in layers if m.delayed_scaling is not None
                     for b in (m.delayed_scaling.amax_history, m.delayed_scaling.amax)]
            for m in layers:
                m.release_weight()
            with torch.no_grad():
                model[1].weight.mul_(1.5)
                model[1].weight[3, 5] = float("nan")
        assert where[0] == where[1] == where[2]
        return seen

    reference = steps(make(), False)
    torch._dynamo.reset()
    counters.clear()
    model = make()
    got = steps(model, True)
    # a graph again for the third step only where a layer's quantizer takes a given amax
    assert counters["stats"]["unique_graphs"] == 1 + any(m.uses_weight_amax for m in model)
    assert len(got) == len(reference)
    assert all(a.dtype == b.dtype and a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
               for a, b in zip(reference, got))


@pytest.mark.parametrize("compiled", [False, True])
def test_delayed_scaling_quantizes_a_weight_once_for_a_steps_micro_batches(compiled):
    """prepare_weight(micro_batches=n) under delayed scaling serves the step's micro-batches as
    Transformer Engine's is_first_microbatch does: every micro-batch multiplies the weight
    quantized with the amax the first one would use, and the weight's amax history gets the
    weight's amax for the first micro-batch and 0 for each later one. The reference is the
    unprepared layer told so by hand (the first micro-batch's weight amax restored before each
    later forward, a 0 recorded for its weight); outputs, both gradients, every history and
    amax are its bits over two steps of three micro-batches, eagerly and compiled (one graph
    over both steps)."""
    from torch._dynamo.utils import counters

    from fewerbits.linear import DelayedScalingState

    def make():
        torch.manual_seed(0)
        return nn.Sequential(fb.QuantizedLinear(64, 96, recipe="fp8_delayed"), nn.GELU(),
                             fb.QuantizedLinear(96, 32, recipe="fp8_delayed"))

    x = torch.randn(2, 16, 64)
    scales = (1.0, 30.0, 0.05)  # the inputs' amaxes move from one micro-batch to the next

    def steps(model, forward, prepare):
        seen = []
        layers = [m for m in model if isinstance(m, fb.QuantizedLinear)]
        for step in range(2):
            if prepare:
                assert all(m.prepare_weight(micro_batches=len(scales)) for m in layers)
            first = [m.delayed_scaling.amax[1].clone() for m in layers]
            for micro, s in enumerate(scales):
                if not prepare and micro > 0:  # the reference: the first micro-batch's weight amax,
                    for m, a in zip(layers, first):  # and a 0 recorded for the weight
                        m.delayed_scaling.amax[1] = a
                        real = DelayedScalingState.record.__get__(m.delayed_scaling)
                        m.delayed_scaling.record = (lambda role, t, amax=None, real=real:
                                                    real(role, t, torch.zeros(()) if role == "weight" else amax))
                xx = (x * s).requires_grad_()
                y = forward(xx)
                y.square().sum().backward()
                for m in layers:
                    m.delayed_scaling.__dict__.pop("record", None)
                seen += [y.detach(), xx.grad]
            for m in layers:
                m.release_weight()
            seen += [p.grad.clone() for p in model.parameters()]
            seen += [t.clone() for m in layers for t in (m.delayed_scaling.amax_history, m.delayed_scaling.amax)]
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad * (step + 1))
                    p.grad = None
        return seen

    eager = make()
    reference = steps(eager, eager, False)
    model = make()
    forward = model
    if compiled:
        torch._dynamo.reset()
        forward = torch.compile(model, backend="aot_eager")
        counters.clear()
    got = steps(model, forward, True)
    assert len(got) == len(reference) and all(torch.equal(a, b) for a, b in zip(reference, got))
    if compiled:
        assert counters["stats"]["unique_graphs"] == 1
    # the weight's history: per step its amax, then two zeros; the input's: an amax a micro-batch
    history = model[0].delayed_scaling.amax_history
    assert (history[1] > 0).sum() == 2 and (history[0] > 0).sum() == 6
    # a plain forward (nothing prepared) records the weight's amax again
    model[0](x).sum().backward()
    assert (history[1] > 0).sum() == 3


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "mxfp4", "nvfp4", "bf16"])
def test_linears_reading_one_tensor_share_its_quantization(recipe, monkeypatch):
    """q/k/v (and gate/up) read one input: it is quantized once for the forward GEMMs and once
    for the weight-gradient GEMMs, with the same bits as quantizing it per Linear."""
    import fewerbits.linear as L
    from fewerbits.models import Llama, get_preset
    from fewerbits.train.precision import apply_recipe

    calls = []
    real = L._prepare
    monkeypatch.setattr(L, "_prepare", lambda t, *a, **k: (calls.append(1), real(t, *a, **k))[1])

    def run(shared: bool):
        L.share_operands(shared)
        torch.manual_seed(0)
        model = Llama(get_preset("tiny", 256))
        apply_recipe(model, recipe)
        x = torch.randint(0, 256, (2, 32))
        calls.clear()
        torch.manual_seed(1)  # the same stochastic-rounding draws in both runs
        out = model(x)
        out.float().sum().backward()
        return out, [p.grad for p in model.parameters()], len(calls)

    try:
        out_a, grads_a, n_shared = run(True)
        out_b, grads_b, n_each = run(False)
    finally:
        L.share_operands(True)
    assert torch.equal(out_a, out_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    layers = 4  # per block: k, v and up reuse the forward input; k, v and up (or q, k and gate) the wgrad one
    # (per-tensor FP8 makes its wgrad input operand by transposing the forward codes either way)
    assert n_each - n_shared == layers * 3 * (1 if recipe == "fp8_tensorwise" else 2)


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_delayed"])
def test_per_tensor_codes_are_transposed_not_quantized_again(recipe, monkeypatch):
    """One scale per tensor: the weight-gradient GEMM's operands are the input-gradient and
    forward GEMMs' codes transposed — the same bits as quantizing column-wise, fewer passes,
    and the layer saves its input's FP8 codes (one byte per element) instead of the input."""
    import fewerbits.linear as L
    from fewerbits.models import Llama, get_preset
    from fewerbits.train.precision import apply_recipe

    calls = []
    real = L._prepare
    monkeypatch.setattr(L, "_prepare", lambda t, *a, **k: (calls.append(1), real(t, *a, **k))[1])

    def run():
        torch.manual_seed(0)
        model = Llama(get_preset("tiny", 256))
        apply_recipe(model, recipe)
        x = torch.randint(0, 256, (2, 32))
        calls.clear()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.dtype), t)[1], lambda t: t):
            out = model(x)
        out.float().sum().backward()
        return out, [p.grad for p in model.parameters()], model.state_dict(), len(calls), saved

    out_a, grads_a, state_a, n_a, saved_a = run()
    monkeypatch.setattr(L, "_transposable", lambda *a: False)
    out_b, grads_b, state_b, n_b, saved_b = run()
    assert torch.equal(out_a, out_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)  # amax histories too
    # per block: grad_output is not quantized again in 7 Linears, nor the input: in 4 places
    # under tensorwise scaling (q/k/v and gate/up share their column-wise input either way), in
    # 7 under delayed scaling (an amax override is never shared)
    linears = 4 * 7
    assert n_b - n_a == 4 * (7 + (4 if recipe == "fp8_tensorwise" else 7))
    assert saved_a.count(torch.uint8) == saved_b.count(torch.uint8) + linears


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4", "mxfp6"])
def test_emulated_gemms_multiply_values_made_without_codes(recipe, monkeypatch):
    """On the Triton backend an emulated GEMM's fresh operands come from one kernel as bf16
    values (no codes stored and read back): outputs and gradients are the same bits as
    quantize-then-dequantize, with weight caching and saved quantized inputs too. (Triton's
    interpreter on a CPU: a small model.)"""
    import fewerbits.linear as L
    from fewerbits import kernels

    made = []
    real = kernels.quantized_values
    monkeypatch.setattr(kernels, "quantized_values", lambda *a, **k: (made.append(1), real(*a, **k))[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(48, 64, generator=torch.Generator().manual_seed(2)).to(device)
    x[3, :4] *= 40  # an outlier row

    def run(save_quantized, cache):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64)).to(device)
        fb.convert(model, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0,
                                                   save_quantized_input=save_quantized))
        for m in model.modules():
            if isinstance(m, fb.QuantizedLinear):
                m.cache_weight = cache
        torch.manual_seed(1)  # the same stochastic-rounding draws in both runs
        xr = x.clone().requires_grad_()
        out = model(xr)
        out.float().square().sum().backward()
        return out, [xr.grad] + [p.grad for p in model.parameters()]

    from fewerbits.kernels import rowblock

    given = []  # per values kernel of a two-level scheme: whether its tensor amax was given
    real_rowblocks = rowblock.quantize_rowblocks
    monkeypatch.setattr(rowblock, "quantize_rowblocks", lambda X, scheme, *a, **k: (
        given.append(k.get("tensor_amax") is not None) if scheme.two_level and k.get("values") else None,
        real_rowblocks(X, scheme, *a, **k))[1])
    kernels.set_backend("triton")
    try:
        for save_quantized, cache in ((False, False), (True, True)):
            made.clear()
            given.clear()
            out_a, grads_a = run(save_quantized, cache)
            assert made  # the values path ran
            if recipe == "nvfp4" and not save_quantized:  # the two amaxes of each input and gradient
                # (48 rows: whole blocks of the transform) served the four GEMM operands made from
                # them; the weights find their own (once: dgrad multiplies fprop's values)
                assert sorted(given) == [False] * 2 + [True] * 8
                given.clear()
                with torch.no_grad():  # no backward follows: no transformed amax to find
                    run_forward = nn.Sequential(nn.Linear(64, 96)).to(device)
                    fb.convert(run_forward, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
                    run_forward(x)
                assert given == [False, False]  # the input and the weight, each finding its own
            with monkeypatch.context() as m:
                m.setattr(L, "_as_values", lambda *a: False)
                out_b, grads_b = run(save_quantized, cache)
            assert torch.equal(out_a, out_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    finally:
        kernels.set_backend("auto")


def test_square_block_weights_are_quantized_once_for_both_gemms(monkeypatch):
    """NVFP4's 16x16-block weights: the input-gradient GEMM multiplies the forward's values
    transposed instead of quantizing the weight again — the same bits (a square block read
    either way is the same block, with the same amax, scale and tensor amax; edges that do not
    fill a block too), one quantization fewer per Linear, and the bf16 values kept for
    backward; `recompute_weight_values` quantizes again instead, keeping nothing. (Triton's
    interpreter on a CPU: a small model.)"""
    import fewerbits.linear as L
    from fewerbits import kernels

    nv = fb.get_recipe("nvfp4")
    assert L._square_transposable(nv.fprop.b, nv.fprop, nv.dgrad.b, nv.dgrad)
    mx = fb.get_recipe("mxfp4")
    assert not L._square_transposable(mx.fprop.b, mx.fprop, mx.dgrad.b, mx.dgrad)  # 1 x 32 blocks
    hadamard = dataclasses.replace(nv.dgrad, hadamard=fb.Hadamard(16))
    assert not L._square_transposable(nv.fprop.b, nv.fprop, nv.dgrad.b, hadamard)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    made = []
    real = kernels.quantized_values
    monkeypatch.setattr(kernels, "quantized_values", lambda *a, **k: (made.append(1), real(*a, **k))[1])
    x = torch.randn(40, 70, generator=torch.Generator().manual_seed(3)).to(device)

    def run(recompute=False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(70, 50), nn.GELU(), nn.Linear(50, 36)).to(device)
        fb.convert(model, "nvfp4", policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0,
                                                    recompute_weight_values=recompute))
        torch.manual_seed(1)  # the same stochastic-rounding draws in both runs
        xr = x.clone().requires_grad_()
        made.clear()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append((t.dtype, tuple(t.shape))), t)[1],
                                                      lambda t: t):
            out = model(xr)
        out.float().square().sum().backward()
        return out, [xr.grad] + [p.grad for p in model.parameters()], len(made), saved

    kernels.set_backend("triton")
    try:
        w = torch.randn(50, 70, generator=torch.Generator().manual_seed(4)).to(device)
        rows, ts_rows = kernels.quantized_values(w, "nvfp4_16x16", axis=1)
        cols, ts_cols = kernels.quantized_values(w, "nvfp4_16x16", axis=0)
        assert torch.equal(cols.view(torch.int16), rows.t().view(torch.int16)) and torch.equal(ts_rows, ts_cols)
        out_a, grads_a, n_a, saved_a = run()
        with monkeypatch.context() as m:
            m.setattr(L, "_square_transposable", lambda *a: False)
            out_b, grads_b, n_b, saved_b = run()
        out_c, grads_c, n_c, saved_c = run(recompute=True)  # the option that asks for that
    finally:
        kernels.set_backend("auto")
    assert torch.equal(out_a, out_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    assert torch.equal(out_a, out_c) and all(torch.equal(a, c) for a, c in zip(grads_a, grads_c))
    assert n_b - n_a == 2 and n_c == n_b and saved_c == saved_b  # dgrad's weight, in each Linear
    held = collections.Counter(saved_a)
    held.subtract(saved_b)
    assert +held == collections.Counter([(torch.bfloat16, (50, 70)), (torch.bfloat16, (36, 50))]
                                        + [(torch.float32, ())] * 2)  # and the tensor scales


class _Attention(nn.Module):
    """q, k and v read one tensor unless `memory` is given (cross-attention: k and v read it),
    then a gate/up pair reads the mix h, and so does `twice`, which also reads x: a Linear
    called two times a forward, which no group may take."""

    def __init__(self, recipe="fp8_delayed"):
        super().__init__()
        make = lambda i, o: fb.QuantizedLinear(i, o, recipe=recipe)  # noqa: E731
        self.q, self.k, self.v, self.o = make(32, 32), make(32, 16), make(32, 16), make(32, 32)
        self.gate, self.up, self.twice = make(32, 48), make(32, 48), make(32, 48)

    def forward(self, x, memory=None):
        kv = x if memory is None else memory
        h = self.o(torch.cat([self.q(x)[..., :16] + self.k(kv), self.v(kv)], -1))
        return torch.relu(self.gate(h)) * self.up(h) + self.twice(h) + self.twice(x)


def _steps(model, xs, memory=None, compiled=None):
    """Train on each x in turn (sum of squares, SGD): losses, gradients, histories and amaxes."""
    out = []
    run = model if compiled is None else compiled
    for x in xs:
        loss = run(x, memory).float().square().sum()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                out.append(p.grad.clone())
                p -= 1e-3 * p.grad
                p.grad = None
        out.append(loss.detach())
    for m in model.modules():
        if isinstance(m, fb.QuantizedLinear):
            out += [m.delayed_scaling.amax_history.clone(), m.delayed_scaling.amax.clone()]
    return out


def test_linears_reading_one_tensor_share_its_delayed_input_scale_with_unshared_bits():
    """`share_input_scales` groups the delayed-scaling Linears that read one tensor in a watched
    forward — q/k/v and gate/up; cross-attention's k/v without q; never a Linear called twice —
    and the shared model trains with unshared scaling's bits (outputs, gradients, every history
    and amax), eagerly over steps whose amaxes change, and compiled, where its forward casts
    each shared tensor once. A member whose history differs keeps its own."""
    from fewerbits.linear import share_input_scales

    torch.manual_seed(0)
    xs = [torch.randn(6, 32) * s for s in (1.0, 40.0, 0.01, 3.0)]
    plain = _Attention()
    shared = _Attention()
    shared.load_state_dict(plain.state_dict())
    assert share_input_scales(shared, xs[0]) == [["q", "k", "v"], ["gate", "up"]]
    assert all(torch.equal(a, b) for a, b in zip(_steps(shared, xs), _steps(plain, xs)))
    # cross-attention: k and v read the memory, q reads x alone (its own scale, found afresh)
    assert share_input_scales(shared, xs[0], torch.randn(6, 32)) == [["k", "v"], ["gate", "up"]]
    assert shared.q._config.input_state is shared.q.delayed_scaling
    assert share_input_scales(shared, xs[0]) == [["q", "k", "v"], ["gate", "up"]]
    assert shared.q._config.input_state is shared.v.delayed_scaling
    # compiled: the same bits as the unshared model compiled, and one cast of x for q/k/v and
    # one of h for gate/up where there were three and two (the forward makes 3 fewer code buffers)
    from torch._inductor.utils import run_and_get_code

    more = [torch.randn(6, 32) * s for s in (5.0, 0.1)]
    twin = _Attention()
    twin.load_state_dict(shared.state_dict())  # the same histories, not shared
    code_buffers, results = [], []
    torch._dynamo.reset()
    try:
        for model in (shared, twin):
            compiled = fb.compile_model(model)
            _, codes = run_and_get_code(lambda: compiled(more[0]))  # noqa: B023 (records, as both do)
            code_buffers.append(codes[0].count("torch.uint8)"))
            results.append(_steps(model, more, compiled=compiled))
    finally:
        torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert code_buffers[1] - code_buffers[0] == 3, code_buffers
    shared.k.delayed_scaling.amax_history[0, 3] += 1.0
    assert share_input_scales(shared, xs[0]) == [["gate", "up"]]
