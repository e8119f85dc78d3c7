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
