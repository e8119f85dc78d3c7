"""Number formats as data: one frozen `FloatFormat` per format, every limit derived from the layout.

A format with E exponent bits, M mantissa bits and bias b gives a magnitude code c = (e, m)
the value

    e > 0 (normal)       (1 + m / 2^M) · 2^(e − b)
    e = 0 (subnormal)    (m / 2^M) · 2^(1 − b)

and a sign bit in front when the format is signed. What the top codes mean is one of three
conventions ("specials"):

    "ieee"  the whole top binade is reserved: m = 0 is ±inf, m ≠ 0 is NaN
            (fp32, tf32, bf16, fp16, fp8_e5m2)
    "fn"    only the all-ones magnitude code is NaN, there is no inf
            (fp8_e4m3 "fn", and e8m0 where the all-ones code 0xFF is NaN)
    "none"  every code is a finite number (fp6_e3m2, fp6_e2m3, fp4_e2m1, int8, int4)

From (E, M, b, specials) follow `max` (decode the largest finite code), `min_normal`,
`min_subnormal`, `eps` and the rest; nothing below is typed in twice.

Two formats are degenerate cases of the same layout rather than special code paths:
- e8m0 (the MX scale format) is unsigned, has no subnormals and so no zero: code e means
  2^(e − 127) for e = 0…254, and 0xFF is NaN.
- Integers are E = 0 with b = 1 − M: every code is a "subnormal" whose quantum is exactly 1.
  int8 and int4 are symmetric (±127, ±7) so that negation is exact, and their codes are two's
  complement, as in every integer tensor (the code −2^(bits−1) decodes to −128 / −8 but is never
  produced by a cast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import Literal

import torch

Specials = Literal["ieee", "fn", "none"]


@dataclass(frozen=True)
class FloatFormat:
    """An element format: sign, `exp_bits` exponent bits, `man_bits` mantissa bits."""

    name: str  #: registry name, e.g. "fp8_e4m3"
    exp_bits: int  #: exponent field width E
    man_bits: int  #: mantissa (fraction) field width M
    bias: int  #: exponent bias b
    specials: Specials  #: what the top codes mean (see the module docstring)
    signed: bool = True  #: False only for e8m0
    subnormals: bool = True  #: False only for e8m0 (exponent field 0 is then a normal binade)
    torch_dtype_name: str | None = None  #: the torch dtype holding this format, if torch has one

    # -- layout ------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Storage width of one element."""
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def is_integer(self) -> bool:
        return self.exp_bits == 0

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype of this format where torch (this version) has one."""
        return getattr(torch, self.torch_dtype_name, None) if self.torch_dtype_name else None

    # -- derived limits ----------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Exponent of the lowest binade with the regular spacing 2^(emin − M).

        1 − b with subnormals (for integers this is M, so the quantum is 1); −b without.
        """
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def max_code(self) -> int:
        """The largest magnitude code that is a finite number."""
        reserved = {"ieee": 1 << self.man_bits, "fn": 1, "none": 0}[self.specials]
        return (1 << (self.exp_bits + self.man_bits)) - 1 - reserved

    @property
    def max(self) -> float:
        """Largest finite value."""
        return self.decode_magnitude(self.max_code)

    @property
    def emax(self) -> int:
        """Exponent of the binade holding `max` (8 for e4m3, 15 for e5m2, 2 for e2m1)."""
        return math.frexp(self.max)[1] - 1

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value."""
        return self.decode_magnitude(1 if self.subnormals else 0)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (integers have none: their quantum, 1, is reported)."""
        if self.is_integer:
            return 1.0
        return math.ldexp(1.0, self.emin)

    @property
    def eps(self) -> float:
        """Spacing of values just above 1, as `torch.finfo(...).eps`."""
        return math.ldexp(1.0, -self.man_bits)

    @property
    def binades(self) -> float:
        """Dynamic range: log2(max / min_subnormal)."""
        return math.log2(self.max / self.min_subnormal)

    # -- codes -------------------------------------------------------------------------------
    def decode_magnitude(self, code: int) -> float:
        """Value of a magnitude code (no sign bit), ignoring specials. Exact (Python float)."""
        e, m = code >> self.man_bits, code & ((1 << self.man_bits) - 1)
        if e == 0 and self.subnormals:
            return math.ldexp(m, 1 - self.bias - self.man_bits)
        return math.ldexp((1 << self.man_bits) + m, e - self.bias - self.man_bits)

    def decode_code(self, code: int) -> float:
        """Value of one full code (sign included) as a Python float; NaN for NaN codes."""
        if not 0 <= code < (1 << self.bits):
            raise ValueError(f"code {code} is out of range for {self.name} ({self.bits} bits)")
        if self.is_integer:  # two's complement
            return float(code - (1 << self.bits) if code >> (self.bits - 1) else code)
        width = self.exp_bits + self.man_bits
        sign = -1.0 if self.signed and code >> width else 1.0
        mag = code & ((1 << width) - 1)
        if mag > self.max_code:
            if self.has_inf and mag == self.inf_code:
                return sign * math.inf
            return math.nan
        return sign * self.decode_magnitude(mag)

    @property
    def nan_code(self) -> int | None:
        """Magnitude code written for NaN (the quiet NaN for "ieee" formats)."""
        if self.specials == "none":
            return None
        if self.specials == "fn":
            return (1 << (self.exp_bits + self.man_bits)) - 1
        top = ((1 << self.exp_bits) - 1) << self.man_bits
        return top | (1 << (self.man_bits - 1))

    @property
    def inf_code(self) -> int | None:
        """Magnitude code of +inf, where the format has inf."""
        return ((1 << self.exp_bits) - 1) << self.man_bits if self.has_inf else None

    def code_values(self) -> list[float]:
        """Value of every code 0 … 2^bits − 1 (for formats of at most 8 bits)."""
        if self.bits > 8:
            raise ValueError(f"{self.name} has {self.bits} bits; code tables exist for ≤ 8 bits")
        key = (self.exp_bits, self.man_bits, self.bias, self.specials, self.signed, self.subnormals)
        if key not in _CODE_VALUES:
            _CODE_VALUES[key] = tuple(self.decode_code(c) for c in range(1 << self.bits))
        return list(_CODE_VALUES[key])

    def __str__(self) -> str:
        return self.name


