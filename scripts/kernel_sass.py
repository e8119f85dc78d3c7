"""Static machine code of the one-read kernel's variants (values, or codes), compiled for Hopper without a GPU.

    python3 scripts/kernel_sass.py [--schemes mxfp8_e4m3 mxfp4 nvfp4] [--arch 90]
    python3 scripts/kernel_sass.py --codes [--schemes fp8_e4m3_1x128 fp8_e4m3_128x128 mxfp8_e4m3]

For each scheme, with and without stochastic rounding and the kernel's own Hadamard transform,
and for both ways the kernel reads its input — along rows (the inner dimension contiguous in
memory: `quantize(x, axis=-1)`) and along columns (a transposed view, `axis=0`: the weight-
gradient operands) — it compiles `kernels/rowblock.py`'s `_rowblock_kernel` with Triton's own
compiler and ptxas (both in the triton wheel) and prints, per variant, the SASS instruction
count of the whole kernel and per element (one tile of the library's choice,
`rowblock.default_tile`, for a row read and for a column read laid out as a row read,
`rowblock.column_read_as_rows`, its rows loaded two at a time where the library does so,
`rowblock.column_read_in_pairs`; the rows of a row-major copy where the library transposes a
column read first, `rowblock.column_read_transposed_first`; a bf16 row read worked two elements
a word where the library does so for that architecture, `rowblock.row_read_in_lanes`, and a
column read two rows a word, `column_read_in_lanes`; whole blocks a thread where the library
takes them, in lanes, `rowblock.row_read_whole`, or in an fp32 tile, `row_read_whole_fp32`, or
down a column read's memory rows, `column_read_whole`, by `_column_whole_kernel`), the
registers a thread, the
shared memory, and the instructions that move the tile between layouts (STS/LDS through shared
memory, BAR barriers, SHFL lane shuffles); "ALU an element" counts those of the ALU pipe's kinds
(`ALU`), the pipe that bounds FP4's codes on the H200.

FP8 elements are rounded by the GPU's conversion where the target has one (from
`cast.native_fp8_on`: sm_89 on), as the library does on such a GPU (`cast.native_fp8`).

With --codes it compiles the codes instead (`kernels.quantize`'s one-read path), for bf16 and
fp32 inputs, with the layout, tile and warps `rowblock.quantize_rowblocks` picks
(`rowblock.tile_of`): 1 × bc column reads laid out as rows (bf16 ones two rows a load, but
FP6), square blocks read down columns from the transpose (`rowblock.square_column_read_transposed`),
FP4 and FP6 codes of bf16 two elements a word (`rowblock.row_read_in_lanes`,
`column_read_in_lanes`).

These are static counts, not a timing: a count that grows, or barriers and shared memory that
appear, show where a variant does more work per element; only the GPU says how much that costs.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import tempfile

import torch
import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fewerbits.hadamard import Hadamard
from fewerbits.kernels import rowblock
from fewerbits.kernels.cast import format_constants, native_fp8_on
from fewerbits.schemes import get_scheme

KERNEL = rowblock._rowblock_kernel
DOWN_KERNEL = rowblock._column_whole_kernel
POINTERS = {"x_ptr": "*i16", "seed_ptr": "*i64", "out_ptr": "*bf16", "scale_ptr": "*u8",
            "tensor_scales_ptr": "*fp32", "amax_ptr": "*fp32", "signs_ptr": "*fp32", "s_dec_ptr": "*fp32",
            "elem_table": "*fp32"}
FLOATS = {"elem_max", "rcp_max", "h_scale", "enc_numerator"}
SHOWN = ("STS", "LDS", "BAR", "SHFL", "LDG", "STG")
# Opcodes taken as the SM's ALU pipe's (integer and logic operations, comparisons, selects,
# min/max, byte permutes): on the H200 that pipe, at half the issue rate, bounds FP4's codes
# (docs/kernels-notes.md, v67). The split is a reading of the profile, not NVIDIA's table: IMAD
# and the fp32, fp16 and bf16 arithmetic go to the FMA pipes and are not counted.
ALU = frozenset({"LOP3", "SHF", "IADD3", "SEL", "FSEL", "ISETP", "FSETP", "PLOP3", "VIMNMX", "VIMNMX3", "FMNMX",
                 "HMNMX2", "PRMT", "SGXT", "LEA", "P2R", "R2P", "VIADD", "MOV", "BMSK", "FLO", "POPC", "IABS"})


def down(scheme_name: str, hadamard: bool, along: str, stochastic: bool = False) -> bool:
    """Whether the library makes the values of this bf16 column read with whole blocks a thread
    down the memory's rows (`rowblock.column_read_whole`: `_column_whole_kernel`)."""
    s = get_scheme(scheme_name)
    h = Hadamard(s.block[1]) if hadamard else None
    view = torch.empty(128, 16, dtype=torch.bfloat16).t()
    return along == "cols" and rowblock.column_read_whole(view, s, True, h, stochastic)


