"""quantize / dequantize against the independent oracle, worked examples, edge cases, errors."""

import math
import sys
from dataclasses import replace
import numpy as np
import pytest
import torch

from fewerbits import (
    SCHEMES,
    QuantizedTensor,
    Scheme,
    decode,
    fake_quantize,
    get_scheme,
    quantize,
    quantized_nbytes,
)
from fewerbits.codes import unpack
from conftest import ORACLE, assert_same_bits
from oracle import quantize_oracle

MX = [n for n, s in SCHEMES.items() if s.scale_fmt.name == "e8m0"]
FP32_SCALED = [n for n, s in SCHEMES.items() if s.scale_fmt.name == "fp32"]
BLOCK_LOCAL = [n for n, s in SCHEMES.items() if s.block != (-1, -1)]


def hard_matrix(rows: int, cols: int, seed: int = 0, specials: bool = True) -> np.ndarray:
    """Gaussian rows at scales 2^-30 … 2^30, zero blocks, tiny and huge values, NaN and inf."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.ldexp(1.0, rng.integers(-30, 31, (rows, 1)))
    x[0, :] = 0.0  # an all-zero row: zero blocks for every 1-row scheme
    x[1, :5] = [448.0, 464.0, -3.5, 6.0, 1e-40]
    x[2, :] *= 1e-38  # subnormal-range values
    x[3:19, 16:48] = 0.0  # zero blocks for 2-D schemes
    if specials:
        x[4, 3], x[5, 40] = np.nan, -np.inf
    return x.astype(np.float32)


def case_list():
    cases = []
    for name, s in SCHEMES.items():
        rules = ("floor", "rceil", "ceil", "even") if name in MX else (s.scale_rule,)
        if name in FP32_SCALED:
            rules = ("amax", "rceil", "floor")
        cases += [(name, r) for r in rules]
    return cases


@pytest.mark.parametrize("name, rule", case_list())
@pytest.mark.parametrize("shape", [(37, 100), (130, 260)])
def test_matches_independent_oracle(name, rule, shape):
    scheme = get_scheme(name, rule)
    x = hard_matrix(*shape, specials=name in BLOCK_LOCAL)
    expected, scales, tensor_scale = quantize_oracle(x, scheme)
    q = quantize(torch.from_numpy(x), scheme)
    assert_same_bits(q.block_scales(), scales)
    assert_same_bits(q.dequantize(), expected, x)
    if scheme.two_level:
        assert_same_bits(q.tensor_scale, np.float32(tensor_scale))


@pytest.mark.parametrize(
    "scheme",
    [Scheme("fp8_e5m2", (1, 64), "e8m0", "rceil"), Scheme("fp6_e3m2", (8, 8), "fp32"),
     Scheme("fp4_e2m1", (1, 32), "fp8_e4m3"), Scheme("int8", (1, -1), "fp32"),
     Scheme("int4", (1, 32), "e8m0", "floor")],
    ids=lambda s: s.describe(),
)
def test_user_schemes_match_oracle(scheme):
    x = hard_matrix(40, 96, seed=3, specials=scheme.block != (1, -1))
    expected, scales, _ = quantize_oracle(x, scheme)
    q = quantize(torch.from_numpy(x), scheme)
    assert_same_bits(q.block_scales(), scales)
    assert_same_bits(q.dequantize(), expected, x)


# -- worked examples ---------------------------------------------------------------------------


def mx_block(amax_value: float, n: int = 32) -> torch.Tensor:
    x = torch.zeros(1, n)
    x[0, 0] = amax_value
    return x


@pytest.mark.parametrize(
    "rule, scale, element, value",
    [("floor", 0.5, 6.0, 3.0),  # 3.5 / 0.5 = 7 > 6: saturates
     ("rceil", 1.0, 4.0, 4.0),  # 3.5 / 1 = 3.5: a tie between 3 and 4, to the even code
     ("ceil", 1.0, 4.0, 4.0),  # 2^(ceil(log2 3.5) - 2) = 1
     ("even", 1.0, 4.0, 4.0)],  # 3.5 rounds to 4 at one mantissa bit; 2^(2 - 2) = 1
)
def test_mxfp4_amax_3_5(rule, scale, element, value):
    q = quantize(mx_block(3.5), "mxfp4", scale_rule=rule)
    assert q.block_scales().item() == scale
    assert decode(q.codes(), "fp4_e2m1")[0, 0].item() == element
    assert q.dequantize()[0, 0].item() == value


@pytest.mark.parametrize(
    "rule, exponent", [("floor", 0), ("ceil", 1), ("even", 1), ("rceil", 1)]
)
def test_mxfp8_amax_500(rule, exponent):
    """floor: 2^(8 - 8) = 1 and 500 saturates to 448; the other rules pick 2 (500 → 250 → 256)."""
    q = quantize(mx_block(500.0), "mxfp8_e4m3", scale_rule=rule)
    assert q.scale.item() == 127 + exponent  # the E8M0 code
    assert q.dequantize()[0, 0].item() == (448.0 if exponent == 0 else 512.0)


def test_mx_rule_boundaries():
    # amax exactly max · 2^k: rceil gives 2^k (nothing saturates), floor gives 2^(k-1)·… too
    assert quantize(mx_block(448.0), "mxfp8_e4m3", scale_rule="rceil").block_scales().item() == 1
    assert quantize(mx_block(449.0), "mxfp8_e4m3", scale_rule="rceil").block_scales().item() == 2
    assert quantize(mx_block(511.9), "mxfp8_e4m3", scale_rule="floor").block_scales().item() == 1
    assert quantize(mx_block(512.0), "mxfp8_e4m3", scale_rule="floor").block_scales().item() == 2
    assert quantize(mx_block(6.0), "mxfp4", scale_rule="rceil").block_scales().item() == 1
    # floor never raises the scale for small amax: the block max lands in the top binade
    q = quantize(mx_block(0.75), "mxfp4")
    assert q.block_scales().item() == 2.0**-3 and q.dequantize()[0, 0].item() == 0.75


@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"])
def test_rceil_fp32_product_is_exact_at_powers_of_two(elem):
    """amax = max · 2^k gives exactly 2^k, though amax × fp32(1/max) is computed in fp32."""
    from fewerbits import FORMATS
    from fewerbits.scaling import pow2_exponent

    fmt = FORMATS[elem]
    ks = torch.arange(-120, 120)
    amax = (fmt.max * torch.exp2(ks.double())).float()
    ks, amax = ks[torch.isfinite(amax)], amax[torch.isfinite(amax)]
    assert torch.equal(pow2_exponent(amax, fmt, "rceil"), ks)
    above = torch.nextafter(amax, torch.tensor(float("inf")))
    assert torch.equal(pow2_exponent(above, fmt, "rceil"), ks + 1)


def test_nvfp4_two_level_worked_example():
    """Tensor amax 10, one block with amax 3 (DESIGN.md §3, Transformer Engine's arithmetic).

    s_enc = 2688 / 10 = 268.8; the block scale 3 · 268.8 / 6 = 134.4 rounds to E4M3 128 (the
    E4M3 grid steps by 16 between 128 and 256); elements are scaled by 1 / (128 · (1 / 268.8))
    = 2.1 and rounded to E2M1. The second block holds the tensor amax: its scale is 448.
    """
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 16] = 3.0, -1.0, 10.0
    q = quantize(x, "nvfp4")
    f32 = np.float32
    s_enc = f32(2688) / f32(10)
    assert q.tensor_scale.item() == f32(1) / s_enc
    assert q.block_scales().tolist() == [[128.0, 448.0]]
    enc = f32(1) / (f32(128) * (f32(1) / s_enc))
    assert abs(float(enc) - 2.1) < 1e-5
    codes = decode(q.codes(), "fp4_e2m1")[0]
    assert codes[0].item() == 6.0  # 3 · 2.1 = 6.3 saturates to 6
    assert codes[1].item() == -2.0  # −2.1 → −2
    assert codes[16].item() == 6.0  # the tensor max lands on 6 · 448
    deq = q.dequantize()[0]
    assert deq[0].item() == (f32(6) * f32(128)) * (f32(1) / s_enc)  # 2.857: 3 lost 5%
    assert abs(deq[16].item() - 10.0) < 1e-5


def test_nvfp4_16x16_blocks_span_rows():
    """(0, 0) and (15, 15) share a 16x16 block: the 8 there sets the scale that 1 must use."""
    x = torch.zeros(32, 32)
    x[0, 0], x[15, 15], x[16, 16] = 1.0, 8.0, 2.0
    q2d = quantize(x, "nvfp4_16x16")
    assert q2d.scale.shape == (2, 2)
    assert q2d.dequantize()[0, 0].item() != 1.0  # 1 · 6/8 = 0.75 is not on the E2M1 grid
    assert q2d.block_scales()[0, 1].item() == 0.0 and q2d.block_scales()[1, 0].item() == 0.0
    q1d = quantize(x, "nvfp4")  # row 0 is its own block: its amax 1 maps exactly onto 6
    assert q1d.scale.shape == (32, 2) and q1d.dequantize()[0, 0].item() == 1.0


def test_power_of_two_fp32_scales():
    x = torch.randn(8, 64) * 37
    q = quantize(x, "fp8_e4m3_row", scale_rule="rceil")
    s = q.block_scales()
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))
    assert (x.abs().amax(1, keepdim=True) / s <= 448).all()  # rceil never saturates
    plain = quantize(x, "fp8_e4m3_row").block_scales()
    assert torch.equal(plain, (x.abs().amax(1, keepdim=True) / 448).float())


# -- edge cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEMES))
def test_all_zero_gives_smallest_scale_and_stays_zero(name):
    q = quantize(torch.zeros(20, 50), name)
    assert torch.equal(q.dequantize(), torch.zeros(20, 50))
    smallest = {"fp32": 2.0**-126, "e8m0": 2.0**-127, "fp8_e4m3": 0.0}[q.scheme.scale_fmt.name]
    assert (q.block_scales() == smallest).all()
    if q.scheme.two_level:
        assert q.tensor_scale.item() == 1.0  # s_enc falls back to 1 for an all-zero tensor


@pytest.mark.parametrize("name", BLOCK_LOCAL)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_poisons_its_block_only(name, bad):
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    x[5, 7] = bad
    q = quantize(x, name)
    deq = q.dequantize()
    br, bc = (n if b == -1 else b for b, n in zip(q.scheme.block, x.shape))
    nan_block = torch.zeros_like(x, dtype=torch.bool)
    nan_block[5 // br * br:(5 // br + 1) * br, 7 // bc * bc:(7 // bc + 1) * bc] = True
    assert torch.isnan(deq[nan_block]).all()
    assert torch.isfinite(deq[~nan_block]).all()
    assert torch.isnan(q.block_scales()).sum() == 1


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor"])
def test_nan_in_per_tensor_scheme_gives_nan_everywhere(name):
    x = torch.randn(16, 16)
    x[3, 3] = float("nan")
    assert torch.isnan(fake_quantize(x, name)).all()


@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("shape", [(0, 32), (5, 0), (0,), (17,), (3, 5, 33), ()])
def test_shapes_round_trip(name, shape):
    x = torch.randn(shape)
    q = quantize(x, name)
    deq = q.dequantize()
    assert deq.shape == x.shape and deq.dtype == torch.float32
    if x.numel():
        flat = quantize(x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1), name)
        assert torch.equal(deq.reshape(-1), flat.dequantize().reshape(-1))


@pytest.mark.parametrize("name", list(SCHEMES))
def test_non_contiguous_input(name):
    x = torch.randn(96, 200)
    a = quantize(x.t(), name)
    b = quantize(x.t().contiguous(), name)
    assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_column_wise_copy_without_transposing(name):
    """axis=0 quantizes along the rows' direction: the copy a backward GEMM needs."""
    x = torch.randn(100, 72)
    col = quantize(x, name, axis=0)
    ref = quantize(x.t().contiguous(), name)
    assert torch.equal(col.data, ref.data) and torch.equal(col.scale, ref.scale)
    assert col.dequantize().shape == x.shape
    assert torch.equal(col.dequantize(), ref.dequantize().t())
    assert col.matrix_shape == (72, 100)


def test_axis_on_nd_tensors():
    x = torch.randn(4, 6, 64)
    a = quantize(x, "mxfp8_e4m3", axis=1)
    b = quantize(x.movedim(1, -1).contiguous(), "mxfp8_e4m3")
    assert torch.equal(a.data, b.data)
    assert torch.equal(a.dequantize(), b.dequantize().movedim(-1, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_input_dtypes(dtype):
    x = torch.randn(32, 64)
    q = quantize(x.to(dtype), "mxfp4")
    assert torch.equal(q.data, quantize(x.to(dtype).float(), "mxfp4").data)
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(SCHEMES))
def test_fake_quantize_is_quantize_then_dequantize(name):
    x = torch.randn(33, 70)
    assert torch.equal(fake_quantize(x, name), quantize(x, name).dequantize())
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = fake_quantize(x, name, rounding="stochastic", generator=g1, dtype=torch.bfloat16)
    b = quantize(x, name, rounding="stochastic", generator=g2).dequantize(torch.bfloat16)
    assert torch.equal(a, b)


# -- storage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEMES))
@pytest.mark.parametrize("shape", [(256, 512), (37, 100)])
def test_true_size_in_bytes(name, shape):
    q = quantize(torch.randn(shape), name)
    assert isinstance(q, QuantizedTensor)
    extra = 4 if q.scheme.two_level else 0
    assert q.nbytes == q.data.nbytes + q.scale.nbytes + extra == quantized_nbytes(shape, name)
    assert q.data.dtype == torch.uint8


def test_sizes_of_a_4096_square():
    n = 4096 * 4096
    assert quantized_nbytes((4096, 4096), "mxfp4") == n // 2 + n // 32
    assert quantized_nbytes((4096, 4096), "nvfp4") == n // 2 + n // 16 + 4
    assert quantized_nbytes((4096, 4096), "mxfp6_e2m3") == n * 3 // 4 + n // 32
    assert quantized_nbytes((4096, 4096), "fp8_e4m3_1x128") == n + n // 128 * 4
    assert quantized_nbytes((4096, 4096), "fp8_e4m3_128x128") == n + n // 128 // 128 * 4
    assert quantized_nbytes((4096, 4096), "fp8_e4m3_tensor") == n + 4


def test_repr_names_the_scheme():
    assert "mxfp4" in repr(quantize(torch.randn(4, 32), "mxfp4"))


# -- bad input -----------------------------------------------------------------------------------


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(ValueError, match="valid schemes: fp8_e4m3_tensor.*nvfp4_16x16"):
        quantize(torch.randn(4, 4), "mxfp5")


def test_type_errors():
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(4, 4, dtype=torch.int32), "mxfp4")
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(4, 4, dtype=torch.complex64), "mxfp4")
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize(np.ones((4, 4)), "mxfp4")


