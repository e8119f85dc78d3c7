"""The Triton element kernel against the reference, bit for bit: compiled on a GPU, in
Triton's interpreter on a CPU (conftest sets TRITON_INTERPRET=1 there)."""

import pytest
import torch
import triton
import triton.language as tl

import fewerbits as fb
from fewerbits import kernels
from fewerbits.codes import decode
from fewerbits.kernels.cast import _round_codes, _round_values, format_constants, native_fp8
from fewerbits.kernels.rowblock import _divisor, _hadamard_blocks, _quotient, _scheme_constants
from fewerbits.rounding import round_to_codes
from test_quantize import MX, hard_matrix

CASES = [(n, None) for n in fb.SCHEMES] + [(n, r) for n in MX for r in ("rceil", "ceil", "even")]
CASES += [("fp8_e4m3_row", "rceil"), ("fp8_e4m3_1x128", "floor")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
USER = [fb.Scheme("int8", (1, 64), "fp32"), fb.Scheme("fp4_e2m1", (8, 8), "e8m0", "rceil"),
        fb.Scheme("int4", (1, 16), "fp8_e4m3")]


@pytest.fixture(autouse=True)
def triton_backend():
    kernels.set_backend("triton")
    yield
    kernels.set_backend("auto")


def same(a: fb.QuantizedTensor, b: fb.QuantizedTensor) -> bool:
    scales = lambda q: q.scale.view(torch.uint8) if q.scale.dtype == torch.uint8 else q.scale.view(torch.int32)  # noqa: E731
    ts = (a.tensor_scale is None and b.tensor_scale is None) or torch.equal(a.tensor_scale, b.tensor_scale)
    return torch.equal(a.data, b.data) and torch.equal(scales(a), scales(b)) and ts and a.shape == b.shape


@pytest.mark.parametrize("name, rule", CASES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_kernel_equals_reference(name, rule, axis):
    scheme = fb.get_scheme(name, rule)
    x = torch.from_numpy(hard_matrix(37, 100, seed=1, specials=scheme.block != (-1, -1))).to(DEVICE)
    assert same(kernels.quantize(x, scheme, axis=axis), fb.quantize(x, scheme, axis=axis))


def test_the_operators_that_read_a_graphs_tensors_take_any_layout():
    """The operators that read tensors a compiled graph makes carry `flexible_layout`, so that
    inductor realizes a tensor that two of them read once: under the default constraint (the
    eager strides, exactly) the H200's compiled SwiGLU stored its output twice, a copy for each
    call (docs/kernels-notes.md v30); a CPU's graph does not show it. The tiled transpose,
    which reads only codes an inductor kernel wrote for it, keeps the default."""
    layout_tags = {torch.Tag.flexible_layout, torch.Tag.needs_exact_strides, torch.Tag.needs_fixed_stride_order}
    for name in ("rowblock_codes", "rowblock_values", "two_amaxes"):
        tags = set(getattr(torch.ops.fewerbits, name).default.tags) & layout_tags
        assert tags == {torch.Tag.flexible_layout}, (name, tags)
    assert not set(torch.ops.fewerbits.transpose_codes.default.tags) & layout_tags


@pytest.mark.parametrize("name, rule", [("fp8_e4m3_1x128", None), ("fp8_e4m3_128x128", None), ("mxfp8_e4m3", None),
                                        ("mxfp4", "rceil")])
@pytest.mark.parametrize("axis", [-1, 0])
def test_the_codes_operator_gives_the_reference_codes_in_the_shapes_it_declares(name, rule, axis):
    """fewerbits::rowblock_codes (the codes compiled graphs take from the one-read kernel) gives
    the reference's codes and scales — NaN, inf and zeros in blocks that neither dimension
    fills, row and column reads (given the transposed view, or the tensor as stored with
    columns=True), 4-bit codes packed — and its fake form, which inductor plans the graph's
    buffers with, declares the same shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    scheme = fb.get_scheme(name, rule)
    x = torch.from_numpy(hard_matrix(300, 260, seed=8, specials=True)).to(DEVICE).bfloat16()
    ref = fb.quantize(x, scheme, axis=axis)
    for X, columns in [(x, False)] if axis == -1 else [(x.t(), False), (x, True)]:
        codes, scales = torch.ops.fewerbits.rowblock_codes(X, scheme.name, scheme.scale_rule, None, None, columns)
        assert same(fb.QuantizedTensor(codes, scales, scheme, x.shape, ref.axis), ref)
        with FakeTensorMode() as mode:
            fake = torch.ops.fewerbits.rowblock_codes(mode.from_tensor(X), scheme.name, scheme.scale_rule, None,
                                                      None, columns)
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in (codes, scales)]


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4"])
def test_the_values_operator_reads_columns_from_the_tensor_as_stored(name):
    """fewerbits::rowblock_values along x's columns, given x as stored with columns=True (as
    compiled graphs give it), makes the reference's values — those it makes from the
    transposed view — and its fake form declares their shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    scheme = fb.get_scheme(name)
    x = torch.from_numpy(hard_matrix(96, 80, seed=3, specials=True)).to(DEVICE).bfloat16()
    ref = fb.quantize(x, scheme, axis=0)
    want = ref.dequantize_matrix(torch.bfloat16, tensor_scale=False)
    for X, columns in [(x.t(), False), (x, True)]:
        values, tensor_scale = torch.ops.fewerbits.rowblock_values(X, scheme.name, scheme.scale_rule, None, [],
                                                                   None, columns)
        assert same_values(values, want)
        if scheme.two_level:
            assert torch.equal(tensor_scale, ref.tensor_scale)
        with FakeTensorMode() as mode:
            fake = torch.ops.fewerbits.rowblock_values(mode.from_tensor(X), scheme.name, scheme.scale_rule, None, [],
                                                       None, columns)
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in (values, tensor_scale)]


@pytest.mark.parametrize("scheme", USER, ids=lambda s: s.describe())
def test_kernel_equals_reference_for_user_schemes(scheme):
    x = torch.from_numpy(hard_matrix(40, 96, seed=2, specials=False)).to(DEVICE) * 0.01
    assert same(kernels.quantize(x, scheme), fb.quantize(x, scheme))


@pytest.mark.parametrize("cols", [63, 64, 95])
def test_fp4_codes_whose_packed_rows_are_whole_16_byte_groups_are_the_references(cols):
    """Packed rows of 32 or 48 bytes, the length at which a GPU's compiled kernel stores a
    thread's bytes of a row together (cast.py's `_encode_store`): 63 and 95 columns end in a
    half-filled byte, whose high nibble stays 0. The one-read kernel (MXFP4, NVFP4, along rows
    and down columns) and the element kernel (a user scheme of 8x8 blocks), with NaN, inf and
    zero blocks."""
    from fewerbits.kernels import rowblock

    schemes = [fb.get_scheme("mxfp4"), fb.get_scheme("nvfp4"), fb.Scheme("fp4_e2m1", (8, 8), "e8m0", "rceil")]
    for scheme in schemes:
        assert rowblock.supported(scheme) == (scheme.block[0] == 1), scheme.describe()
        for shape, axis in (((40, cols), -1), ((cols, 48), 0)):
            x = torch.from_numpy(hard_matrix(*shape, seed=cols, specials=True)).to(DEVICE)
            a, b = kernels.quantize(x, scheme, axis=axis), fb.quantize(x, scheme, axis=axis)
            assert same(a, b), (scheme.describe(), shape, axis)
            assert axis == 0 or a.data.shape[-1] == (cols + 1) // 2


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("shape", [(37, 70), (48, 96)])
def test_fp6_codes_of_the_kernels_are_packed_as_the_reference_packs_them(axis, shape):
    """kernels.quantize's 6-bit codes are four in three bytes (codes.pack's layout), with a last
    group that the columns do not fill (70 and 37 columns), after the one-read kernel (MXFP6)
    and after the element kernel (fp6 in 1x8 and 4x4 blocks); NaN, inf and zero blocks among
    them. Rows of a multiple of 16 codes (96 and 48 columns) the one-read kernel packs itself,
    sixteen codes to three 32-bit words."""
    from fewerbits.codes import packed_size
    from fewerbits.kernels import rowblock

    x = torch.from_numpy(hard_matrix(*shape, seed=9, specials=True)).to(DEVICE)
    one_read = [fb.get_scheme("mxfp6_e3m2"), fb.get_scheme("mxfp6_e2m3")]
    element = [fb.Scheme("fp6_e2m3", (1, 8), "e8m0", "floor"), fb.Scheme("fp6_e3m2", (4, 4), "fp32")]
    for scheme in one_read + element:
        assert rowblock.supported(scheme) == (scheme in one_read) and not rowblock.amax_supported(scheme)
        a, b = kernels.quantize(x, scheme, axis=axis), fb.quantize(x, scheme, axis=axis)
        cols = x.shape[1] if axis == -1 else x.shape[0]
        assert a.data.dtype == torch.uint8 and a.data.shape[-1] == packed_size(cols, 6), scheme.describe()
        assert same(a, b), scheme.describe()


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "fp8_e5m2_tensor", "mxfp6_e3m2", "fp8_e4m3_1x128", "fp8_e4m3_128x128"])
def test_stochastic_rounding_uses_the_same_noise(name):
    x = torch.randn(33, 70, device=DEVICE) * 3
    gen = lambda: torch.Generator(device=DEVICE).manual_seed(4)  # noqa: E731
    a = kernels.quantize(x, name, rounding="stochastic", generator=gen())
    b = fb.quantize(x, name, rounding="stochastic", generator=gen())
    assert same(a, b)


def test_bf16_input_strided_views_amax_override_and_empty():
    x = torch.randn(64, 96, device=DEVICE).bfloat16()
    assert same(kernels.quantize(x, "mxfp8_e4m3"), fb.quantize(x, "mxfp8_e4m3"))
    hard = torch.from_numpy(hard_matrix(37, 100, seed=6, specials=True)).to(DEVICE).bfloat16()  # bf16 subnormals too
    for name in ("mxfp4", "nvfp4", "fp8_e4m3_1x128"):
        assert same(kernels.quantize(hard, name), fb.quantize(hard, name)), name
    big = torch.randn(80, 200, device=DEVICE)
    view = big[::2, 3:131]  # non-contiguous rows and an offset
    assert same(kernels.quantize(view, "nvfp4", axis=0), fb.quantize(view, "nvfp4", axis=0))
    amax = torch.tensor(0.5, device=DEVICE)
    assert same(kernels.quantize(big, "fp8_e4m3_tensor", amax=amax), fb.quantize(big, "fp8_e4m3_tensor", amax=amax))
    assert kernels.quantize(torch.empty(0, 32, device=DEVICE), "mxfp4").dequantize().shape == (0, 32)