def copied_first(scheme_name: str, hadamard: bool, along: str, stochastic: bool = False) -> bool:
    """Whether the library reads a row-major copy of this column read (made by the tiled
    transpose: `rowblock.column_read_transposed_first`), so the kernel reads rows."""
    s = get_scheme(scheme_name)
    h = Hadamard(s.block[1]) if hadamard else None
    return (along == "cols" and not down(scheme_name, hadamard, along, stochastic)
            and rowblock.column_read_transposed_first(torch.empty(128, 16).t(), s, True, h))


def tile(scheme_name: str, hadamard: bool, along: str, stochastic: bool = False,
         arch: int = 90) -> tuple[bool, int, int, int, bool, bool]:
    """(as_rows, tile rows, tile columns, warps, lanes, whole) as the library picks them for the
    values of a (large) bf16 matrix read along rows or columns, compiled for sm_`arch` (whole
    blocks down the columns, `down`: a column of blocks, `COLUMN_WHOLE_TILES`)."""
    s = get_scheme(scheme_name)
    if down(scheme_name, hadamard, along, stochastic):
        rows, warps = rowblock.COLUMN_WHOLE_TILES[stochastic]
        return False, rows, s.block[1], warps, False, False
    if copied_first(scheme_name, hadamard, along, stochastic):
        along = "rows"
    view = torch.empty(16, 128, dtype=torch.bfloat16)
    view = view if along == "rows" else view.t()
    h = Hadamard(s.block[1]) if hadamard else None
    as_rows = rowblock.column_read_as_rows(view, s, h)
    capability = divmod(arch, 10)
    lanes = (rowblock.row_read_in_lanes(view, s, True, h, stochastic, capability) if along == "rows" else
             as_rows and rowblock.column_read_in_lanes(view, s, True, h, stochastic, capability))
    whole = (rowblock.row_read_whole(view, s, True) if lanes else
             not as_rows and rowblock.row_read_whole_fp32(view, s, True, h, stochastic))
    rows, cols, warps = rowblock.tile_of(view, s, True, as_rows, False, lanes, whole)
    return as_rows, rows, cols, warps, lanes, whole


def compile_variant(scheme_name: str, stochastic: bool, hadamard: bool, along: str, arch: int):
    """The compiled kernel of one variant: along "rows" (unit column stride) or "cols"."""
    s = get_scheme(scheme_name)
    elem, bc = s.elem, s.block[1]
    as_rows, tile_r, tile_c, warps, lanes, whole = tile(scheme_name, hadamard, along, stochastic, arch)
    native_max = float(elem.max) if native_fp8_on(elem, divmod(arch, 10)) else 0.0
    if down(scheme_name, hadamard, along, stochastic):  # `_column_whole_kernel`, as the library launches it
        constants = dict(
            BC=bc, TILE_R=tile_r, RULE=rowblock.RULES[rowblock.rule_of(s)], KMIN=s.scale_fmt.emin,
            KMAX=s.scale_fmt.emax, EMAX_ELEM=elem.emax, PACK=2 if elem.bits == 4 else 1, MAX_VALUE=float(elem.max),
            SCALE_CODES=s.scale_fmt.bits <= 8, X_BF16=True, H_STAGES=bc.bit_length() - 1 if hadamard else 0,
            H_SPLIT=False, NATIVE_BF16=True, VEC=max(tile_r // (32 * warps), 1), STOCHASTIC=stochastic,
            **{**format_constants(elem), "NATIVE_MAX": native_max})
        return _compile(constants, POINTERS, arch, warps, DOWN_KERNEL)
    if copied_first(scheme_name, hadamard, along, stochastic):
        along = "rows"
    view = torch.empty(16, 128, dtype=torch.bfloat16)
    constants = dict(
        BC=bc, TILE_R=tile_r, TILE_C=tile_c, AS_ROWS=as_rows, RULE=rowblock.RULES["two_level" if s.two_level else s.scale_rule],
        KMIN=s.scale_fmt.emin, KMAX=s.scale_fmt.emax, EMAX_ELEM=elem.emax, STOCHASTIC=stochastic,
        PACK=2 if elem.bits == 4 else 1, SCALE_CODES=s.scale_fmt.bits <= 8, AMAX_MODE=0, X_BF16=True, BR=1,
        VALUES=True, MAX_VALUE=float(elem.max), H_STAGES=bc.bit_length() - 1 if hadamard else 0, H_SPLIT=False,
        FP64_QUOTIENT=False, CODES_3D=False, TRANSPOSED=False,  # (fp32-scale codes only)
        NATIVE_BF16=True,  # the GPU's bf16 conversion, as the library launches it on a GPU
        PAIRS=as_rows and (lanes or rowblock.column_read_in_pairs(view.t(), s, tile_r)),
        LANES=int(lanes), WHOLE=whole, TILE_STORE=whole and not lanes and rowblock.whole_tile_store(s, stochastic),
        **{**format_constants(elem), "NATIVE_MAX": native_max})
    constants["sxc" if along == "rows" else "sxr"] = 1  # as Triton specializes a stride of 1
    return _compile(constants, POINTERS, arch, warps)


def _compile(constants: dict, pointers: dict, arch: int, warps: int, kernel=KERNEL):
    """`kernel` compiled for sm_`arch` with these constexprs and pointer types; the other
    arguments fp32 or int32, sizes and strides divisible by 16 as Triton marks them."""
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in constants else pointers.get(p, "fp32" if p in FLOATS else "i32")
                 for p in params}
    aligned = [p for p in params if signature[p].startswith("*") or
               (signature[p] == "i32" and p in ("R", "C", "CP", "sxr", "sxc", "sor", "ssr"))]
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(params.index(p),): v for p, v in constants.items()},
                    attrs={(params.index(p),): [["tt.divisibility", 16]] for p in aligned})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))