_CODE_VALUES: dict[tuple, tuple[float, ...]] = {}  # by layout, filled on first use


def _fmt(name, e, m, bias, specials, dtype=None, **kw) -> FloatFormat:
    return FloatFormat(name, e, m, bias, specials, torch_dtype_name=dtype, **kw)


#: Every format on the ladder, by name. Limits are derived, never typed in.
FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        _fmt("fp32", 8, 23, 127, "ieee", "float32"),
        _fmt("tf32", 8, 10, 127, "ieee"),
        _fmt("bf16", 8, 7, 127, "ieee", "bfloat16"),
        _fmt("fp16", 5, 10, 15, "ieee", "float16"),
        _fmt("fp8_e4m3", 4, 3, 7, "fn", "float8_e4m3fn"),
        _fmt("fp8_e5m2", 5, 2, 15, "ieee", "float8_e5m2"),
        _fmt("fp6_e3m2", 3, 2, 3, "none"),
        _fmt("fp6_e2m3", 2, 3, 1, "none"),
        _fmt("fp4_e2m1", 2, 1, 1, "none"),
        _fmt("e8m0", 8, 0, 127, "fn", "float8_e8m0fnu", signed=False, subnormals=False),
        _fmt("int8", 0, 7, 1 - 7, "none", "int8"),
        _fmt("int4", 0, 3, 1 - 3, "none"),
    )
}


for _f in FORMATS.values():  # fill the code tables now, so that no traced graph mutates them
    if _f.bits <= 8:
        _f.code_values()


def get_format(fmt: str | FloatFormat) -> FloatFormat:
    """Look a format up by name (a `FloatFormat` passes through)."""
    if isinstance(fmt, FloatFormat):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}"
        ) from None
