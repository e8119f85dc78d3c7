"""Shared test helpers: the independent oracle (ml_dtypes / numpy) for each element format."""

import os

# one of `pytest -n N`'s processes: one thread each, or N processes' thread pools contend for the cores
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if XDIST_WORKER:
    torch.set_num_threads(1)
if not torch.cuda.is_available():  # Triton kernels run in its interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fewerbits import FORMATS  # noqa: E402

#: numpy dtypes that hold each format, from ml_dtypes: the independent oracle.
ORACLE = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "int8": np.int8,
    "int4": ml_dtypes.int4,
}

#: formats whose casts are checked against the oracle (the issue's list)
CAST_FORMATS = ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "bf16", "fp16"]
SMALL_FORMATS = [n for n, f in FORMATS.items() if f.bits <= 8]


def oracle_cast(x: np.ndarray, name: str, saturate: bool) -> np.ndarray:
    """float32 values of x cast to `name` by ml_dtypes (clipped to ±max first if saturating)."""
    fmt = FORMATS[name]
    if saturate:
        x = np.clip(x, -fmt.max, fmt.max)  # NaN stays NaN
    with np.errstate(all="ignore"):  # overflow to inf/NaN is what is being compared
        return x.astype(ORACLE[name]).astype(np.float32)


def same_bits(a, b) -> np.ndarray:
    """Elementwise: equal float32 bit patterns, any NaN equal to any NaN."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def assert_same_bits(actual, expected, inputs=None):
    actual = actual.numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    ok = same_bits(actual, expected)
    if not ok.all():
        i = np.flatnonzero(~ok.ravel())[:5]
        where = "" if inputs is None else f" inputs {np.asarray(inputs).ravel()[i].tolist()}"
        raise AssertionError(
            f"{(~ok).sum()} of {ok.size} differ;{where} got {actual.ravel()[i].tolist()}, "
            f"expected {np.asarray(expected).ravel()[i].tolist()}"
        )


def all_bf16_values() -> np.ndarray:
    """Every one of the 65,536 bf16 bit patterns, as float32 (inf and NaN included)."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