def test_bad_scheme_arguments():
    with pytest.raises(ValueError, match="unknown scale rule"):
        quantize(torch.randn(4, 32), "mxfp4", scale_rule="round")
    with pytest.raises(ValueError, match="power-of-two rule"):
        quantize(torch.randn(4, 32), "mxfp4", scale_rule="amax")
    with pytest.raises(ValueError, match="NVFP4 rule"):
        quantize(torch.randn(4, 32), "nvfp4", scale_rule="floor")
    with pytest.raises(ValueError, match="unknown rounding"):
        quantize(torch.randn(4, 32), "mxfp4", rounding="truncate")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        quantize(torch.randn(4, 32), "mxfp4", axis=2)
    with pytest.raises(ValueError, match="scale format must be"):
        Scheme("fp8_e4m3", (1, 32), "bf16")
    with pytest.raises(ValueError, match="block must be"):
        Scheme("fp8_e4m3", (0, 32))
    with pytest.raises(ValueError, match="element format"):
        Scheme("bf16", (1, 32))
    with pytest.raises(ValueError, match="unknown format"):
        Scheme("fp8_e4m4", (1, 32))


def test_scheme_objects_are_frozen_and_described():
    s = SCHEMES["mxfp8_e4m3"]
    assert s.describe() == "fp8_e4m3, 1x32 blocks, e8m0 scales (floor)"
    assert s.with_rule("rceil").scale_rule == "rceil" and s.scale_rule == "floor"
    with pytest.raises(Exception):
        s.block = (1, 16)