def codes_layout(scheme_name: str, x_dtype: torch.dtype, along: str, stochastic: bool = False,
                 arch: int = 90) -> dict:
    """The layout choices `quantize_rowblocks` makes for the codes of a large matrix of this
    dtype read along rows or columns, compiled for sm_`arch`: as_rows, transposed, tile rows,
    columns, warps, fp64, pairs, lanes."""
    s = get_scheme(scheme_name)
    view = torch.empty(256, 256, dtype=x_dtype)
    view = view if along == "rows" else view.t()
    as_rows = rowblock.column_read_as_rows(view, s)
    transposed = rowblock.square_column_read_transposed(view, s)
    lanes = (rowblock.row_read_in_lanes(view, s, False, None, stochastic, divmod(arch, 10))
             or as_rows and rowblock.column_read_in_lanes(view, s, False, None, stochastic, divmod(arch, 10)))
    whole = lanes and rowblock.row_read_whole(view, s, False)
    rows, cols, warps = rowblock.tile_of(view, s, False, as_rows, transposed, lanes, whole)
    fp64 = rowblock.rule_of(s) == "amax" and rowblock.fp64_quotient(view, as_rows)
    pairs = as_rows and (lanes or rowblock.column_read_in_pairs(view, s, rows))
    return dict(as_rows=as_rows, transposed=transposed, rows=rows, cols=cols,
                warps=warps or rowblock.warps_for(rows, cols), fp64=fp64, pairs=pairs, lanes=lanes, whole=whole)


def compile_codes_variant(scheme_name: str, x_dtype: torch.dtype, stochastic: bool, along: str, arch: int):
    """The compiled kernel of one codes variant, as `quantize_rowblocks` launches it."""
    s = get_scheme(scheme_name)
    elem, (br, bc) = s.elem, s.block
    rule = rowblock.rule_of(s)
    lay = codes_layout(scheme_name, x_dtype, along, stochastic, arch)
    words = elem.bits == 6 and lay["cols"] % 32 == 0  # fp6 packed as words by the kernel (C a multiple of 16)
    constants = dict(
        BC=bc, TILE_R=lay["rows"], TILE_C=lay["cols"], AS_ROWS=lay["as_rows"], RULE=rowblock.RULES[rule],
        KMIN=s.scale_fmt.emin, KMAX=s.scale_fmt.emax, EMAX_ELEM=elem.emax, STOCHASTIC=stochastic,
        PACK=2 if elem.bits == 4 else 3 if words else 1, SCALE_CODES=s.scale_fmt.bits <= 8, AMAX_MODE=0,
        X_BF16=x_dtype == torch.bfloat16, BR=br, VALUES=False, MAX_VALUE=float(elem.max), H_STAGES=0,
        H_SPLIT=False, FP64_QUOTIENT=lay["fp64"], CODES_3D=rule == "amax", TRANSPOSED=lay["transposed"],
        PAIRS=lay["pairs"], LANES=int(lay["lanes"]), WHOLE=lay["whole"],
        **{**format_constants(elem), "NATIVE_MAX": float(elem.max) if native_fp8_on(elem, divmod(arch, 10)) else 0.0})
    # the unit stride Triton specializes: a column read's rows, unless the kernel reads the transpose
    constants["sxc" if along == "rows" or lay["transposed"] else "sxr"] = 1
    pointers = {**POINTERS, "x_ptr": "*i16" if x_dtype == torch.bfloat16 else "*fp32",
                "out_ptr": "*i32" if words else "*u8", "scale_ptr": "*u8" if s.scale_fmt.bits <= 8 else "*fp32"}
    pointers["elem_table"] = pointers["x_ptr"]  # codes: the launch passes X there
    return _compile(constants, pointers, arch, lay["warps"])


