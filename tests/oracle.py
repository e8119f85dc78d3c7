"""An independent reference for block-scaled quantization: numpy float32 arithmetic, ml_dtypes
casts, one Python loop iteration per block. It shares no code with fewerbits; it restates the
formulas of DESIGN.md §3 (and, for NVFP4, Transformer Engine's reference quantizer)."""

import numpy as np

from conftest import ORACLE

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def _elements(v: np.ndarray, elem) -> np.ndarray:
    """Round float values to the element format with ml_dtypes, after clipping to ±max."""
    if elem.is_integer:  # numpy's round is half to even; ml_dtypes' int casts truncate
        return np.clip(np.round(v), -elem.max, elem.max).astype(np.float32) + np.float32(0)  # no -0
    with np.errstate(invalid="ignore"):
        return np.clip(v, -elem.max, elem.max).astype(ORACLE[elem.name]).astype(np.float32)


def _pow2_exponent(amax: float, elem, rule: str) -> float:
    if not amax > 0:
        return -np.inf
    if rule == "rceil":
        v = F32(amax) * (F32(1) / F32(elem.max))  # fp32 product; may underflow to 0
        if v == 0:
            return -np.inf
        m, e = np.frexp(np.float64(v))
        return (e - 1) + (m != 0.5)
    m, e = np.frexp(np.float64(amax))  # amax = m · 2^e, m in [0.5, 1)
    if rule == "even":
        kept = np.round(m * 2 ** (elem.man_bits + 1)) / 2 ** (elem.man_bits + 1)  # half to even
        m, e2 = np.frexp(kept)
        e = e + e2
    k = e - 1
    if rule == "ceil":
        k += m != 0.5
    return k - elem.emax


def quantize_oracle(x: np.ndarray, scheme):
    """(dequantized float32 (R, C), block decode scales float32, tensor decode scale or None)."""
    elem, (br, bc) = scheme.elem, scheme.block
    rows, cols = x.shape
    br = max(rows, 1) if br == -1 else br
    bc = max(cols, 1) if bc == -1 else bc
    nbr, nbc = -(-rows // br), -(-cols // bc)
    out = np.zeros_like(x, dtype=np.float32)
    scales = np.zeros((nbr, nbc), dtype=np.float32)
    tensor_scale = None
    with np.errstate(all="ignore"):
        if scheme.two_level:
            tamax = F32(np.max(np.abs(x))) if x.size else F32(0)
            s_enc = min(F32(scheme.scale_fmt.max * elem.max) / tamax, FLT_MAX)
            if tamax == 0 or not np.isfinite(s_enc) or s_enc == 0:
                s_enc = F32(1)
            s_enc = F32(s_enc)
            tensor_scale = F32(1) / s_enc
        for i in range(nbr):
            for j in range(nbc):
                blk = x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
                amax = F32(np.max(np.abs(blk)))
                if scheme.two_level:
                    raw = min(amax * (s_enc * (F32(1) / F32(elem.max))), FLT_MAX)
                    raw = np.clip(F32(raw), -448, 448)
                    s = np.array([raw], F32).astype(ORACLE["fp8_e4m3"]).astype(F32)[0]
                    enc = F32(min(F32(1) / (s * tensor_scale), FLT_MAX))
                    deq = (_elements(blk * enc, elem) * s) * tensor_scale
                elif scheme.pow2:
                    k = _pow2_exponent(float(amax), elem, scheme.scale_rule)
                    k = np.clip(k, scheme.scale_fmt.emin, scheme.scale_fmt.emax)
                    s = F32(np.ldexp(1.0, int(k)))
                    deq = _elements(blk.astype(np.float64) / np.float64(s), elem) * s
                else:
                    s = max(amax / F32(elem.max), F32(2.0**-126))
                    deq = _elements(blk / s, elem) * s
                if not np.isfinite(amax):
                    s, deq = F32(np.nan), np.full_like(blk, np.nan)
                scales[i, j] = s
                out[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = deq
    return out, scales, tensor_scale