@pytest.mark.parametrize("maximum", sorted({s.elem.max for s in SCHEMES.values()}))
def test_a_compiled_scale_division_is_correctly_rounded(maximum):
    """amax / max_elem as compiled graphs compute it (divide_by_constant: an fp64 quotient, or,
    where inductor rewrites the division on a GPU, the product with fp64(1/max)), rounded once to
    fp32, equals eager mode's correctly rounded fp32 division, for amaxes in every binade."""
    from fewerbits.scaling import divide_by_constant

    gen = torch.Generator().manual_seed(0)
    significands = torch.randint(1 << 23, 1 << 24, (254, 4096), generator=gen, dtype=torch.int64)
    amax = torch.ldexp(significands.double(), torch.arange(-149, 105).double()[:, None]).float().flatten()
    amax = amax[torch.isfinite(amax)]
    eager = amax / torch.tensor(maximum, dtype=torch.float32)
    assert torch.equal(divide_by_constant(amax, maximum), eager)
    assert torch.equal((amax.double() * (1.0 / maximum)).float(), eager)  # the rewritten form
    # the fp32 product with fp32(1/max), what inductor made of the plain division, is not
    if maximum not in (1.0, 2.0, 4.0, 8.0):
        assert not torch.equal(amax * torch.tensor(1.0 / maximum, dtype=torch.float32), eager)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_16x16", "fp8_e4m3_tensor", "fp8_e4m3_1x128", "mxfp8_e4m3", "mxfp4"])
