"""What this machine can multiply natively: tensor-core (or CPU matrix-unit) support per format.

On CUDA the answer is a range of compute capabilities, from the architecture manuals:

    fp32                 every GPU
    fp16                 7.0+ (Volta tensor cores)
    bf16, tf32           8.0+ (Ampere)
    int8                 7.5+ (Turing)
    int4                 7.5 to 8.x (Turing, Ampere, Ada; Hopper dropped int4 MMA)
    fp8_e4m3, fp8_e5m2   8.9+ (Ada, Hopper: torch._scaled_mm)
    fp6, fp4 (MX, NVFP4) 10.0+ (Blackwell block-scaled MMA); on Hopper they are emulated

On CPU, fp32 always, and bf16 / fp16 where oneDNN reports the instructions (AVX512-BF16, AMX).
e8m0 is a scale format, never a matrix operand, so it has no entry.
"""

from __future__ import annotations

import torch

# format -> (first capability with native MMA, first capability without it again)
_CUDA_NATIVE: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    "fp32": ((0, 0), None),
    "tf32": ((8, 0), None),
    "bf16": ((8, 0), None),
    "fp16": ((7, 0), None),
    "fp8_e4m3": ((8, 9), None),
    "fp8_e5m2": ((8, 9), None),
    "fp6_e3m2": ((10, 0), None),
    "fp6_e2m3": ((10, 0), None),
    "fp4_e2m1": ((10, 0), None),
    "int8": ((7, 5), None),
    "int4": ((7, 5), (9, 0)),
}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" means cuda when a GPU is visible, else cpu. A device other than cpu or cuda[:N], a
    missing GPU, or a GPU index past the last is an error (ValueError, RuntimeError)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = str(device)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not one fewerbits runs on: auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device '{device}' was asked for, but torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def _cpu_flag(name: str) -> bool:
    check = getattr(torch.ops.mkldnn, name, None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def native_matmul(fmt_name: str, device: str | torch.device = "auto") -> bool | None:
    """True if `device` multiplies `fmt_name` matrices natively; None if not applicable."""
    device = resolve_device(device)
    if device.type == "cuda":
        if fmt_name not in _CUDA_NATIVE:
            return None
        cap = torch.cuda.get_device_capability(device)
        first, stop = _CUDA_NATIVE[fmt_name]
        return cap >= first and (stop is None or cap < stop)
    if fmt_name == "e8m0":
        return None
    if fmt_name == "fp32":
        return True
    if fmt_name == "bf16":
        return _cpu_flag("_is_mkldnn_bf16_supported")
    if fmt_name == "fp16":
        return _cpu_flag("_is_mkldnn_fp16_supported")
    return False


def device_name(device: str | torch.device = "auto") -> str:
    device = resolve_device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
    return f"CPU ({torch.backends.cpu.get_cpu_capability()})"
