"""Schemes: how one tensor is quantized, and the registry of named schemes.

A scheme is four choices (DESIGN.md §2):

    element format   what each value is rounded to (fp8_e4m3, fp4_e2m1, …)
    block            (rows, cols) of one scaling block in the tensor's 2-D view, blocks running
                     along the last dimension; -1 means "the whole extent": (-1, -1) is one scale
                     per tensor, (1, -1) one per row
    scale format     fp32 (any scale), e8m0 (powers of two: OCP MX), or fp8_e4m3 (NVFP4's
                     two-level scheme: an E4M3 scale per block times one fp32 scale per tensor)
    scale rule       "amax": decode scale = amax / element max, in fp32;
                     "floor", "rceil", "ceil", "even": power-of-two scales (scaling.py);
                     fp32 scales accept these too, which is how power-of-two fp32 scales are asked for

The named schemes:

    fp8_e4m3_tensor, fp8_e5m2_tensor   one fp32 scale per tensor
    fp8_e4m3_row                       one fp32 scale per row
    fp8_e4m3_1x128, fp8_e4m3_128x128   DeepSeek-V3 tiles (arXiv 2412.19437 §3.3), fp32 scales
    mxfp8_e4m3, mxfp8_e5m2,            OCP MX v1.0: 32 elements per E8M0 scale, "floor" rule
    mxfp6_e3m2, mxfp6_e2m3, mxfp4        (the MX spec's; pass scale_rule="rceil" for TE/cuBLAS)
    nvfp4, nvfp4_16x16                 NVFP4 (arXiv 2509.25149): E2M1, E4M3 scales per 1x16 or
                                       16x16 block, and an fp32 per-tensor scale
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from .formats import FORMATS, FloatFormat, get_format

ScaleRule = Literal["amax", "floor", "rceil", "ceil", "even"]
POW2_RULES = ("floor", "rceil", "ceil", "even")
SCALE_RULES = ("amax",) + POW2_RULES
SCALE_FORMATS = ("fp32", "e8m0", "fp8_e4m3")


@dataclass(frozen=True)
class Scheme:
    """One operand's quantization: element format, scaling block, scale format and rule."""

    elem: FloatFormat  #: element format (a name is accepted and looked up)
    block: tuple[int, int]  #: (rows, cols) of a scaling block of the 2-D view; -1 = whole extent
    scale_fmt: FloatFormat = FORMATS["fp32"]  #: fp32, e8m0 or fp8_e4m3 (two-level)
    scale_rule: ScaleRule = "amax"  #: how a block's amax becomes its scale
    name: str = "custom"  #: registry name, for messages and reports

    def __post_init__(self):
        elem, scale_fmt = get_format(self.elem), get_format(self.scale_fmt)
        object.__setattr__(self, "elem", elem)
        object.__setattr__(self, "scale_fmt", scale_fmt)
        object.__setattr__(self, "block", tuple(self.block))
        if elem.bits > 8 or not elem.signed or not elem.has_zero:
            raise ValueError(
                f"scheme element format must be a signed format of at most 8 bits, not {elem.name}"
            )
        if len(self.block) != 2 or any(
            not isinstance(b, int) or (b < 1 and b != -1) for b in self.block
        ):
            raise ValueError(f"block must be two sizes ≥ 1 (or -1 for a whole extent), got {self.block}")
        if scale_fmt.name not in SCALE_FORMATS:
            raise ValueError(
                f"scale format must be one of {', '.join(SCALE_FORMATS)}, not {scale_fmt.name}"
            )
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(
                f"unknown scale rule {self.scale_rule!r}; valid: {', '.join(SCALE_RULES)}"
            )
        if scale_fmt.name == "e8m0" and self.scale_rule not in POW2_RULES:
            raise ValueError(f"e8m0 scales need a power-of-two rule: {', '.join(POW2_RULES)}")
        if self.two_level and self.scale_rule != "amax":
            raise ValueError("fp8_e4m3 (two-level) scales are computed by the NVFP4 rule: use 'amax'")

    @property
    def two_level(self) -> bool:
        """E4M3 block scales under one fp32 per-tensor scale (NVFP4)."""
        return self.scale_fmt.name == "fp8_e4m3"

    @property
    def pow2(self) -> bool:
        """Scales are powers of two."""
        return self.scale_rule in POW2_RULES

    @property
    def is_2d(self) -> bool:
        """Blocks span more than one row (128x128, 16x16, per tensor)."""
        return self.block[0] != 1

    def with_rule(self, scale_rule: str | None) -> Scheme:
        """The same scheme with another scale rule (None: unchanged)."""
        return self if scale_rule is None or scale_rule == self.scale_rule else replace(self, scale_rule=scale_rule)

    def describe(self) -> str:
        blk = {(-1, -1): "tensor", (1, -1): "row"}.get(self.block, "{}x{}".format(*self.block))
        return f"{self.elem.name}, {blk} blocks, {self.scale_fmt.name} scales ({self.scale_rule})"

    def __str__(self) -> str:
        return self.name


def _s(name, elem, block, scale_fmt="fp32", rule="amax") -> Scheme:
    return Scheme(elem, block, scale_fmt, rule, name)


#: The named schemes (see the module docstring).
SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        _s("fp8_e4m3_tensor", "fp8_e4m3", (-1, -1)),
        _s("fp8_e5m2_tensor", "fp8_e5m2", (-1, -1)),
        _s("fp8_e4m3_row", "fp8_e4m3", (1, -1)),
        _s("fp8_e4m3_1x128", "fp8_e4m3", (1, 128)),
        _s("fp8_e4m3_128x128", "fp8_e4m3", (128, 128)),
        _s("mxfp8_e4m3", "fp8_e4m3", (1, 32), "e8m0", "floor"),
        _s("mxfp8_e5m2", "fp8_e5m2", (1, 32), "e8m0", "floor"),
        _s("mxfp6_e3m2", "fp6_e3m2", (1, 32), "e8m0", "floor"),
        _s("mxfp6_e2m3", "fp6_e2m3", (1, 32), "e8m0", "floor"),
        _s("mxfp4", "fp4_e2m1", (1, 32), "e8m0", "floor"),
        _s("nvfp4", "fp4_e2m1", (1, 16), "fp8_e4m3"),
        _s("nvfp4_16x16", "fp4_e2m1", (16, 16), "fp8_e4m3"),
    )
}


def get_scheme(scheme: str | Scheme, scale_rule: str | None = None) -> Scheme:
    """Look a scheme up by name (a `Scheme` passes through), optionally with another rule."""
    if not isinstance(scheme, Scheme):
        try:
            scheme = SCHEMES[scheme]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}"
            ) from None
    return scheme.with_rule(scale_rule)