@pytest.mark.parametrize("name", ["fp8_e4m3_128x128", "nvfp4_16x16"])
def test_square_blocks_across_tiles_with_ragged_edges(name):
    """2-D blocks (one block row per tile): several tiles each way, partial blocks at both
    edges, a NaN and an all-zero block, bf16 and transposed inputs, both axes."""
    x = torch.randn(300, 260, generator=torch.Generator().manual_seed(7)).to(DEVICE) * 3
    x[130:140, 0:20] = 0.0
    x[0:16, 16:32] = 0.0  # a whole 16x16 block
    y = x.clone()
    y[200, 5] = float("nan")
    for t in (x, y, x.bfloat16(), x.t()):
        for axis in (-1, 0):
            assert same(kernels.quantize(t, name, axis=axis), fb.quantize(t, name, axis=axis)), (t.dtype, axis)


@pytest.mark.parametrize("scheme", [fb.get_scheme("fp8_e4m3_128x128"), fb.Scheme("fp8_e5m2", (32, 32), "fp32")],
                         ids=lambda s: s.describe())
def test_square_blocks_read_down_columns_from_the_transpose(scheme):
    """A column read of square blocks with fp32 scales and byte codes is read as its transpose's
    rows, codes and scales stored transposed (`square_column_read_transposed`): the reference's
    codes along axis 0, nearest and stochastic (whose noise follows the quantized matrix's
    coordinates, not the transpose's), with NaN, inf, −0, subnormal and zero blocks, blocks the
    edges cut, bf16 and fp32, and a view with an offset and a row stride past its length."""
    from fewerbits.kernels import rowblock

    base = torch.from_numpy(hard_matrix(300, 260, seed=11, specials=True)).to(DEVICE)
    base[40:80, 140:200] = 0.0
    base[130:140, 3] = -0.0
    gen = lambda: torch.Generator(device=DEVICE).manual_seed(5)  # noqa: E731
    for x in (base, base.bfloat16(), base[:, 1:]):
        assert rowblock.square_column_read_transposed(x.t(), scheme)
        assert not rowblock.square_column_read_transposed(x, scheme)
        for rounding in ("nearest", "stochastic"):
            a = kernels.quantize(x, scheme, axis=0, rounding=rounding, generator=gen())
            b = fb.quantize(x, scheme, axis=0, rounding=rounding, generator=gen())
            assert same(a, b), (x.dtype, x.stride(), rounding)
    t = base.t()
    for other in ("fp8_e4m3_1x128", "mxfp8_e4m3", "nvfp4_16x16"):
        assert not rowblock.square_column_read_transposed(t, fb.get_scheme(other)), other
    assert not rowblock.square_column_read_transposed(t, scheme, values=True)


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor", "fp8_e4m3_row"])
def test_one_amax_per_tensor_or_row_with_specials_overrides_and_layouts(name):
    """The reduction-then-kernel path: NaN and inf anywhere, zero tensors and rows, overrides
    (delayed scaling), bf16 and transposed inputs, stochastic rounding."""
    base = torch.from_numpy(hard_matrix(37, 100, seed=5, specials=False)).to(DEVICE)
    cases = [base, base.bfloat16(), base.t(), torch.zeros(5, 48, device=DEVICE)]
    for special in (float("nan"), float("inf"), -float("inf")):
        y = base.clone()
        y[3, 7] = special
        cases.append(y)
    for x in cases:
        for axis in (-1, 0):
            assert same(kernels.quantize(x, name, axis=axis), fb.quantize(x, name, axis=axis)), (x.dtype, axis)
    # a given amax makes the codes of a tensor holding NaN or inf too (its scale stored NaN);
    # a given NaN or inf amax (a history that recorded one) zero codes
    for amax in (0.25, 1e30, 0.0, float("nan"), float("inf")):
        amax = torch.tensor(amax, device=DEVICE)
        for x in (base, base.bfloat16(), *cases[-3:], cases[-1].t()):
            for axis in (-1, 0):
                assert same(kernels.quantize(x, name, axis=axis, amax=amax), fb.quantize(x, name, axis=axis, amax=amax))
    gen = lambda: torch.Generator(device=DEVICE).manual_seed(9)  # noqa: E731
    sr = dict(rounding="stochastic")
    assert same(kernels.quantize(base, name, generator=gen(), **sr), fb.quantize(base, name, generator=gen(), **sr))
    amax = torch.tensor(0.25, device=DEVICE)
    for x in cases[-3:]:
        assert same(kernels.quantize(x, name, amax=amax, generator=gen(), **sr),
                    fb.quantize(x, name, amax=amax, generator=gen(), **sr))


@pytest.mark.parametrize("name", ["fp8_e4m3_1x128", "fp8_e4m3_128x128", "mxfp8_e4m3", "nvfp4"])
def test_given_block_amaxes_make_the_codes_of_blocks_holding_nan_or_inf(name):
    """Smaller blocks under given amaxes (one a block): the kernels' bits are the reference's
    where a block holds NaN or inf (its codes by the given amax's scale, its scale NaN), with
    one given amax for all blocks too, and a NaN or inf given amax."""
    x = torch.from_numpy(hard_matrix(150, 300, seed=8, specials=True)).to(DEVICE)
    grid = fb.quantize(x, name).scale.shape
    amaxes = torch.linspace(0.5, 40.0, grid[0] * grid[1], device=DEVICE)
    for amax in (amaxes, torch.tensor(3.0, device=DEVICE), torch.tensor(float("nan"), device=DEVICE)):
        for t in (x, x.bfloat16()):
            assert same(kernels.quantize(t, name, amax=amax), fb.quantize(t, name, amax=amax)), (t.dtype, amax.numel())


@pytest.mark.parametrize("scheme", [fb.get_scheme("fp8_e4m3_row"), fb.get_scheme("fp8_e4m3_row", "rceil"),
                                    fb.get_scheme("fp8_e4m3_row", "floor"), fb.Scheme("fp8_e5m2", (1, -1), "fp32"),
                                    fb.Scheme("int8", (1, -1), "fp32"), fb.Scheme("fp6_e3m2", (1, -1), "fp32")],
                         ids=lambda s: s.describe())
def test_per_row_codes_of_a_column_read_come_from_the_column_kernel(scheme):
    """One scale per column of x (fp8_rowwise's column-wise copies: x.t(), whose rows are
    contiguous in memory) by `_column_codes_kernel`, which loads tiles as memory holds them and
    transposes the codes on chip: the reference's bits for fp32, bf16 and fp16, over several
    tiles each way with ragged edges, columns of wildly different scales, zero, NaN and inf
    columns, stochastic rounding, a delayed-scaling override and the columns' amaxes given; the
    row kernel gives the same bits; a row read or 4-bit codes are refused by name."""
    from fewerbits.kernels import rowblock

    wide = torch.from_numpy(hard_matrix(200, 300, seed=11, specials=True)).t().contiguous()  # scales per column
    tall = torch.from_numpy(hard_matrix(300, 200, seed=12, specials=True))
    assert rowblock.column_codes_supported(tall.t(), scheme) and not rowblock.column_codes_supported(tall, scheme)
    for x in (wide, tall, wide.bfloat16(), tall.half()):
        x = x.to(DEVICE)
        ref = fb.quantize(x, scheme, axis=0)
        assert same(kernels.quantize(x, scheme, axis=0), ref), x.dtype
        codes, scales = rowblock.quantize_with_amax(x.t(), scheme, None, columns=False)
        if scheme.elem.bits == 8:
            assert torch.equal(codes, ref.data) and torch.equal(scales.view(torch.int32), ref.scale.view(torch.int32))
    x = wide.to(DEVICE)
    gen = lambda: torch.Generator(device=DEVICE).manual_seed(5)  # noqa: E731
    sr = dict(rounding="stochastic", axis=0)
    assert same(kernels.quantize(x, scheme, generator=gen(), **sr), fb.quantize(x, scheme, generator=gen(), **sr))
    override = torch.full((200,), 0.5, device=DEVICE)  # one per column
    assert same(kernels.quantize(x, scheme, axis=0, amax=override), fb.quantize(x, scheme, axis=0, amax=override))
    own = x.abs().amax(0)  # the columns' own amaxes given (a weight's from the fused AdamW): no reduction
    assert own.isnan().any() and same(kernels.quantize(x, scheme, axis=0, block_amaxes=own), fb.quantize(x, scheme, axis=0))
    assert same(kernels.quantize(x, scheme, axis=0, block_amaxes=own / 3),
                fb.quantize(x, scheme, axis=0, block_amaxes=own / 3))
    with pytest.raises(ValueError, match=r"one floating-point value per block \(200\), not 300"):
        kernels.quantize(x, scheme, axis=0, block_amaxes=torch.ones(300, device=DEVICE))
    with pytest.raises(ValueError, match="rows are contiguous"):
        rowblock.quantize_with_amax(x, scheme, None, columns=True)
    assert not rowblock.column_codes_supported(x.t(), fb.Scheme("fp4_e2m1", (1, -1), "fp32"))


@pytest.mark.parametrize("scheme", [fb.get_scheme("fp8_e4m3_row", "rceil"), fb.get_scheme("fp8_e4m3_row"),
                                    fb.Scheme("fp6_e3m2", (1, -1), "fp32")], ids=lambda s: s.describe())
