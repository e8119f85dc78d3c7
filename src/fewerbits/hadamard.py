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
        if self.size not in (2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"Hadamard size must be a power of two up to 256, got {self.size}")
        if self.signs is not None:
            signs = tuple(int(s) for s in self.signs)
            if len(signs) != self.size or any(s not in (-1, 1) for s in signs):
                raise ValueError(f"signs must be {self.size} values of +1 or -1")
            object.__setattr__(self, "signs", signs)
        # Q, built once here: nothing is drawn or cached while a graph is being traced
        object.__setattr__(self, "_q", _matrix(self.size, self.sign_vector()))

    def sign_vector(self) -> tuple[int, ...]:
        """D's diagonal: the explicit signs, or the ones this seed draws."""
        if self.signs is not None:
            return self.signs
        gen = torch.Generator().manual_seed(self.seed)
        bits = torch.randint(0, 2, (self.size,), generator=gen)
        return tuple(int(s) for s in (1 - 2 * bits).tolist())

    def matrix(self, device=None) -> torch.Tensor:
        """Q = D · H / √h as a float32 (h, h) matrix; Q Qᵀ = I."""
        if device is None:
            return self._q
        return device_constant(("hadamard", self.size, self.seed, self.signs), lambda: self._q, device)

    def transform(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """x with every block of `size` along `dim` multiplied by Q (float32; `dim` padded)."""
        dim = dim % x.dim()
        x = x.float().movedim(dim, -1)
        pad = -x.shape[-1] % self.size
        if pad:
            x = torch.nn.functional.pad(x, (0, pad))
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // self.size, self.size)
        out = (blocks @ self.matrix(x.device)).reshape(x.shape)
        return out.movedim(-1, dim)


def _matrix(size: int, signs: tuple[int, ...]) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < size:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (torch.tensor(signs, dtype=torch.float32)[:, None] * h) / math.sqrt(size)
