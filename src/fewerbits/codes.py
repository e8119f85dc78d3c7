"""Bit codes: `encode` values to one uint8 code per element, `decode` back, and sub-byte packing.

A code is the format's bit pattern, right-aligned in a uint8: sign, exponent field, mantissa
field (integers: two's complement; e8m0: the biased exponent). `decode` is a lookup in the table
of all 2^bits values that `FloatFormat.code_values()` derives from the layout.

Packing along the last dimension, least significant bits first:

    fp4 / int4   two codes per byte:   byte = c0 | c1 << 4                 (c0 in the low nibble)
    fp6          four codes per three bytes, one 24-bit little-endian word
                 w = c0 | c1 << 6 | c2 << 12 | c3 << 18,   bytes = w & 0xFF, w >> 8 & 0xFF, w >> 16
    8-bit        one code per byte (no change)

A last dimension that does not fill the final group is padded with zero codes; `unpack` takes
the real length back.
"""

from __future__ import annotations

import math

import torch

from .formats import FloatFormat, get_format
from .rounding import check_code_width, check_float_tensor, device_constant, in_chunks, round_to_codes, work_dtype


def encode(x: torch.Tensor, fmt: str | FloatFormat) -> torch.Tensor:
    """One uint8 code per element of `x`, after a round-to-nearest-even saturating cast."""
    fmt = get_format(fmt)
    check_float_tensor(x)
    check_code_width(fmt)
    dtype = work_dtype(x.dtype, fmt)
    return in_chunks(lambda v: round_to_codes(v.to(dtype), fmt), x.detach())


def decode(codes: torch.Tensor, fmt: str | FloatFormat) -> torch.Tensor:
    """Values (float32) of uint8 codes of `fmt`."""
    fmt = get_format(fmt)
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex():
        raise TypeError("codes must be an integer tensor (uint8 codes from encode)")
    table = code_table(fmt, codes.device)
    every_code_valid = codes.dtype == torch.uint8 and len(table) == 256  # nothing to check
    checked = codes.numel() and not every_code_valid and not torch.compiler.is_compiling()
    if checked and (int(codes.min()) < 0 or int(codes.max()) >= len(table)):
        raise ValueError(f"codes out of range for {fmt.name}: must lie in [0, {len(table) - 1}]")
    return table[codes.to(torch.int64)]


def code_table(fmt: FloatFormat, device) -> torch.Tensor:
    """float32 value of every code of `fmt` (2^bits entries), cached per device."""
    return device_constant(("codes", fmt), lambda: torch.tensor(fmt.code_values(), dtype=torch.float32), device)


def _group(bits: int) -> tuple[int, int]:
    """(codes per group, bytes per group) for packing `bits`-wide codes."""
    if bits not in (4, 6, 8):
        raise ValueError(f"packing supports 4-, 6- and 8-bit codes, not {bits}-bit")
    nbits = math.lcm(bits, 8)
    return nbits // bits, nbits // 8


def packed_size(n: int, bits: int) -> int:
    """Bytes that `n` codes of `bits` bits take when packed."""
    per, nbytes = _group(bits)
    return -(-n // per) * nbytes


def _bits_of(fmt_or_bits: int | str | FloatFormat) -> int:
    return fmt_or_bits if isinstance(fmt_or_bits, int) else get_format(fmt_or_bits).bits


def pack(codes: torch.Tensor, fmt: int | str | FloatFormat) -> torch.Tensor:
    """Pack uint8 codes along the last dimension (format or bit width: 4, 6 or 8)."""
    bits = _bits_of(fmt)
    per, nbytes = _group(bits)
    c = codes.to(torch.uint8)
    if per == 1:
        return c
    pad = -c.shape[-1] % per
    if pad:
        c = torch.nn.functional.pad(c, (0, pad))
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)  # (..., groups, codes per group)
    # byte arithmetic on the one-byte codes (a shift left drops what leaves the byte, as the
    # word's `& 0xFF` does): a few passes of one byte an element, no 32-bit word
    if bits == 4:
        out = c[..., 0] | (c[..., 1] << 4)
    else:  # 6 bits: the word's three bytes
        c0, c1, c2, c3 = c.unbind(-1)
        out = torch.stack((c0 | (c1 << 6), (c1 >> 2) | (c2 << 4), (c2 >> 4) | (c3 << 2)), dim=-1)
    return out.reshape(*codes.shape[:-1], c.shape[-2] * nbytes)


def unpack(packed: torch.Tensor, fmt: int | str | FloatFormat, n: int) -> torch.Tensor:
    """Inverse of `pack`: the first `n` codes of each row along the last dimension."""
    bits = _bits_of(fmt)
    per, nbytes = _group(bits)
    if per == 1:
        return packed[..., :n]
    if packed.shape[-1] != packed_size(n, bits):
        raise ValueError(
            f"{packed.shape[-1]} packed bytes do not hold {n} codes of {bits} bits "
            f"(expected {packed_size(n, bits)} bytes)"
        )
    b = packed.to(torch.uint8)
    if bits == 4:
        c = torch.stack((b & 0x0F, b >> 4), dim=-1)
    else:  # 6 bits: four codes from each three bytes
        b0, b1, b2 = b.reshape(*b.shape[:-1], b.shape[-1] // nbytes, nbytes).unbind(-1)
        c = torch.stack((b0 & 0x3F, (b0 >> 6) | ((b1 & 0x0F) << 2), (b1 >> 4) | ((b2 & 0x03) << 4), b2 >> 2), dim=-1)
    return c.reshape(*packed.shape[:-1], c.shape[-2] * per)[..., :n]