def test_compiled_quantizers_take_no_fp32_reciprocal(name):
    """Inductor emits an fp32 reciprocal on a GPU as an approximate division (the
    division-rounding option that compile_model sets covers divisions only): a scale or NVFP4's
    enc made so can be one ulp off eager mode's, and an element rounds the other way (42 codes of
    one 256 × 512 matrix on the H200). The compiled quantizer's graph must divide instead; fp64
    reciprocals (exact_reciprocal) are correctly rounded either way."""
    from torch._dynamo.backends.common import aot_autograd

    reciprocals = []

    def inspect(gm, _inputs):
        reciprocals.extend(n.meta["val"].dtype for n in gm.graph.nodes
                           if n.op == "call_function" and n.target == torch.ops.aten.reciprocal.default)
        return gm

    def q(t, axis):
        out = quantize(t, name, axis=axis)
        return out.data, out.scale, out.tensor_scale

    torch._dynamo.reset()
    compiled = torch.compile(q, backend=aot_autograd(fw_compiler=inspect), fullgraph=True)
    for axis in (1, 0):
        compiled(torch.randn(64, 256), axis)
    torch._dynamo.reset()
    assert all(dtype == torch.float64 for dtype in reciprocals), reciprocals


def test_the_compiled_element_pass_divides_by_a_product_exactly():
    """x / scale as compiled graphs take it — x · fp64(1/scale), rounded once to fp32
    (scaling.exact_reciprocal) — is fp32's correctly rounded division: for x next to every kind of
    rounding midpoint of the quotient, for power-of-two scales down to 2^-127, and, where the
    quotient falls below fp32's normal range, the element codes are the same."""
    from fewerbits.formats import FORMATS
    from fewerbits.scaling import exact_reciprocal
    from fewerbits.rounding import round_to_codes

    gen = torch.Generator().manual_seed(1)
    n = 1 << 16
    s = torch.ldexp(torch.randint(1 << 23, 1 << 24, (n,), generator=gen).double(),
                    torch.randint(-150, 100, (n,), generator=gen).double()).float()
    s = s[(s >= torch.finfo(torch.float32).tiny) & torch.isfinite(s)]
    # quotients at fp32 midpoints (2M + 1) · 2^(c-1), M a 24-bit significand, c anywhere from
    # subnormal to large; x is the fp32 nearest m · s, and its neighbours a unit away
    m = torch.ldexp(2 * torch.randint(1 << 23, 1 << 24, s.shape, generator=gen).double() + 1,
                    torch.randint(-170, 10, s.shape, generator=gen).double() - 24)
    x = (m * s.double()).float()
    x = torch.cat([x, torch.nextafter(x, torch.full_like(x, math.inf)), torch.nextafter(x, torch.zeros_like(x))])
    s = s.repeat(3)
    x, s = torch.cat([x, -x]), torch.cat([s, s])
    pow2 = torch.ldexp(torch.ones(255), torch.arange(-127, 128).double()).float()
    xr = torch.randn(255, 64, generator=gen) * torch.ldexp(torch.ones(255, 1), torch.randint(-60, 60, (255, 1), generator=gen))
    xs = torch.cat([x, xr.flatten()])
    ss = torch.cat([s, pow2.repeat_interleave(64)])
    product = (xs.double() * exact_reciprocal(ss)).float()
    divided = xs / ss
    normal = divided.abs() >= torch.finfo(torch.float32).tiny
    assert normal.sum() > len(xs) // 2 and (~normal).sum() > 1000
    assert torch.equal(product[normal].view(torch.int32), divided[normal].view(torch.int32))
    assert (xs * (1.0 / ss) != divided).sum() > 1000  # fp32's reciprocal would not do: hard cases
    for fmt in ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp4_e2m1"):
        f = FORMATS[fmt]
        assert torch.equal(round_to_codes(product, f), round_to_codes(divided, f)), fmt


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_element_pass_never_rounds_a_nan(name, monkeypatch):
    """element_codes promises round_to_codes no NaN (nan_free: compiled graphs then skip the
    NaN test): a NaN or ±inf element makes its block's scale NaN, and the block is zeroed
    before rounding — with the tensor's own amax, an amax given instead (delayed scaling), and
    stochastic rounding."""
    import fewerbits.rounding
    quantize_module = sys.modules["fewerbits.quantize"]

    seen = []
    real = fewerbits.rounding.round_to_codes

    def checked(v, fmt, *, noise=None, nan_free=False):
        seen.append(nan_free)
        assert not (nan_free and torch.isnan(v).any()), "a NaN reached the rounding"
        return real(v, fmt, noise=noise, nan_free=nan_free)

    monkeypatch.setattr(quantize_module, "round_to_codes", checked)
    x = torch.randn(70, 300, generator=torch.Generator().manual_seed(0)) * 100
    x[3, 5], x[40, 200], x[69, 299] = float("nan"), float("inf"), -float("inf")
    x[10] = 0.0
    quantize(x, name)
    quantize(x, name, axis=0, rounding="stochastic", generator=torch.Generator().manual_seed(1))
    quantize(x, name, amax=torch.tensor(1e-3))  # values far beyond the amax saturate
    assert True in seen  # the element pass went through the check (scale codes come as well)