def test_long_rows_in_one_read_give_the_reference_codes(scheme, monkeypatch):
    """Rows of LONG_ROW to ONE_READ_MAX elements (here 64 to 256), one program a row holding
    it all (padded to a power of two): the reference's codes and scales for fp32, bf16 and
    fp16 rows with zero, NaN, inf and subnormal rows, stochastic rounding too; a row longer
    than ONE_READ_MAX, a column read, or an amax override takes the other paths."""
    from fewerbits.kernels import rowblock

    monkeypatch.setattr(rowblock, "LONG_ROW", 64)
    monkeypatch.setattr(rowblock, "ONE_READ_MAX", 256)
    x = torch.from_numpy(hard_matrix(37, 200, seed=14, specials=True)).to(DEVICE)
    assert rowblock.rows_in_one_read(x, scheme)
    assert not rowblock.rows_in_one_read(x[:, :60], scheme) and not rowblock.rows_in_one_read(x.t(), scheme)
    assert not rowblock.rows_in_one_read(torch.zeros(4, 300), scheme)
    assert not rowblock.rows_in_one_read(x, scheme, amax=torch.ones(37))
    launches = []
    real_launch = rowblock._launch

    def spied(X, *args, **kwargs):
        launches.append((args[7], args[8]))  # (bc, amax mode): one block the row's width, reduced in the kernel
        return real_launch(X, *args, **kwargs)

    monkeypatch.setattr(rowblock, "_launch", spied)
    for t in (x, x.bfloat16(), x.half(), x[:, :64]):
        launches.clear()
        assert same(kernels.quantize(t, scheme), fb.quantize(t, scheme)), (t.dtype, t.shape)
        assert launches == [(256 if t.shape[1] > 128 else 64, 0)], launches
    gen = lambda: torch.Generator(device=DEVICE).manual_seed(6)  # noqa: E731
    sr = dict(rounding="stochastic")
    assert same(kernels.quantize(x, scheme, generator=gen(), **sr), fb.quantize(x, scheme, generator=gen(), **sr))


def test_column_amaxes_are_torchs_reduction_of_a_bf16_column_read():
    """`column_amaxes` (the bf16 column reads' amax kernel) is torch's reduction over each row
    of a transposed view, NaN where a row holds NaN, inf where it holds inf, 0 for a zero row —
    with the default tile and with small tiles that make several programs each way combine
    their maxima (and ragged edges); anything but a bf16 column read is refused."""
    from fewerbits.kernels import rowblock

    x = torch.from_numpy(hard_matrix(200, 300, seed=13, specials=True)).t().contiguous().to(DEVICE).bfloat16()
    X = x.t()  # (200, 300): hard_matrix's rows, contiguous in memory
    want = torch.linalg.vector_norm(X.float(), ord=float("inf"), dim=1)
    assert want.isnan().any() and want.isinf().any() and (want == 0).any()
    for tile in (None, (32, 4, 3), (64, 8, 1)):
        got = rowblock.column_amaxes(X, tile=tile)
        assert torch.equal(got.isnan(), want.isnan()), tile
        assert torch.equal(got[~want.isnan()], want[~want.isnan()]), tile
    for bad in (x, X.float()):
        with pytest.raises(ValueError, match="bf16 2-D view whose rows are contiguous"):
            rowblock.column_amaxes(bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tensor_amax_is_torchs_reduction(dtype):
    """`amax_by_kernel` (per-tensor FP8's and NVFP4's tensor amax) is torch's reduction: its
    value where finite (inf where X holds inf), NaN where X holds NaN (anywhere: first, last,
    past the first program's blocks), 0 for zeros and −0, and for an empty X (which torch
    refuses); the kernel over a contiguous X and over the transposed view of one, with tiles
    that make each program take several blocks, a ragged last block, and subnormals as the
    largest magnitude; torch's reduction for a view whose elements do not fill its memory, and
    for other dtypes."""
    from fewerbits.kernels import rowblock

    def check(X, tile=None):
        got, want = rowblock.amax_by_kernel(X, tile=tile), torch.linalg.vector_norm(X, ord=float("inf")).float()
        assert got.dtype == torch.float32 and got.shape == () and bool(got.isnan()) == bool(want.isnan()), (got, want)
        assert want.isnan() or torch.equal(got, want), (got, want, tile)

    x = torch.from_numpy(hard_matrix(300, 257, seed=5, specials=False)).to(DEVICE).to(dtype)
    for tile in (None, (1024, 4, 2)):
        for X in (x, x.t().contiguous().t(), x.t()):
            check(X, tile)
            y = X.clone()
            y[-1, -1] = float("inf")
            check(y, tile)
            for at in ((0, 0), (-1, -1), (150, 100)):
                y = X.clone()
                y[at] = -float("nan") if at[0] else float("nan")
                check(y, tile)
    tiny = torch.full((33, 70), -(2.0 ** -133), device=DEVICE).to(dtype)
    tiny[5, 7] = 2.0 ** -130
    check(tiny, (64, 1, 2))
    check(torch.zeros(5, 9, device=DEVICE, dtype=dtype) * -1.0)
    assert rowblock.amax_by_kernel(torch.empty(0, 4, device=DEVICE, dtype=dtype)).item() == 0.0  # torch refuses
    check(x[::2, ::3])  # strided: torch's reduction
    check(x.half())


@pytest.mark.parametrize("name", ["fp8_e4m3_tensor", "fp8_e5m2_tensor", "nvfp4", "nvfp4_16x16"])
def test_a_given_tensor_amax_gives_the_tensors_own_codes(name):
    """quantize(x, tensor_amax=max |x|) — a weight's amax as the fused AdamW finds it — is
    quantize(x) bit for bit, on the kernels and the reference, with NaN, inf, zeros, bf16 and a
    transposed view, under a delayed-scaling override too; the amax given is the one used (three
    times it gives other codes), and anything but one floating-point value is refused."""
    base = torch.from_numpy(hard_matrix(37, 100, seed=5, specials=False)).to(DEVICE)
    cases = [base, base.bfloat16(), base.t(), torch.zeros(5, 48, device=DEVICE)]
    for special in (float("nan"), float("inf")):
        y = base.clone()
        y[3, 7] = special
        cases.append(y)
    for x in cases:
        amax = x.abs().amax().float()
        own = fb.quantize(x, name)
        assert same(fb.quantize(x, name, tensor_amax=amax), own), x.dtype
        assert same(kernels.quantize(x, name, tensor_amax=amax), own), x.dtype
    amax = base.abs().amax()
    for q in (fb.quantize, kernels.quantize):
        assert not same(q(base, name, tensor_amax=amax * 3), fb.quantize(base, name))
    if name.startswith("fp8"):
        override = torch.tensor(0.25, device=DEVICE)
        for x in (base, cases[-1]):
            want = fb.quantize(x, name, amax=override)
            given = x.abs().amax().float()
            assert same(fb.quantize(x, name, amax=override, tensor_amax=given), want)
            assert same(kernels.quantize(x, name, amax=override, tensor_amax=given), want)
    with pytest.raises(ValueError, match="one-element floating-point"):
        kernels.quantize(base, name, tensor_amax=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="one-element floating-point"):
        fb.quantize(base, name, tensor_amax=torch.ones((), dtype=torch.int32))


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_16x16"])
def test_nvfp4_block_scales_at_e4m3_ties_and_subnormals(name):
    """NVFP4's E4M3 block scales rounded by the kernels are the reference's where the rounding is
    hardest: with a tensor amax of 448 the block multiplier fp32(6 · fp32(1/6)) is exactly 1, so
    each block's scale is its own amax rounded to E4M3, and the blocks' amaxes are every midpoint
    between neighbouring E4M3 values (ties to even: 17 → 16, 19 → 20), the floats either side of
    each, and subnormal scales down to the tie 2^-10 that rounds to a zero scale. Codes, scales
    and the values of the one values kernel, bit for bit."""
    e4m3 = fb.get_format("fp8_e4m3")
    grid = torch.tensor(e4m3.code_values()[:0x7F], dtype=torch.float32)  # 0 … 448
    mids = (grid[1:] + grid[:-1]) / 2
    amaxes = torch.cat([mids, torch.nextafter(mids, torch.tensor(0.0)), torch.nextafter(mids, torch.tensor(1e30)),
                        torch.tensor([448.0])])
    gen = torch.Generator().manual_seed(7)
    br, bc = fb.get_scheme(name).block  # one block a block row (of 1 or 16 rows), its amax first
    x = amaxes.repeat_interleave(br)[:, None] * (torch.rand(len(amaxes) * br, bc, generator=gen) * 2 - 1)
    x[::br, 0] = amaxes
    x = x.to(DEVICE)
    ref = fb.quantize(x, name)
    stored = ref.block_scales().flatten().cpu()
    assert stored[amaxes == 17.0].item() == 16.0 and stored[amaxes == 19.0].item() == 20.0
    assert (stored == 0).any() and ((stored > 0) & (stored < 2.0**-6)).any()
    assert same(kernels.quantize(x, name), ref)
    values, ts = kernels.quantized_values(x, name)
    dq = ref.dequantize_matrix(torch.bfloat16, tensor_scale=False)
    assert torch.equal(values.view(torch.int16), dq.view(torch.int16)) and torch.equal(ts, ref.tensor_scale)


def test_backend_switch():
    kernels.set_backend("reference")
    assert not kernels.uses_triton(torch.zeros(1))
    kernels.set_backend("auto")
    assert not kernels.uses_triton(torch.zeros(1))  # CPU tensors: the reference
    if torch.cuda.is_available():
        assert kernels.uses_triton(torch.zeros(1, device="cuda"))
    with pytest.raises(ValueError, match="valid: auto, triton, reference"):
        kernels.set_backend("cuda")


def test_a_layer_trains_the_same_through_the_kernel():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48).to(DEVICE)
    x, g = torch.randn(40, 64, device=DEVICE), torch.randn(40, 48, device=DEVICE)

    def grads():
        q = fb.QuantizedLinear.from_linear(layer, "nvfp4")
        layer.weight.grad = None
        xq = x.clone().requires_grad_()
        torch.manual_seed(1)
        torch.cuda.manual_seed_all(1)
        (q(xq).float() * g).sum().backward()
        return xq.grad, layer.weight.grad.clone()

    fast = grads()
    kernels.set_backend("reference")
    ref = grads()
    assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bits everywhere but NaNs, which must sit in the same places (a NaN's payload and
    sign after a conversion are the converter's choice, not a value)."""
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a.view(as_int[a.dtype])[keep], b.view(as_int[b.dtype])[keep])


@pytest.mark.parametrize("name, rule", [(n, None) for n in fb.SCHEMES] + [("mxfp4", "rceil")])
@pytest.mark.parametrize("axis", [-1, 0])
def test_dequantize_kernel_equals_reference(name, rule, axis):
    scheme = fb.get_scheme(name, rule)
    # 37 × 100 divides no block; the specials give NaN-scale blocks, zero blocks and saturation
    x = torch.from_numpy(hard_matrix(37, 100, seed=3, specials=scheme.block != (-1, -1))).to(DEVICE)
    q = fb.quantize(x, scheme, axis=axis)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    from fewerbits.kernels import dequant

    # fp6 (four codes in three bytes) and fp16 output: the reference serves these
    assert dequant.supported(q, torch.float32) == (scheme.elem.bits != 6)
    assert not dequant.supported(q, torch.float16)
    for dtype in dtypes:
        for tensor_scale in (True, False):
            ref = q.dequantize_matrix(dtype, tensor_scale=tensor_scale)
            got = kernels.dequantize_matrix(q, dtype, tensor_scale=tensor_scale)
            assert bits_equal(got, ref), (dtype, tensor_scale)