def codes_table(schemes: list[str], arch: int) -> None:
    print(f"triton {triton.__version__}, sm_{arch}; one tile, codes out\n")
    print("| scheme | input | rounding | read along | tile | SASS instructions | an element | ALU an element | "
          "registers | shared bytes | " + " | ".join(SHOWN) + " |")
    print("|---|---|---|---|---|--:|--:|--:|--:|--:|" + "--:|" * len(SHOWN))
    for name in schemes:
        for x_dtype in (torch.bfloat16, torch.float32):
            for along in ("rows", "cols"):
                for stochastic in (False, True):
                    lay = codes_layout(name, x_dtype, along, stochastic, arch)
                    n, ops, regs, shared = sass_stats(compile_codes_variant(name, x_dtype, stochastic, along, arch))
                    per_thread = lay["rows"] * lay["cols"] // (32 * lay["warps"])
                    how = " as rows" if lay["as_rows"] else ", the transpose's rows" if lay["transposed"] else ""
                    how += ", two elements a word" if lay["lanes"] else ""
                    how += ", whole blocks a thread" if lay["whole"] else ""
                    print(f"| {name} | {str(x_dtype)[6:]} | {'SR' if stochastic else 'nearest'} | {along} | "
                          f"{lay['rows']} × {lay['cols']}{how}, {lay['warps']} warps | {n} | {n / per_thread:.1f} | "
                          f"{alu(ops) / per_thread:.1f} | {regs} | {shared} | " + " | ".join(str(ops[k]) for k in SHOWN)
                          + " |", flush=True)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(nvidia.__file__), "bin", name)


def sass_stats(kernel) -> tuple[int, collections.Counter, int, int]:
    """(instructions, count by opcode, registers a thread, shared memory bytes) of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        sass = subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
    regs = re.search(r"REG:(\d+)", usage)
    return len(ops), collections.Counter(o.split(".")[0] for o in ops), int(regs.group(1)) if regs else -1, \
        kernel.metadata.shared


def alu(ops: collections.Counter) -> int:
    """How many of the counted instructions are of the ALU pipe's kinds (`ALU`)."""
    return sum(n for op, n in ops.items() if op in ALU)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schemes", nargs="+", default=None,
                   help="default: mxfp8_e4m3 mxfp4 nvfp4 (values), fp8_e4m3_1x128 fp8_e4m3_128x128 mxfp8_e4m3 (codes)")
    p.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90: Hopper)")
    p.add_argument("--codes", action="store_true", help="the codes kernels instead of the values kernels")
    args = p.parse_args()
    if args.codes:
        codes_table(args.schemes or ["fp8_e4m3_1x128", "fp8_e4m3_128x128", "mxfp8_e4m3"], args.arch)
        return
    args.schemes = args.schemes or ["mxfp8_e4m3", "mxfp4", "nvfp4"]
    print(f"triton {triton.__version__}, sm_{args.arch}; one tile, bf16 input, values out\n")
    print("| scheme | rounding | Hadamard | read along | tile | SASS instructions | an element | ALU an element | "
          "registers | shared bytes | " + " | ".join(SHOWN) + " |")
    print("|---|---|---|---|---|--:|--:|--:|--:|--:|" + "--:|" * len(SHOWN))
    for name in args.schemes:
        bc = get_scheme(name).block[1]
        for along in ("rows", "cols"):
            for stochastic in (False, True):
                for hadamard in (False, True):
                    if hadamard and bc not in (16, 32):  # the recipes' transforms: 32 (mxfp4), 16 (nvfp4)
                        continue
                    n, ops, regs, shared = sass_stats(compile_variant(name, stochastic, hadamard, along, args.arch))
                    as_rows, tr, tc, warps, lanes, whole = tile(name, hadamard, along, stochastic, args.arch)
                    per_thread = tr * tc // (32 * warps)  # elements a thread
                    print(f"| {name} | {'SR' if stochastic else 'nearest'} | {'yes' if hadamard else 'no'} | {along} | "
                          f"{tr} × {tc}{' as rows' if as_rows else ''}{', two elements a word' if lanes else ''}"
                          f"{', whole blocks a thread' if whole else ''}"
                          f"{', whole blocks down the columns' if down(name, hadamard, along, stochastic) else ''}"
                          f"{', rows of a transposed copy' if copied_first(name, hadamard, along, stochastic) else ''}"
                          f" | {n} | "
                          f"{n / per_thread:.1f} | {alu(ops) / per_thread:.1f} | {regs} | {shared} | "
                          + " | ".join(str(ops[k]) for k in SHOWN) + " |", flush=True)


if __name__ == "__main__":
    main()
