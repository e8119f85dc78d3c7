"""The `fewerbits` command line. Thin: parse, call the library, print."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from . import __version__
from .formats import FORMATS, FloatFormat
from .hardware import device_name, native_matmul, resolve_device


def _pow2_text(v: float) -> str:
    m, e = math.frexp(v)
    return f"2^{e - 1}" if m == 0.5 else f"{v:g}"


def format_rows(device: torch.device) -> list[dict]:
    """One dict per format: its layout, derived limits and native support on `device`."""
    rows = []
    for f in FORMATS.values():
        rows.append(
            {
                "format": f.name,
                "bits": f.bits,
                "exp_bits": f.exp_bits,
                "man_bits": f.man_bits,
                "bias": None if f.is_integer else f.bias,
                "max": f.max,
                "min_normal": None if f.is_integer else f.min_normal,
                "min_subnormal": f.min_subnormal,
                "binades": f.binades,
                "inf": f.has_inf,
                "nan": f.has_nan,
                "torch_dtype": str(f.torch_dtype).removeprefix("torch.") if f.torch_dtype else None,
                "native_matmul": native_matmul(f.name, device),
            }
        )
    return rows


def _cell(key: str, v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in ("min_normal", "min_subnormal"):
        return _pow2_text(v)
    if key == "binades":
        return f"{v:.1f}"
    if key == "max":
        return f"{v:.6g}"
    return str(v)


def print_table(rows: list[dict], headers: dict[str, str], out=None) -> None:
    """Plain-text table: `headers` maps row keys to column titles."""
    out = out or sys.stdout
    cells = [[_cell(k, r[k]) for k in headers] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers.values())]
    line = lambda items: "  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(items, widths)))  # noqa: E731
    print(line(list(headers.values())), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for c in cells:
        print(line(c), file=out)


FORMAT_HEADERS = {
    "format": "format",
    "bits": "bits",
    "exp_bits": "E",
    "man_bits": "M",
    "bias": "bias",
    "max": "max",
    "min_normal": "min normal",
    "min_subnormal": "min subnormal",
    "binades": "binades",
    "inf": "inf",
    "nan": "NaN",
    "torch_dtype": "torch dtype",
    "native_matmul": "native matmul",
}


def cmd_formats(args) -> int:
    device = resolve_device(args.device)
    rows = format_rows(device)
    if args.json:
        json.dump({"device": device_name(device), "formats": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"fewerbits {__version__} · torch {torch.__version__} · {device_name(device)}")
    print("Every limit is derived from (exponent bits, mantissa bits, bias, inf/NaN rule).\n")
    print_table(rows, FORMAT_HEADERS)
    print(
        "\nbinades = log2(max / min subnormal). int8/int4 are symmetric (±127, ±7); "
        "e8m0 is the unsigned MX scale format (no zero, 0xFF = NaN).\n"
        "native matmul: tensor-core (or CPU matrix-unit) support on this device; "
        "where it says no, fewerbits emulates."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fewerbits", description="Train language models with fewer bits."
    )
    parser.add_argument("--version", action="version", version=f"fewerbits {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("formats", help="print the table of number formats, derived from their layouts")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (for the native-support column)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_formats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"fewerbits: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
