"""Block Hadamard transforms: spread outliers before quantizing, leave the product unchanged.

For a GEMM  C = A · Bᵀ  over the inner dimension K, cut K into blocks of h (a power of two) and
multiply every block of both operands by the same orthogonal matrix

    Q = D · H_h / √h          H_h: the Sylvester Hadamard matrix (entries ±1, H Hᵀ = h I)
                              D:   a diagonal of signs (±1), fixed from a seed or given

Then (A Q)(B Q)ᵀ = A Q Qᵀ Bᵀ = A Bᵀ exactly in real arithmetic, while each transformed block
mixes its h values: one large outlier is shared out across the block instead of forcing a
large scale onto it, which is what lets 4-bit formats represent the rest.

A dimension that is not a multiple of h is zero-padded (the padding adds nothing to the
product), and `transform` returns the padded tensor; both operands of a GEMM must be
transformed along their inner dimension with the same `Hadamard`.

`transform` computes x·Q in float32 in one fixed order, so that a kernel can give the same
bits: the signs (exact), the fast Walsh–Hadamard butterfly — log2 h stages; stage s replaces
each pair (y_i, y_{i+s}) with i's bit s clear by (y_i + y_{i+s}, y_i − y_{i+s}), s = 1, 2, 4, … —
then one multiplication by fp32(1/√h) (exact for h = 4, 16, 64, 256).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rounding import device_constant


@dataclass(frozen=True)
class Hadamard:
    """A block Hadamard transform: size h, and the sign vector D (fixed by `seed` or `signs`)."""

    size: int = 16  #: block size h: 16, 32, 64 or 128
    seed: int = 0  #: the sign vector is drawn once from this seed (when `signs` is None)
    signs: tuple[int, ...] | None = None  #: an explicit sign vector of length `size`

    def __post_init__(self):
        if self.size not in _SCALES:
            raise ValueError(f"Hadamard size must be a power of two up to 256, got {self.size}")
        if self.signs is not None:
            signs = tuple(int(s) for s in self.signs)
            if len(signs) != self.size or any(s not in (-1, 1) for s in signs):
                raise ValueError(f"signs must be {self.size} values of +1 or -1")
            object.__setattr__(self, "signs", signs)
        # D and Q, built once here (1/√h: _SCALES): nothing is drawn or cached while a graph is traced
        object.__setattr__(self, "_d", self.signs if self.signs is not None else _draw_signs(self.size, self.seed))
        object.__setattr__(self, "_q", _matrix(self.size, self._d))

    def sign_vector(self) -> tuple[int, ...]:
        """D's diagonal: the explicit signs, or the ones this seed draws."""
        return self._d

    def matrix(self, device=None) -> torch.Tensor:
        """Q = D · H / √h as a float32 (h, h) matrix; Q Qᵀ = I (`transform` is x·Q computed by
        the butterfly, equal to x @ Q up to float32 rounding)."""
        if device is None:
            return self._q
        return device_constant(("hadamard", self.size, self.seed, self.signs), lambda: self._q, device)

    @property
    def scale(self) -> float:
        """fp32(1/√h), the butterfly's last factor."""
        return _SCALES[len(self._d)]  # a constant in a traced graph (see transform)

    def signs_tensor(self, device=None) -> torch.Tensor:
        """D's diagonal as float32 ±1 on `device`. In a graph being traced it is computed on the
        device from the signs' bits: a constant built from a list is copied from the host on
        every call of the compiled graph, and that copy waits for the whole stream."""
        if torch.compiler.is_compiling():
            h = len(self._d)  # the size as a constant of the graph (see transform)
            i = torch.arange(h, device=device)
            word = torch.zeros_like(i)
            for j in range(0, h, 32):  # 32 signs a word: bit k set where sign j + k is −1
                mask = sum(1 << k for k, sign in enumerate(self._d[j:j + 32]) if sign < 0)
                word = torch.where(i // 32 == j // 32, mask, word)
            return (1 - 2 * ((word >> (i % 32)) & 1)).to(torch.float32)
        return device_constant(("hadamard signs", self._d),
                               lambda: torch.tensor(self._d, dtype=torch.float32), device or "cpu")

    def transform(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """x with every block of `size` along `dim` multiplied by Q (float32; `dim` padded), by
        the butterfly in the module docstring."""
        dim = dim % x.dim()
        x = x.float().movedim(dim, -1)
        # the size from the sign vector's length and the factor from a table, not from
        # attributes: compiling a graph again for a transform of another size, torch.compile
        # (2.13) turns a number attribute that changed into a symbolic one, which it then
        # cannot carry into an autograd function's backward
        h = len(self._d)
        pad = -x.shape[-1] % h
        # padded in a traced graph even by nothing: asking whether a symbolic count needs
        # padding splits the counts that are multiples of h from the others, and with the
        # blocks' reshape then specialised a graph to a count of exactly one block (32 tokens
        # of an MoE expert under mxfp4; torch 2.11 then failed to trace, docs/kernels-notes.md v47)
        if torch.compiler.is_compiling() or pad:
            x = torch.nn.functional.pad(x, (0, pad))
        lead = x.shape[:-1]
        y = x.reshape(*lead, x.shape[-1] // h, h) * self.signs_tensor(x.device)
        s = 1
        while s < h:  # stage s: pairs (i, i + s), i's bit s clear
            a, b = y.reshape(*lead, -1, h // (2 * s), 2, s).unbind(-2)
            y = torch.stack((a + b, a - b), dim=-2)
            s *= 2
        out = y.reshape(x.shape) * self.scale
        return out.movedim(-1, dim)


_SCALES = {h: float(torch.tensor(1.0 / math.sqrt(h), dtype=torch.float32)) for h in (2, 4, 8, 16, 32, 64, 128, 256)}


def _draw_signs(size: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (size,), generator=gen)
    return tuple(int(s) for s in (1 - 2 * bits).tolist())


def _matrix(size: int, signs: tuple[int, ...]) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < size:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (torch.tensor(signs, dtype=torch.float32)[:, None] * h) / math.sqrt(size)
