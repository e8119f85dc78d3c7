"""Codes: encode/decode round trips and the fp4 / fp6 packing layouts."""

import pytest
import torch

from fewerbits import FORMATS, cast, decode, encode, pack, quantize, unpack
from fewerbits.codes import packed_size


def test_fp4_packing_layout():
    codes = torch.tensor([[0x1, 0x2, 0xF]], dtype=torch.uint8)
    packed = pack(codes, "fp4_e2m1")
    assert packed.tolist() == [[0x21, 0x0F]]  # first code in the low nibble; odd length padded
    assert torch.equal(unpack(packed, "fp4_e2m1", 3), codes)


def test_fp6_packing_layout():
    codes = torch.tensor([1, 2, 3, 4, 63], dtype=torch.uint8)
    packed = pack(codes, "fp6_e2m3")
    word = 1 | 2 << 6 | 3 << 12 | 4 << 18
    assert packed.tolist() == [word & 0xFF, word >> 8 & 0xFF, word >> 16, 63, 0, 0]
    assert torch.equal(unpack(packed, 6, 5), codes)


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 31, 64, 99])
def test_pack_round_trip(bits, n):
    codes = torch.randint(0, 1 << bits, (7, n), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (7, packed_size(n, bits))
    assert packed.shape[-1] * 8 >= n * bits and packed.shape[-1] * 8 < n * bits + 24
    assert torch.equal(unpack(packed, bits, n), codes)


def test_pack_empty_and_errors():
    assert pack(torch.zeros(0, 5, dtype=torch.uint8), 4).shape == (0, 3)
    with pytest.raises(ValueError, match="4-, 6- and 8-bit"):
        pack(torch.zeros(4, dtype=torch.uint8), 5)
    with pytest.raises(ValueError, match="do not hold"):
        unpack(torch.zeros(4, dtype=torch.uint8), "fp4_e2m1", 9)


def test_quantized_data_is_packed_codes():
    x = torch.randn(8, 64)
    q = quantize(x, "mxfp6_e3m2")
    assert q.data.shape == (8, 48)
    assert torch.equal(pack(q.codes(), "fp6_e3m2"), q.data)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp6_e2m3", "fp4_e2m1", "int4"])
def test_encode_is_cast_then_code(name):
    fmt = FORMATS[name]
    x = (torch.rand(10_000) * 2 - 1) * fmt.max * 1.2  # some overflow, to be saturated
    codes = encode(x, fmt)
    assert codes.dtype == torch.uint8 and int(codes.max()) < 1 << fmt.bits
    assert torch.equal(decode(codes, fmt), cast(x, fmt))


def test_decode_errors():
    with pytest.raises(ValueError, match="out of range"):
        decode(torch.tensor([16]), "fp4_e2m1")
    with pytest.raises(TypeError, match="integer tensor"):
        decode(torch.tensor([1.0]), "fp4_e2m1")
    assert decode(torch.tensor([0x7F], dtype=torch.uint8), "fp8_e4m3").isnan().all()
