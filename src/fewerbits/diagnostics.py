"""Numerics diagnostics: how far a low-precision tensor is from its high-precision original.

    SQNR (dB) = 10 · log10( Σ x² / Σ (x − x̂)² )      signal-to-quantization-noise ratio

Each extra mantissa bit is worth about 6 dB; block scaling buys back what a tensor-wide scale
loses to outliers.
"""

from __future__ import annotations

import math

import torch


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """SQNR of `approx` against `reference` in dB, computed in float64 (inf if identical)."""
    ref = reference.detach().double()
    noise = (ref - approx.detach().double()).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise)