def test_an_amax_to_quantize_by_is_one_value_or_one_per_block():
    """amax= gives one value for all blocks or one per block, in any shape holding as many
    ((R,) or (R, 1) for one scale per row: the same scales); any other count — which would
    broadcast against the blocks into scales of another shape — or a non-float is refused."""
    x = torch.from_numpy(hard_matrix(30, 50, specials=True))
    per_row = torch.linspace(0.5, 8.0, 30)
    a = quantize(x, "fp8_e4m3_row", amax=per_row)
    b = quantize(x, "fp8_e4m3_row", amax=per_row.reshape(30, 1))
    bits = lambda q: q.scale.view(torch.int32)  # noqa: E731 (NaN scales where a row holds NaN or inf)
    assert a.scale.shape == (30, 1) and torch.equal(bits(a), bits(b)) and torch.equal(a.data, b.data)
    assert not torch.equal(bits(a), bits(quantize(x, "fp8_e4m3_row")))  # the amax given is the one used
    assert quantize(x, "fp8_e4m3_row", amax=torch.tensor([2.0])).scale.shape == (30, 1)
    with pytest.raises(ValueError, match=r"one per block \(30\), not 50"):
        quantize(x, "fp8_e4m3_row", amax=torch.ones(50))
    with pytest.raises(ValueError, match=r"one per block \(1\), not 30"):
        quantize(x, "fp8_e4m3_tensor", amax=per_row)
    with pytest.raises(ValueError, match="floating-point tensor, not float"):
        quantize(x, "fp8_e4m3_tensor", amax=2.0)


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor", "fp8_e4m3_row", "fp4_tensor"])
def test_a_given_amax_makes_the_codes_of_a_tensor_holding_nan_or_inf(name):
    """Quantized by a given amax (delayed scaling), a tensor holding NaN or ±inf keeps the codes
    that amax's scale makes — x / scale cast saturating, ±inf to ±max, a NaN element to the
    format's NaN code with its sign (0 in FP4, which has none), the other codes as ml_dtypes
    casts them — and stores a NaN scale where its own amax is not finite; by its own amax it
    stores zero codes. A given NaN or inf amax (a history that recorded one) gives zero codes."""
    scheme = get_scheme(name) if name != "fp4_tensor" else Scheme("fp4_e2m1", (-1, -1), "fp32")
    elem = scheme.elem
    x = torch.from_numpy(hard_matrix(24, 40, seed=3, specials=False)) * 1e-3
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -float("nan")])
    x[7, 9] = 5e6  # far beyond the given amax: saturates
    given = torch.tensor([0.7])
    q = quantize(x, scheme, amax=given)
    scale = np.float32(np.float64(0.7) / elem.max)  # the fp32 quotient, correctly rounded
    v = x.numpy() / scale
    finite = np.isfinite(v)
    oracle = np.clip(np.where(finite, v, 0), -elem.max, elem.max).astype(ORACLE[elem.name])
    if elem.bits == 4:  # the 4-bit pattern: ml_dtypes stores one code a byte
        want = oracle.view(np.uint8) & 0xF
    else:
        want = oracle.view(np.uint8).copy()
    sign = np.signbit(x.numpy())
    top = 1 << (elem.bits - 1)
    want = np.where(np.isinf(v), elem.max_code | (sign * top), want)
    if elem.has_nan:
        want = np.where(np.isnan(v), elem.nan_code | (sign * top), want)
    else:
        want = np.where(np.isnan(v), 0, want)
    got = unpack(q.data, elem, x.shape[-1]).numpy()
    assert np.array_equal(got, want.astype(np.uint8))
    rows_nan = np.isnan(q.scale.numpy().reshape(-1))
    assert rows_nan.tolist() == ([True] + [False] * 23 if scheme.block == (1, -1) else [True])
    assert np.all(q.scale.numpy().reshape(-1)[~rows_nan] == scale)
    own = quantize(x, scheme)
    assert not own.data[0].any() and torch.isnan(own.scale.reshape(-1)[0])  # its own amax: zero codes
    for bad in (float("nan"), float("inf")):
        q = quantize(x, scheme, amax=torch.tensor(bad))
        assert not q.data.any() and torch.isnan(q.scale).all()