@pytest.mark.parametrize("scheme", USER, ids=lambda s: s.describe())
def test_dequantize_kernel_equals_reference_for_user_schemes(scheme):
    x = torch.from_numpy(hard_matrix(40, 96, seed=2, specials=False)).to(DEVICE) * 0.01
    q = fb.quantize(x, scheme)
    assert bits_equal(kernels.dequantize_matrix(q, torch.bfloat16), q.dequantize_matrix(torch.bfloat16))
    empty = fb.quantize(torch.empty(0, 32, device=DEVICE), "mxfp4")
    assert kernels.dequantize_matrix(empty).shape == (0, 32)


@pytest.mark.parametrize("shape", [(37, 100), (1, 300), (300, 1), (64, 64), (130, 70), (0, 5)])
def test_tiled_transpose_equals_torch(shape):
    from fewerbits.kernels.transpose import transpose

    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    for t in (x, x.t()):  # contiguous and strided sources
        assert torch.equal(transpose(t), t.t().contiguous())
    assert torch.equal(transpose(x.view(torch.float8_e4m3fn)).view(torch.uint8), x.t().contiguous())
    # two- and four-byte elements move as their bits: bf16 and fp32 with NaN payloads, -0, inf
    w = torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    w = w.to(DEVICE)
    for t in (w, w.view(torch.float32), w[:, : shape[1] // 2 * 2].contiguous().view(torch.bfloat16)):
        for s in (t, t.t()):
            y = transpose(s)
            assert y.dtype == s.dtype and y.shape == (s.shape[1], s.shape[0])
            as_int = torch.int16 if s.element_size() == 2 else torch.int32
            assert torch.equal(y.view(as_int), s.t().contiguous().view(as_int))
    with pytest.raises(ValueError, match="one-, two- or four-byte real elements"):
        transpose(torch.zeros(4, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="2-D"):
        transpose(torch.zeros(4, device=DEVICE))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4", "mxfp6_e3m2", "nvfp4", "nvfp4_16x16", "mxfp8_e5m2"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_values_without_codes_equal_dequantized_codes(name, rounding):
    """The one-kernel values an emulated GEMM multiplies equal quantize-then-dequantize (bf16,
    without the per-tensor scale), bit for bit: NaN/inf/subnormal inputs, both axes, bf16 input."""
    x = torch.from_numpy(hard_matrix(37, 100, seed=3, specials=True)).to(DEVICE)
    for t in (x, x.bfloat16()):
        for axis in (-1, 0):
            gen = lambda: torch.Generator(device=DEVICE).manual_seed(9)  # noqa: E731
            values, ts = kernels.quantized_values(t, name, rounding=rounding, generator=gen(), axis=axis)
            q = fb.quantize(t, name, rounding=rounding, generator=gen(), axis=axis)
            ref = q.dequantize_matrix(torch.bfloat16, tensor_scale=False)
            assert values.dtype == torch.bfloat16 and values.shape == ref.shape
            nan = ref.isnan()  # (NaN blocks: NaN either way, the sign of a NaN aside)
            assert torch.equal(values.isnan(), nan), (t.dtype, axis)
            assert torch.equal(values[~nan].view(torch.int16), ref[~nan].view(torch.int16)), (t.dtype, axis)
            if q.scheme.elem.bits in (4, 8):  # and the very bits of the dequant kernel (NaN too)
                dq = kernels.dequantize_matrix(q, torch.bfloat16, tensor_scale=False)
                assert torch.equal(values.view(torch.int16), dq.view(torch.int16))
            assert (ts is None and q.tensor_scale is None) or torch.equal(ts, q.tensor_scale)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4", "nvfp4", "fp8_e4m3_1x128"])
def test_a_column_read_gives_the_reference_values_in_either_layout(name, monkeypatch):
    """A column read (a transposed view: the weight-gradient operands) gives the reference's
    values, and its codes and scales, whether the kernel lays the tile out in the memory's order
    or as a row read (`rowblock.column_read_as_rows`, which takes its row stride unspecialized),
    or reads a row-major copy by the tiled transpose (`column_read_transposed_first`), and a bf16
    or fp32 one with an even number of rows also with its rows loaded two at a time or not
    (`rowblock.pairs_possible`, `column_read_in_pairs`): nearest and stochastic rounding, with and
    without the recipes' Hadamard transforms, fp32 and bf16 input, NaN/inf/zero/subnormal
    blocks, rows that do not fill a tile."""
    from fewerbits.kernels import rowblock
    from fewerbits.rounding import draw_seed

    scheme = fb.get_scheme(name)
    transformed = name in ("mxfp4", "nvfp4")  # the FP4 recipes' weight-gradient operands
    transforms = (None, fb.Hadamard(scheme.block[1], seed=2)) if transformed else (None,)
    paired = 0
    for x in (torch.from_numpy(hard_matrix(64, cols, seed=8, specials=True)).to(DEVICE) for cols in (45, 46)):
        for t in (x, x.bfloat16()):
            X = t.t()  # (45 or 46, 64), read along columns
            assert X.stride(0) == 1
            pairs = (False, True) if rowblock.pairs_possible(X, 32) else (False,)
            paired += len(pairs) > 1
            for rounding in ("nearest", "stochastic"):
                for h in transforms:
                    gen = lambda: torch.Generator(device=DEVICE).manual_seed(11)  # noqa: E731
                    seed = draw_seed(X.device, gen()) if rounding == "stochastic" else None
                    q = fb.quantize(X if h is None else h.transform(X, dim=-1), scheme, rounding=rounding,
                                    generator=gen())
                    ref = q.dequantize_matrix(torch.bfloat16, tensor_scale=False)
                    ways = [(False, False, False), (None, True, False)] + [(True, False, p) for p in pairs]
                    for as_rows, first, p in ways:
                        values, _, ts = rowblock.quantize_rowblocks(X, scheme, seed, values=True, hadamard=h,
                                                                    as_rows=as_rows, transpose_first=first, pairs=p)
                        assert same_values(values, ref), (t.dtype, rounding, h is not None, as_rows, first, p)
                        assert (ts is None and q.tensor_scale is None) or torch.equal(ts, q.tensor_scale)
                    for as_rows, p in [(False, False)] + [(True, p) for p in pairs]:
                        codes, scales, _ = rowblock.quantize_rowblocks(X, scheme, seed, hadamard=h, as_rows=as_rows,
                                                                       pairs=p)
                        assert torch.equal(codes, q.data), (t.dtype, rounding, h is not None, as_rows, p)
                        assert torch.equal(scales.view(torch.uint8), q.scale.view(torch.uint8))
    assert paired == 2  # the fp32 and bf16 matrices of 46 rows
    with pytest.raises(ValueError, match="pairs"):  # 45 rows: the last one has no partner
        rowblock.quantize_rowblocks(x.bfloat16()[:, :45].contiguous().t(), scheme, None, as_rows=True, pairs=True)
    b = x.bfloat16()  # (64, 46): a slice's view starts 4-byte aligned, or not
    assert rowblock.pairs_possible(b[:, 2:46].t(), 32) and not rowblock.pairs_possible(b[:, 1:45].t(), 32)
    for view in (b[:, 2:46].t(), b[:, 1:45].t()):  # the default loads of a slice, either way
        codes, scales, _ = rowblock.quantize_rowblocks(view, scheme, None)
        assert torch.equal(codes, fb.quantize(view, scheme).data)
    # the choice: bf16 column reads laid out as rows, but not FP6
    assert rowblock.column_read_in_pairs(x.bfloat16().t(), scheme, 32)
    assert not rowblock.column_read_in_pairs(x.t(), scheme, 32)
    assert not rowblock.column_read_in_pairs(x.bfloat16().t(), fb.get_scheme("mxfp6_e2m3"), 32)
    # the choice: the row layout for 1 × bc blocks read along columns, but not under a 32-point
    # transform, whose column reads of values are copied to rows first
    assert rowblock.column_read_as_rows(x.t(), scheme) and not rowblock.column_read_as_rows(x, scheme)
    assert rowblock.column_read_as_rows(x.t(), scheme, fb.Hadamard(16)) == (scheme.block[1] != 32)
    h32 = fb.Hadamard(32)
    assert rowblock.column_read_transposed_first(x.t(), scheme, True, h32) == (scheme.block[1] == 32)
    assert not rowblock.column_read_transposed_first(x, scheme, True, h32)
    assert not rowblock.column_read_transposed_first(x.t(), scheme, False, h32)
    assert not rowblock.column_read_transposed_first(x.t(), scheme, True)
    from fewerbits.kernels import transpose

    real, calls = transpose.transpose, []
    monkeypatch.setattr(transpose, "transpose", lambda t: calls.append(t.shape) or real(t))
    X = x.t()
    h = fb.Hadamard(scheme.block[1], seed=2) if transformed else None
    values, _, _ = rowblock.quantize_rowblocks(X, scheme, None, values=True, hadamard=h)  # the default
    assert calls == ([(64, 46)] if name == "mxfp4" else [])  # (the last matrix above)
    ref = fb.quantize(X if h is None else h.transform(X, dim=-1), scheme).dequantize_matrix(torch.bfloat16,
                                                                                          tensor_scale=False)
    assert same_values(values, ref)


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp6_e3m2"])
def test_whole_blocks_a_thread_in_an_fp32_tile_give_the_reference_values(name):
    """`rowblock.whole_fp32_possible`: a row read of the values of 1 × bc blocks with power-of-two
    or two-level scales can hold whole blocks a thread in an fp32 tile (WHOLE without lanes),
    the Hadamard transform's stages and the block's amax and scale made in the thread. Its
    values and scales are the reference's and those of the kernel without it — nearest and
    stochastic rounding, with and without the recipes' transform, bf16 and fp32, NaN/inf/zero/
    subnormal blocks, rows that do not fill a tile, a last block cut short, tiles other than the
    default — and it is refused where it cannot run: a column read, codes, fp32 scales by the
    amax rule. By default: bf16 values under a transform or rounded stochastically; 1 × 32 blocks
    rounded to nearest are stored from the tile put back in rows and columns (`whole_tile_store`),
    the others from the tile of blocks: both are run here."""
    from fewerbits.kernels import rowblock
    from fewerbits.rounding import draw_seed

    scheme = fb.get_scheme(name)
    bc = scheme.block[1]
    x = torch.from_numpy(hard_matrix(37, 200, seed=9, specials=True)).to(DEVICE)
    x[7, :bc] = -0.0
    for t in (x, x.bfloat16()):
        for rounding in ("nearest", "stochastic"):
            for h in (None, fb.Hadamard(bc, seed=3)) if bc in (16, 32) else (None,):
                X = t if h is None else t[:, :192]  # (a transform: whole blocks)
                gen = lambda: torch.Generator(device=DEVICE).manual_seed(5)  # noqa: E731
                seed = draw_seed(X.device, gen()) if rounding == "stochastic" else None
                q = fb.quantize(X if h is None else h.transform(X, dim=-1), scheme, rounding=rounding, generator=gen())
                ref = q.dequantize_matrix(torch.bfloat16, tensor_scale=False)
                for whole, tile in ((False, {}), (True, {}), (True, dict(tile_r=8, tile_c=256, num_warps=2))):
                    values, scales, ts = rowblock.quantize_rowblocks(X, scheme, seed, values=True, hadamard=h,
                                                                     lanes=False, whole=whole, **tile)
                    case = (t.dtype, rounding, h is not None, whole, tile)
                    assert same_values(values, ref), case
                    assert torch.equal(scales.view(torch.uint8), q.scale.view(torch.uint8)), case
                    assert (ts is None and q.tensor_scale is None) or torch.equal(ts, q.tensor_scale), case
                stochastic = seed is not None
                assert rowblock.row_read_whole_fp32(X, scheme, True, h, stochastic) == (
                    t.dtype == torch.bfloat16 and (stochastic or h is not None))
            # stored from the tile in rows and columns (1 x 32 blocks, nearest) or from the tile of blocks
            assert rowblock.whole_tile_store(scheme, rounding == "stochastic") == (bc == 32 and rounding == "nearest")
    b = x.bfloat16()
    assert rowblock.whole_fp32_possible(b, scheme, True) and rowblock.whole_fp32_possible(x, scheme, True)
    for view, s, values in ((b.t(), scheme, True), (b, scheme, False), (b, fb.get_scheme("fp8_e4m3_1x128"), True)):
        assert not rowblock.whole_fp32_possible(view, s, values)
        with pytest.raises(ValueError, match="whole"):
            rowblock.quantize_rowblocks(view, s, None, values=values, lanes=False, whole=True)
    assert rowblock.tile_of(b, scheme, True, whole=True) == rowblock.WHOLE_FP32_TILES[bc]
    wide = fb.get_scheme("fp8_e4m3_1x128", "rceil")  # possible, but no tile timed: not by default
    assert rowblock.whole_fp32_possible(b, wide, True) and not rowblock.row_read_whole_fp32(b, wide, True, None, True)


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp6_e3m2"])
def test_whole_blocks_down_columns_give_the_reference_values(name, monkeypatch):
    """`rowblock.column_whole_possible`: the values of a column read (a transposed view: the
    weight-gradient operands) of 1 × bc blocks with power-of-two or two-level scales can be made
    with whole blocks down the memory's rows (`_column_whole_kernel`, whole_down). Its
    values, scales and tensor scale are the reference's — nearest and stochastic rounding, with
    and without the recipes' transform, bf16 and fp32, NaN/inf/zero/−0/subnormal blocks, rows
    that do not fill a tile, a last block cut short, a thread holding 2 rows of a block column
    (the default rounding to nearest), 1 (stochastic: a block over 4 threads), 8 or 4 rows of
    it — and it is refused where it cannot run: a row read, codes, fp32 scales by the amax
    rule, another layout asked for as well. By default: bf16 values of 1 × 32 blocks under the
    32-point transform, with no copy to rows (`column_read_whole`)."""
    from fewerbits.kernels import rowblock, transpose
    from fewerbits.rounding import draw_seed

    scheme = fb.get_scheme(name)
    bc = scheme.block[1]
    x = torch.from_numpy(hard_matrix(200, 70, seed=12, specials=True)).to(DEVICE)
    x[:bc, 3] = -0.0
    for t in (x, x.bfloat16()):
        for rounding in ("nearest", "stochastic"):
            for h in (None, fb.Hadamard(bc, seed=4)) if bc in (16, 32) else (None,):
                X = t.t() if h is None else t[:192].t()  # (70, 200 or 192) read down its columns
                assert X.stride(0) == 1
                gen = lambda: torch.Generator(device=DEVICE).manual_seed(6)  # noqa: E731
                seed = draw_seed(X.device, gen()) if rounding == "stochastic" else None
                q = fb.quantize(X if h is None else h.transform(X, dim=-1), scheme, rounding=rounding, generator=gen())
                ref = q.dequantize_matrix(torch.bfloat16, tensor_scale=False)
                for tile in ({}, dict(tile_r=256, num_warps=1), dict(tile_r=128, num_warps=1)):
                    values, scales, ts = rowblock.quantize_rowblocks(X, scheme, seed, values=True, hadamard=h,
                                                                     whole_down=True, **tile)
                    case = (t.dtype, rounding, h is not None, tile)
                    assert same_values(values, ref), case
                    assert torch.equal(scales.view(torch.uint8), q.scale.view(torch.uint8)), case
                    assert (ts is None and q.tensor_scale is None) or torch.equal(ts, q.tensor_scale), case
                assert rowblock.column_read_whole(X, scheme, True, h, seed is not None) == (
                    t.dtype == torch.bfloat16 and h is not None and bc == 32)
    b = x.bfloat16()
    for view, s, values in ((b, scheme, True), (b.t(), scheme, False), (b.t(), fb.get_scheme("fp8_e4m3_1x128"), True)):
        assert not rowblock.column_whole_possible(view, s, values)
        with pytest.raises(ValueError, match="whole_down"):
            rowblock.quantize_rowblocks(view, s, None, values=values, whole_down=True)
    for layout in (dict(transpose_first=True), dict(as_rows=True), dict(lanes=True)):
        with pytest.raises(ValueError, match="whole_down"):
            rowblock.quantize_rowblocks(b.t(), scheme, None, values=True, whole_down=True, **layout)
    # the default: whole blocks down the columns for 1 x 32 blocks under the transform, no copy to rows
    h = fb.Hadamard(bc, seed=4) if bc in (16, 32) else None
    X = b[:192].t()
    real, calls = transpose.transpose, []
    monkeypatch.setattr(transpose, "transpose", lambda t: calls.append(t.shape) or real(t))
    kernel, grids = rowblock._column_whole_kernel, []

    class Launches:  # records the grids `_column_whole_kernel` is launched on
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(rowblock, "_column_whole_kernel", Launches())
    for rounding in ("nearest", "stochastic"):
        gen = lambda: torch.Generator(device=DEVICE).manual_seed(9)  # noqa: E731
        seed = draw_seed(X.device, gen()) if rounding == "stochastic" else None
        grids.clear()
        values, _, _ = rowblock.quantize_rowblocks(X, scheme, seed, values=True, hadamard=h)
        tile_r = rowblock.COLUMN_WHOLE_TILES[seed is not None][0]
        assert grids == ([(-(-X.shape[0] // tile_r), X.shape[1] // bc)] if bc == 32 else []), rounding
        assert calls == [], rounding
        q = fb.quantize(X if h is None else h.transform(X, dim=-1), scheme, rounding=rounding, generator=gen())
        assert same_values(values, q.dequantize_matrix(torch.bfloat16, tensor_scale=False)), rounding


@pytest.mark.parametrize("name, rule", [("mxfp4", "floor"), ("mxfp4", "rceil"), ("mxfp6_e2m3", "floor"),
                                        ("mxfp6_e3m2", "rceil"), ("mxfp8_e4m3", "rceil"), ("mxfp8_e5m2", "even"),
                                        ("fp8_e4m3_1x128", "rceil"),  # fp32 scales, powers of two
                                        ("nvfp4", None)])  # E4M3 scales under a tensor scale
def test_a_bf16_read_worked_two_elements_a_word_gives_the_reference_bits(name, rule):
    """`rowblock.lanes_possible`: a bf16 row read of 1 × bc blocks with power-of-two scales (MX's
    E8M0, or fp32 under a power-of-two rule) can be worked two elements a 32-bit word
    (`cast._nearest_lanes`), and a column read two rows a word: on a GPU of compute capability
    9.0 on by bf16x2 instructions, the default there, and in Triton's interpreter (a CPU) by
    their emulation, asked for by name. Its values (and FP4 and FP6 codes) and scales are the
    reference's with it and without it — NaN, ±inf, zeros, −0, blocks of bf16 subnormals (scaled
    up by 2^127), bf16's largest values, blocks cut short by the matrix's end, in rows that are
    the even or the odd one of a word — and it is refused where it cannot run: odd columns (a
    column read: odd rows), a misaligned start, stochastic rounding, a transform, fp32, a column
    read not loaded in pairs, FP8's codes. NVFP4 (its products rounded to odd in bf16 first) takes
    the lanes along rows; its tensor scale needs a matrix without NaN or inf, so it also runs one
    without them. A row read in lanes with whole blocks a thread (`whole`: values, FP4 codes and
    the FP6 codes of rows a multiple of 16 long) gives the same bits, and is refused elsewhere."""
    from fewerbits.kernels import rowblock

    scheme = fb.get_scheme(name, rule)
    x = torch.from_numpy(hard_matrix(70, 200, seed=5, specials=True)).bfloat16()
    subnormals = torch.arange(1, 65, dtype=torch.int16).view(torch.bfloat16)  # bf16's bit patterns 1 … 64
    x[6, :64] = subnormals * torch.tensor([1.0, -1.0]).repeat(32).bfloat16()  # of both signs
    x[7, :32] = torch.tensor([3.3e38, -3.0e38, 1.0, -0.0] * 8).bfloat16()  # bf16's largest binade
    x[8, 32:64] = -0.0
    x[8, 64:96] = torch.linspace(-1e-6, 1e-6, 32).bfloat16()  # tiny beside a block of larger ones
    x[8, 80] = 7.0
    x = x.to(DEVICE)
    on_gpu = DEVICE == "cuda" and torch.cuda.get_device_capability() >= rowblock.LANES_CAPABILITY
    possible = rowblock.lanes_possible(x, scheme, True)
    assert possible == (DEVICE == "cpu" or on_gpu)
    codes_too = scheme.elem.bits in (4, 6)  # (FP8's codes: the GPU's conversion)
    xc = x.t().contiguous().t()  # x's values read down columns: a row of blocks is a column in memory
    xo = x.roll(-1, 0).t().contiguous().t()  # rows 6, 7, 8 as rows 5, 6, 7: in a word's other lane
    finite = torch.from_numpy(hard_matrix(70, 200, seed=5, specials=False)).bfloat16().to(DEVICE)
    finite[6:9] = x[6:9]
    two_level = scheme.two_level  # NVFP4: row reads only
    # FP6 codes a byte each, packed after; packed by the kernel (16 | C); column reads, of a slice too
    for view in (x, x[:, :192], xc, xc[:, :192], xo, xc[2:], finite):
        can = possible and not (two_level and view.stride(0) == 1)
        assert rowblock.lanes_possible(view, scheme, True) == can
        q = fb.quantize(view, scheme)
        ref = q.dequantize_matrix(torch.bfloat16, tensor_scale=False)
        row_read = view.stride(1) == 1
        whole_codes = scheme.elem.bits == 4 or scheme.block[1] == 32 and view.shape[1] % 16 == 0  # FP6: packed words
        for lanes, whole in ((False, False), (True, False), (True, True)) if can else ((False, False),):
            if whole and not row_read:
                continue
            values, scales, _ = rowblock.quantize_rowblocks(view, scheme, None, values=True, lanes=lanes, whole=whole)
            assert same_values(values, ref), (lanes, whole)
            assert torch.equal(scales.view(torch.uint8), q.scale.view(torch.uint8))
            if codes_too and not (whole and not whole_codes):
                codes, scales, _ = rowblock.quantize_rowblocks(view, scheme, None, lanes=lanes, whole=whole)
                assert torch.equal(codes, q.data), (lanes, whole)
                assert torch.equal(scales.view(torch.uint8), q.scale.view(torch.uint8))
        if can and row_read and codes_too and not whole_codes:
            with pytest.raises(ValueError, match="whole"):  # FP6 codes of a row not in words
                rowblock.quantize_rowblocks(view, scheme, None, lanes=True, whole=True)
    assert rowblock.row_read_in_lanes(x, scheme, True) == on_gpu  # the default
    assert rowblock.row_read_in_lanes(x, scheme, True, capability=(9, 0))  # as compiled for the H200
    assert not rowblock.row_read_in_lanes(x, scheme, True, capability=(8, 9))
    assert not rowblock.row_read_in_lanes(xc, scheme, True, capability=(9, 0))
    assert rowblock.column_read_in_lanes(xc, scheme, True) == (on_gpu and not two_level)
    assert rowblock.column_read_in_lanes(xc, scheme, True, capability=(9, 0)) != two_level
    assert not rowblock.column_read_in_lanes(x, scheme, True, capability=(9, 0))
    for view in (xc[:69], xc[1:]):  # odd rows
        assert not rowblock.lanes_possible(view, scheme, True)
    # whole blocks by default: FP4 codes, FP6 codes of rows in packed words, NVFP4 values; no column read
    assert rowblock.row_read_whole(x[:, :192], scheme, False) == (scheme.elem.bits in (4, 6))
    assert rowblock.row_read_whole(x, scheme, False) == (scheme.elem.bits == 4)  # 200 columns: FP6 in bytes
    assert rowblock.row_read_whole(x, scheme, True) == two_level
    assert not rowblock.row_read_whole(xc, scheme, False)
    # whole blocks: a row read, in lanes (or, for values, in an fp32 tile: `whole_fp32_possible`)
    for view, lanes, values in ((x, False, False), (xc, None, True)):
        with pytest.raises(ValueError, match="whole"):
            rowblock.quantize_rowblocks(view, scheme, None, values=values, lanes=lanes, whole=True)
    with pytest.raises(ValueError, match="lanes"):  # a column read in lanes is loaded in pairs
        rowblock.quantize_rowblocks(xc, scheme, None, values=True, lanes=True, pairs=False)
    assert rowblock.lanes_possible(x, scheme, False) == (possible and codes_too)
    for view in (x[:, :199], x[:, 1:199]):  # odd columns; an even number from a misaligned start
        assert not rowblock.lanes_possible(view, scheme, True)
        values, _, _ = rowblock.quantize_rowblocks(view, scheme, None, values=True)  # the other path
        assert same_values(values, fb.quantize(view, scheme).dequantize_matrix(torch.bfloat16, tensor_scale=False))
    assert not rowblock.lanes_possible(x, scheme, True, stochastic=True)
    assert not rowblock.lanes_possible(x, scheme, True, fb.Hadamard(32))
    assert not rowblock.lanes_possible(x.float(), scheme, True)
    assert not rowblock.lanes_possible(x, fb.get_scheme("mxfp8_e4m3"), False)
    with pytest.raises(ValueError, match="lanes"):
        rowblock.quantize_rowblocks(x[:, 1:199], scheme, None, values=True, lanes=True)


def test_two_amaxes_of_a_matrix_in_one_read():
    """`two_amaxes`: max |x| and max |Hadamard.transform(xᵀ)| of a matrix in one read — the
    reference's reductions bit for bit (NaN for NaN): bf16 and fp32, rows that do not fill a
    block of the transform (its zero padding), NaN, inf, zeros and subnormals, a strided view,
    the default tile and a small one, an empty matrix; and the values kernel given either amax
    as NVFP4's tensor amax makes the values it makes when it finds the amax itself."""
    from fewerbits.kernels import rowblock

    h = fb.Hadamard(16, seed=4)
    plain = torch.from_numpy(hard_matrix(48, 42, seed=6, specials=False)).to(DEVICE)
    special = torch.from_numpy(hard_matrix(48, 42, seed=6, specials=True)).to(DEVICE)
    one_inf = plain.clone()
    one_inf[33, 7] = float("-inf")
    cases = [plain, special, one_inf, plain[:37], plain[:, ::2], torch.zeros(32, 20, device=DEVICE)]
    small = dict(tile_c=32, groups=2, num_warps=2)  # several programs (the interpreter's time is per program)
    for t, tiles in [(c, small) for c in cases + [c.bfloat16() for c in cases]] + [(special.bfloat16(), {})]:
        ref = torch.stack([torch.linalg.vector_norm(t, ord=float("inf")).float(),
                           h.transform(t.t(), dim=-1).abs().amax()])
        got = rowblock.two_amaxes(t, h, **tiles)
        assert torch.equal(got.isnan(), ref.isnan()), (t.shape, t.dtype)
        assert torch.equal(got.nan_to_num(), ref.nan_to_num()), (t.shape, t.dtype)
    assert torch.equal(rowblock.two_amaxes(plain[:0], h), torch.zeros(2, device=DEVICE))
    assert not kernels.two_amaxes_in_one_read(plain, "mxfp4", h)  # one level: no tensor amax
    with pytest.raises(ValueError, match="16-point"):
        rowblock.two_amaxes(plain, fb.Hadamard(32))
    # NVFP4's values from the amaxes given: along rows as they are, along columns transformed
    t = special.bfloat16()
    amaxes = kernels.two_amaxes(t, h)
    assert kernels.two_amaxes_in_one_read(t, "nvfp4", h) and not kernels.two_amaxes_in_one_read(t[:37], "nvfp4", h)
    for axis, hadamard, amax in ((-1, None, amaxes[0]), (0, h, amaxes[1])):
        gen = lambda: torch.Generator(device=DEVICE).manual_seed(5)  # noqa: E731
        found = kernels.quantized_values(t, "nvfp4", rounding="stochastic", generator=gen(), axis=axis,
                                         hadamard=hadamard)
        given = kernels.quantized_values(t, "nvfp4", rounding="stochastic", generator=gen(), axis=axis,
                                         hadamard=hadamard, tensor_amax=amax)
        assert same_values(given[0], found[0]) and torch.equal(given[1], found[1]), axis


def same_values(values, ref) -> bool:
    """bf16 matrices equal bit for bit, NaN for NaN (the sign of a NaN aside)."""
    nan = ref.isnan()
    return (values.shape == ref.shape and torch.equal(values.isnan(), nan)
            and torch.equal(values[~nan].view(torch.int16), ref[~nan].view(torch.int16)))


@triton.jit
def _butterfly(x_ptr, out_ptr, signs_ptr, h_scale, BC: tl.constexpr, STAGES: tl.constexpr, BY_SPLIT: tl.constexpr):
    """The kernels' transform of a (4, BC) fp32 matrix's rows, as a (2, 2, BC) tile and as a
    (2, 2, BC // 8, 8) one (the tile of whole blocks a thread, a block in pieces of 8)."""
    i = (tl.arange(0, 2)[:, None, None] * 2 + tl.arange(0, 2)[None, :, None]) * BC + tl.arange(0, BC)[None, None, :]
    signs = tl.load(signs_ptr + tl.arange(0, BC))[None, None, :]
    tl.store(out_ptr + i, _hadamard_blocks(tl.load(x_ptr + i), signs, h_scale, 4, BC, STAGES, BY_SPLIT))
    piece = (8 * tl.arange(0, BC // 8))[None, None, :, None] + tl.arange(0, 8)[None, None, None, :]
    j = (tl.arange(0, 2)[:, None, None, None] * 2 + tl.arange(0, 2)[None, :, None, None]) * BC + piece
    tl.store(out_ptr + 4 * BC + j, _hadamard_blocks(tl.load(x_ptr + j), tl.load(signs_ptr + piece), h_scale, 4, BC,
                                                    STAGES, BY_SPLIT))


@triton.jit
def _divided(x_ptr, s_ptr, out_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < N, other=1.0)
    p, m, y = _divisor(tl.load(s_ptr + i, mask=i < N, other=1.0))
    tl.store(out_ptr + i, _quotient(x, p, m, y), mask=i < N)


def test_the_kernels_quotient_is_the_correctly_rounded_division():
    """`_quotient(x, *_divisor(s))`, the kernels' x / s by products and fmas, gives the
    correctly rounded fp32 quotient (torch's division) wherever it returns the quotient, and
    elsewhere a value that every element format rounds as the quotient: random pairs over the
    whole range; dividends whose significands are near 1 and 2 against divisors just above and
    below theirs; ±0, subnormals, ±inf and NaN. (scripts/verify_quotient.py checks every pair
    of significands on a GPU.)"""
    gen = torch.Generator().manual_seed(5)
    n = 1 << 16
    x = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, generator=gen).view(torch.float32)
    s = ((torch.randint(1, 247, (n,), dtype=torch.int32, generator=gen) << 23)
         | torch.randint(0, 1 << 23, (n,), dtype=torch.int32, generator=gen)).view(torch.float32)
    near = torch.cat([torch.arange(0, 64), (1 << 23) - torch.arange(1, 65)]).to(torch.int32)  # significand ends
    xa, sa = torch.meshgrid(near, near, indexing="ij")
    x_hard = ((127 << 23) | xa.flatten()).view(torch.float32) * torch.tensor([1.0, -2.0**-40]).repeat(xa.numel() // 2)
    s_hard = ((120 << 23) | sa.flatten()).view(torch.float32)
    special = torch.tensor([0.0, -0.0, 1e-45, -3e-39, 1e-30, float("inf"), -float("inf"), float("nan"), 3e38, -448.0])
    x = torch.cat([x, x_hard, special.repeat(3)]).to(DEVICE)
    s = torch.cat([s, s_hard, torch.tensor([1.0, 2.0**-126, 2.0**119]).repeat_interleave(len(special))]).to(DEVICE)
    out = torch.empty_like(x)
    _divided[(triton.cdiv(len(x), 1024),)](x, s, out, len(x), BLOCK=1024)
    ref = x / s
    p = (s.view(torch.int32) & 0x7F800000).view(torch.float32).reciprocal()  # 2^(127 − E), exact
    a = (x * p).abs()
    in_range = (a >= 2.0**-64) & (a < 2.0**64)
    assert in_range.sum() > n // 2 and (~in_range).sum() > 1000  # both sides of the range drawn
    nan = x.isnan()
    assert torch.equal(out.isnan(), nan)
    bits, ref_bits = out.view(torch.int32), ref.view(torch.int32)
    assert torch.equal(bits[in_range & ~nan], ref_bits[in_range & ~nan])
    outside = ~in_range & ~nan
    same_sign = (bits < 0) == (ref_bits < 0)
    tiny = (out.abs() < 2.0**-60) & (ref.abs() < 2.0**-60)
    huge = (out.abs() > 2.0**60) & (ref.abs() > 2.0**60)
    assert (same_sign & (tiny | huge))[outside].all()


@triton.jit
def _element_codes(v_ptr, out_ptr, N, BLOCK: tl.constexpr, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr,
               EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, BITS: tl.constexpr,
               HAS_NAN: tl.constexpr, NAN_CODE: tl.constexpr, IS_INT: tl.constexpr, NATIVE_MAX: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + i, mask=i < N, other=0.0)
    code = _round_codes(v, 0, E, M, BIAS, EMIN, EMAX, MAX_CODE, BITS, HAS_NAN, NAN_CODE, IS_INT, False, NATIVE_MAX)
    tl.store(out_ptr + i, code.to(tl.uint8), mask=i < N)


@triton.jit
def _element_values(v_ptr, out_ptr, N, BLOCK: tl.constexpr, E: tl.constexpr, M: tl.constexpr, BIAS: tl.constexpr,
                    EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr, HAS_NAN: tl.constexpr,
                    NATIVE_MAX: tl.constexpr, MAX_VALUE: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + i, mask=i < N, other=0.0)
    values = _round_values(v, 0, M, BIAS, EMIN, EMAX, MAX_CODE, MAX_VALUE, HAS_NAN, False, E, NATIVE_MAX)
    tl.store(out_ptr + i, values, mask=i < N)


def _edge_values(fmt) -> torch.Tensor:
    """fp32 values of every kind for a floating-point element format: random bit patterns over the
    whole fp32 range (NaN of both signs among them), every code's value, the midpoints between
    neighbouring codes and the floats just either side of them, tiny values, values past max,
    ±0, ±inf, NaN."""
    gen = torch.Generator().manual_seed(11)
    random = torch.randint(-2**31, 2**31, (1 << 16,), dtype=torch.int32, generator=gen).view(torch.float32)
    grid = torch.tensor([fmt.decode_magnitude(c) for c in range(fmt.max_code + 1)], dtype=torch.float32)
    mids = (grid[1:] + grid[:-1]) / 2
    edges = torch.cat([grid, mids, torch.nextafter(mids, torch.tensor(0.0)), torch.nextafter(mids, torch.tensor(1e30)),
                       torch.tensor([0.0, 1e-45, 1e-30, fmt.max * 1.03, fmt.max * 1.07, 3e38, float("inf"),
                                     float("nan")])])
    v = torch.cat([random, random * 2.0**-120, edges, -edges]).to(DEVICE)
    assert (v.isnan() & (v.view(torch.int32) < 0)).any() and (v.isnan() & (v.view(torch.int32) > 0)).any()
    return v


def _expect_native(fmt, device):
    """The format's kernel constants, after checking that they take the GPU's conversion exactly
    where one is expected (NVIDIA from sm_89; not Triton's interpreter)."""
    expected_native = DEVICE == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 9)
    constants = format_constants(fmt, device)
    assert (constants["NATIVE_MAX"] == fmt.max) == expected_native == native_fp8(fmt, device)
    return constants


def test_the_launch_constants_made_once_are_read_only():
    """The kernels' constants are made once per format (or scheme) and device and shared by every
    launch: a caller that changed them would change every later cast, so they refuse it."""
    scheme = fb.schemes.get_scheme("mxfp8_e4m3")
    fmt_constants = format_constants(scheme.elem, torch.device(DEVICE))
    launch = _scheme_constants(scheme, scheme.scale_rule, torch.device(DEVICE))
    assert launch["MAX_VALUE"] == scheme.elem.max and fmt_constants["M"] == scheme.elem.man_bits
    for constants, key in ((fmt_constants, "M"), (launch, "MAX_VALUE")):
        with pytest.raises(TypeError):
            constants[key] = 0
    assert dict(**launch)["MAX_VALUE"] == scheme.elem.max  # still unpacked as keyword arguments


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_codes_by_the_gpus_conversion_are_the_references(name):
    """On a GPU that converts fp32 to FP8 in one instruction (NVIDIA, sm_89 on) the kernels take
    FP8 codes rounded to nearest from that conversion, and they are the reference's codes for
    every kind of value: random bit patterns over the whole fp32 range (NaN of both signs
    among them), every code's value, the midpoints between neighbouring codes and the floats
    just either side of them, tiny values, values past max, ±0, ±inf, NaN (`_native_fp8_codes`,
    four elements at a time in PTX). Elsewhere — Triton's interpreter, whose emulated
    conversion does not round as the reference does — the kernels keep their integer
    arithmetic, which gives the same codes."""
    fmt = fb.get_format(name)
    v = _edge_values(fmt)
    constants = _expect_native(fmt, v.device)
    out = torch.empty(v.shape, dtype=torch.uint8, device=DEVICE)
    _element_codes[(triton.cdiv(len(v), 1024),)](v, out, len(v), BLOCK=1024, **constants)
    assert torch.equal(out.cpu(), round_to_codes(v.cpu(), fmt))


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_values_by_the_gpus_conversions_are_the_references(name):
    """The values kernel's FP8 elements rounded to nearest (`_round_values`: on such a GPU by the
    conversions to FP8 and back through fp16, elsewhere by one fp32 addition) are the values of
    the reference's codes, bit for bit, for the same values of every kind: ±0 and values that
    round to zero keep their sign, values past max and ±inf give ±max, NaN gives NaN."""
    fmt = fb.get_format(name)
    v = _edge_values(fmt)
    constants = _expect_native(fmt, v.device)
    keys = ("E", "M", "BIAS", "EMIN", "EMAX", "MAX_CODE", "HAS_NAN", "NATIVE_MAX")
    out = torch.empty(v.shape, dtype=torch.float32, device=DEVICE)
    _element_values[(triton.cdiv(len(v), 1024),)](v, out, len(v), BLOCK=1024, MAX_VALUE=float(fmt.max),
                                                  **{k: constants[k] for k in keys})
    ref = decode(round_to_codes(v.cpu(), fmt), fmt)
    nan = ref.isnan()
    assert nan.any() and (ref.view(torch.int32) == torch.tensor(0.0).neg().view(torch.int32)).any()
    assert torch.equal(out.cpu().isnan(), nan)
    assert torch.equal(out.cpu()[~nan].view(torch.int32), ref[~nan].view(torch.int32))


@pytest.mark.parametrize("name", ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3", "fp8_e5m2"])
def test_nearest_codes_and_values_by_one_addition_are_the_references(name):
    """The kernels' codes and values rounded to nearest by one fp32 addition (`_nearest_sum`: every
    floating-point element format the GPU does not convert to, and FP8 with that conversion set
    aside, as in Triton's interpreter) are the reference's, bit for bit, for values of every
    kind: random bit patterns over the whole fp32 range, every code's value, the midpoints
    between neighbouring codes (ties to even) and the floats just either side of them,
    subnormals of the format, values past max, ±0 and ±inf. NaN gives the format's NaN code
    and value; a format without one (which the reference refuses NaN for, and whose NaN blocks
    the kernels zero before rounding) gives ±max, its sign kept."""
    fmt = fb.get_format(name)
    v = _edge_values(fmt)
    nan_in = v.isnan().cpu()
    constants = {**format_constants(fmt), "NATIVE_MAX": 0.0}
    codes = torch.empty(v.shape, dtype=torch.uint8, device=DEVICE)
    _element_codes[(triton.cdiv(len(v), 1024),)](v, codes, len(v), BLOCK=1024, **constants)
    codes = codes.cpu()
    keys = ("E", "M", "BIAS", "EMIN", "EMAX", "MAX_CODE", "HAS_NAN", "NATIVE_MAX")
    out = torch.empty(v.shape, dtype=torch.float32, device=DEVICE)
    _element_values[(triton.cdiv(len(v), 1024),)](v, out, len(v), BLOCK=1024, MAX_VALUE=float(fmt.max),
                                                  **{k: constants[k] for k in keys})
    out = out.cpu()
    checked = slice(None) if fmt.has_nan else ~nan_in
    ref_codes = round_to_codes(v.cpu()[checked], fmt)
    assert torch.equal(codes[checked], ref_codes)
    ref = decode(ref_codes, fmt)
    nan = ref.isnan()
    assert nan.any() == fmt.has_nan and (ref.view(torch.int32) == torch.tensor(0.0).neg().view(torch.int32)).any()
    assert torch.equal(out[checked].isnan(), nan)
    assert torch.equal(out[checked][~nan].view(torch.int32), ref[~nan].view(torch.int32))
    if not fmt.has_nan:
        sign = v.cpu()[nan_in].view(torch.int32) < 0
        assert sign.any() and (~sign).any()
        assert torch.equal(codes[nan_in].int(), fmt.max_code | (sign.int() << (fmt.bits - 1)))
        assert torch.equal(out[nan_in], torch.where(sign, -fmt.max, fmt.max))


@pytest.mark.parametrize("size", [16, 32])
def test_both_forms_of_the_kernels_butterfly_give_the_transforms_bits(size):
    """`_hadamard_blocks`' two forms of a butterfly stage — the reductions over an axis of two
    that a GPU compiles, and the split and join that the interpreter runs — each give
    `Hadamard.transform`'s bits: signed zeros (whole blocks of ±0, whose outputs mix +0 and −0),
    NaN, inf, subnormal and ordinary blocks."""
    h = fb.Hadamard(size, seed=4)
    x = torch.from_numpy(hard_matrix(4, size, seed=6, specials=False)).to(DEVICE)
    x[0] = torch.where(torch.arange(size, device=DEVICE) % 3 == 0, -0.0, 0.0)  # a block of signed zeros
    x[1, 0] = float("nan")
    x[1, 1] = float("inf")
    x[2, :4] = torch.tensor([1e-40, -1e-42, 3e-39, -2e-45])
    ref = h.transform(x, dim=-1).view(torch.int32)
    assert (ref[0] == -2**31).any() and (ref[0] == 0).any()  # the block of zeros gives −0 and +0
    for by_split in (False, True):
        both = torch.empty(2, *x.shape, device=DEVICE)
        _butterfly[(1,)](x, both, h.signs_tensor(x.device), h.scale, BC=size, STAGES=size.bit_length() - 1,
                         BY_SPLIT=by_split)
        for out in both:  # the 3-D tile, the 4-D one
            nan = out.isnan()
            assert torch.equal(nan, ref.view(torch.float32).isnan()) and nan[1].all() and not nan[[0, 2, 3]].any()
            assert torch.equal(out.view(torch.int32)[~nan], ref[~nan]), by_split


@pytest.mark.parametrize("name, size", [("mxfp4", 32), ("nvfp4", 16)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_values_of_the_hadamard_transform_made_in_the_kernel(name, size, rounding):
    """The kernel's own Hadamard transform (the weight-gradient operands of mxfp4 and nvfp4)
    gives the bits of `Hadamard.transform` followed by the reference quantizer and dequantizer:
    NaN/inf/zero/subnormal blocks, bf16 and fp32 input, both axes; along an axis that is not a
    multiple of the transform the transform runs first (same bits); NVFP4's tensor scale is the
    transformed tensor's."""
    from fewerbits.kernels import rowblock

    h = fb.Hadamard(size, seed=7)
    x = torch.from_numpy(hard_matrix(64, 64, seed=5, specials=True)).to(DEVICE)
    x[10, 40:] = torch.randn(24) * 1e4  # one large row: its blocks set the tensor amax
    for t in (x, x.bfloat16(), x[:37]):
        for axis in (-1, 0):
            gen = lambda: torch.Generator(device=DEVICE).manual_seed(3)  # noqa: E731
            values, ts = kernels.quantized_values(t, name, rounding=rounding, generator=gen(), axis=axis, hadamard=h)
            q = fb.quantize(h.transform(t, dim=axis), name, rounding=rounding, generator=gen(), axis=axis)
            assert same_values(values, q.dequantize_matrix(torch.bfloat16, tensor_scale=False)), (t.shape, axis)
            assert (ts is None and q.tensor_scale is None) or torch.equal(ts, q.tensor_scale)
    scheme = fb.get_scheme(name)
    assert rowblock.hadamard_fusable(scheme, h, 64) and not rowblock.hadamard_fusable(scheme, h, 37)
    assert not rowblock.hadamard_fusable(scheme, fb.Hadamard(2 * size), 64)
    with pytest.raises(ValueError, match="cannot be fused"):
        rowblock.quantize_rowblocks(x[:, :37], scheme, None, values=True, hadamard=h)


def test_the_transforms_amax_pass_in_both_layouts_is_the_reference_amax():
    """`rowblock.hadamard_amax` (NVFP4's tensor amax under its transform, a read-only pass): as
    the plain tile (TILE_R, NB, BC) and as whole blocks a thread in an fp32 tile (WHOLE, the
    default for a row read, `hadamard_amax_whole`), in the default tiles and in tiles that
    leave ragged rows and columns, bf16 and fp32, the bits of the amax of `Hadamard.transform`
    in fp32; a NaN anywhere makes it NaN, an inf block inf; a column read laid out as rows."""
    from fewerbits.kernels import rowblock

    h = fb.Hadamard(16, seed=3)
    x = torch.from_numpy(hard_matrix(40, 96, seed=9, specials=False)).to(DEVICE)
    x[7, 16:32] = torch.randn(16) * 3e3  # one block holds the amax
    for t in (x, x.bfloat16()):
        ref = h.transform(t.float(), dim=-1).abs().amax()
        assert rowblock.hadamard_amax_whole(t)
        for whole in (False, True, None):
            for tile in ({}, dict(tile_r=16, tile_c=64, num_warps=1), dict(tile_r=2, tile_c=512, num_warps=2)):
                a = rowblock.hadamard_amax(t, h, whole=whole, **tile)
                assert torch.equal(a.view(torch.int32), ref.view(torch.int32)), (t.dtype, whole, tile)
                for special, expect in ((float("nan"), "nan"), (-float("inf"), "inf")):
                    u = t.clone()
                    u[39, 80] = special
                    b = rowblock.hadamard_amax(u, h, whole=whole, **tile)
                    assert b.isnan() if expect == "nan" else b == float("inf"), (t.dtype, whole, tile, special)
        column_read = t.t().contiguous().t()
        assert not rowblock.hadamard_amax_whole(column_read)
        assert torch.equal(rowblock.hadamard_amax(column_read, h).view(torch.int32), ref.view(torch.int32))
        with pytest.raises(ValueError, match="whole"):
            rowblock.hadamard_amax(column_read, h, whole=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        rowblock.hadamard_amax(x[:, :40], h)


def _near_code_midpoints(rows: int, seed: int) -> torch.Tensor:
    """fp32 rows of 1x128 blocks whose quotients by their block's scale lie at or a unit either
    side of E4M3's rounding midpoints (x = fp32(midpoint · scale) and its neighbours; the block's
    first element holds its amax, so its scale is amax / 448, rarely a power of two), plus
    blocks with quotients below fp32's normal range (one of −2^−133 beside 2^30, whose codes
    are −0), zero blocks (one of −0) and NaN / ±inf."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.tensor(fb.get_format("fp8_e4m3").code_values()[:0x7F], dtype=torch.float64)  # 0 … 448
    mids = (v[1:] + v[:-1]) / 2  # every midpoint of neighbouring non-negative codes
    amax = torch.exp2(torch.randint(-20, 20, (rows, 1), generator=gen).double()) * (
        1 + torch.rand(rows, 1, generator=gen, dtype=torch.float64))
    scale = (amax.float() / 448.0).double()  # the reference's fp32 amax / max
    pick = mids[torch.randint(0, len(mids), (rows, 128), generator=gen)]
    x = (pick * scale).float()
    step = torch.randint(-1, 2, (rows, 128), generator=gen)
    x = torch.where(step > 0, torch.nextafter(x, torch.full_like(x, 1e38)),
                    torch.where(step < 0, torch.nextafter(x, torch.zeros_like(x)), x))
    x = x * torch.where(torch.rand(rows, 128, generator=gen) < 0.5, -1.0, 1.0)
    x[:, 0] = amax.float().squeeze(1)
    x[1, 1:] = x[1, 0] * 2.0**-140  # quotients below fp32's normal range
    x[2] = 0.0
    x[6, 0], x[6, 1:64], x[6, 64:] = 2.0**30, -(2.0**-133), -0.0
    x[7] = -0.0
    x[3, 7], x[4, 9], x[5, 11] = float("nan"), float("inf"), -float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fp64_quotient_gives_the_codes_of_the_division(dtype, monkeypatch):
    """Tiles of several fp32-scale blocks divide either by div_rn or as products by each
    block's fp64 reciprocal (`rowblock.fp64_quotient` picks by timing); both give the
    reference's codes and scales: quotients at and a unit either side of every E4M3 rounding
    midpoint, quotients below fp32's normal range, zero blocks, NaN and ±inf; FP8 1x128 read
    along rows and along columns, nearest and stochastic rounding, per-row FP8 with the amax
    found and given."""
    from fewerbits.kernels import rowblock

    x = torch.cat([_near_code_midpoints(24, seed) for seed in range(3)], dim=1).to(dtype).to(DEVICE)
    amax = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(2)).to(DEVICE) * 4
    choice, seen = rowblock.fp64_quotient, set()
    for fp64 in (True, False):
        def chosen(X, as_rows, fp64=fp64):
            seen.add(fp64)
            return fp64
        monkeypatch.setattr(rowblock, "fp64_quotient", chosen)
        for t, axis in ((x, -1), (x.t().contiguous().t(), 0), (x, 0)):
            for rounding in ("nearest", "stochastic"):
                gen = lambda: torch.Generator(device=DEVICE).manual_seed(4)  # noqa: E731
                args = dict(axis=axis, rounding=rounding)
                got = kernels.quantize(t, "fp8_e4m3_1x128", generator=gen(), **args)
                ref = fb.quantize(t, "fp8_e4m3_1x128", generator=gen(), **args)
                assert same(got, ref), (fp64, axis, rounding)
        for a in (None, amax):
            assert same(kernels.quantize(x, "fp8_e4m3_row", amax=a), fb.quantize(x, "fp8_e4m3_row", amax=a)), fp64
    assert seen == {True, False}
    # the choice: the product for 2-byte inputs and column reads, div_rn for fp32 rows
    assert choice(x.float(), False) is False and choice(x.bfloat16(), False) and choice(x.float().t(), True)