@pytest.mark.parametrize("name,axis", [("fp8_e4m3_row", 0), ("fp8_e4m3_row", 1), ("mxfp8_e4m3", 1),
                                       ("fp8_e4m3_128x128", 0), ("nvfp4", 1)])
def test_given_block_amaxes_are_taken_for_a_reduction(name, axis):
    """block_amaxes= gives x's own blocks' amaxes (NaN for a block holding NaN): the codes and
    scales of finding them; a different value is the one used; a count other than the blocks'
    is refused by name."""
    from fewerbits.quantize import _block_amaxes, _to_matrix, block_grid

    x = torch.from_numpy(hard_matrix(150, 260, specials=True))
    scheme = get_scheme(name)
    grid = block_grid(scheme, x.shape, axis)
    X = _to_matrix(x, axis)
    own = _block_amaxes(x, X, *[X.shape[i] if b == -1 else b for i, b in enumerate(scheme.block)], axis)
    assert own.shape == grid and own.isnan().any()
    bits = lambda q: (q.data, q.scale.view(torch.int32) if q.scale.dtype == torch.float32 else q.scale)  # noqa: E731
    want = quantize(x, name, axis=axis)
    got = quantize(x, name, axis=axis, block_amaxes=own.flatten())
    assert all(torch.equal(u, v) for u, v in zip(bits(got), bits(want)))
    assert not torch.equal(quantize(x, name, axis=axis, block_amaxes=own / 3).data, want.data)
    with pytest.raises(ValueError, match=rf"one floating-point value per block \({grid[0] * grid[1]}\), not 7"):
        quantize(x, name, axis=axis, block_amaxes=torch.ones(7))


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor"])
@pytest.mark.parametrize("special", [None, float("nan"), float("inf")])
def test_requantize_along_the_other_axis_takes_the_same_scale(name, special):
    """A per-tensor quantization along axis 0 made with the axis-1 quantization's scale is the
    axis-0 quantization: the Linear's backward takes the forward weight's scale this way."""
    from fewerbits.quantize import requantize

    x = torch.from_numpy(hard_matrix(130, 260, specials=False))
    if special is not None:
        x[5, 7] = special
    rows = quantize(x, name, axis=1)
    cols = requantize(x, rows, axis=0)
    ref = quantize(x, name, axis=0)
    assert torch.equal(cols.data, ref.data) and cols.axis == ref.axis == 0
    assert torch.equal(cols.scale.view(torch.int32), ref.scale.view(torch.int32))
    # quantized by a given amax (delayed scaling), eagerly and compiled: that amax's codes
    # where x holds NaN or inf and its scale is NaN
    amax = torch.tensor(3.0e6)
    rows = quantize(x, name, axis=1, amax=amax)
    ref = quantize(x, name, axis=0, amax=amax)
    torch._dynamo.reset()  # the lambda's code is this test's for every scheme
    again = torch.compile(lambda t, s, a: requantize(t, replace(rows, scale=s), axis=0, amax=a).data, fullgraph=True)
    try:
        for cols in (requantize(x, rows, axis=0, amax=amax).data, again(x, rows.scale, amax)):
            assert torch.equal(cols, ref.data)
    finally:
        torch._dynamo.reset()
    assert special is None or ref.data.any()
    with pytest.raises(ValueError, match="one fp32 scale per tensor"):
        requantize(x, quantize(x, "mxfp8_e4m3"), axis=0)
