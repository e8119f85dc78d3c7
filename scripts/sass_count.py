"""Instructions an element in the loop of an inductor Triton kernel, compiled for sm_90 here,
without a GPU: a way to weigh how the library writes a cast before a device measures it.

    TORCH_LOGS=output_code python3 ... 2> dump.txt        (on the GPU: inductor's output code)
    python3 scripts/sass_count.py dump.txt KERNEL_NAME [--xblock 1 --rblock 2048 --warps 8] [--sass out.sass]
    python3 scripts/sass_count.py dump.txt --all      (every large one-dimensional reduction and pointwise kernel)

It takes the kernel's source out of the dump (the log's prefixes stripped), compiles it with
Triton for an sm_90 target with the signature, pointer alignments and fp-fusion setting
inductor recorded for it, disassembles it with the cuobjdump that Triton ships, and prints the
instructions of its longest loop and their number per element (XBLOCK × RBLOCK elements an
iteration over 32 × warps threads). The launch shape is an argument: inductor's autotuner
chooses it on the device, so the count is for the shape given. Out-of-line slow paths (a
correctly rounded division's) lie outside the loop and are not counted.
"""

import argparse
import ast
import collections
import importlib.util
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = re.compile(r"^V\d{4} [\d:.]+ \d+ \S+\] \[[^]]*\] \[__output_code\] ?", re.MULTILINE)


def kernel_names(text: str) -> list[tuple[str, int]]:
    """(name, offset in the dump's text) of every kernel; a name can come again in a later graph
    (forward, then backward) with another body."""
    return [(m.group(1), m.start()) for m in re.finditer(r"^(triton_\w+) = async_compile\.triton\(", text, re.MULTILINE)]


def kernel_source(text: str, name: str, start: int | None = None) -> tuple[str, dict, dict, bool]:
    """(source of the @triton.jit function, signature, attrs, enable_fp_fusion) of `name` in the
    dump's text (its log prefixes stripped), the first of that name or the one at `start`."""
    head = f"{name} = async_compile.triton("
    if start is None:
        if head not in text:
            raise SystemExit(f"no kernel named {name} in the dump")
        start = text.index(head)
    body = text[start:].split("'''", 2)[1]
    body = body.replace("triton_helpers.set_driver_to_gpu()", "")
    body = re.sub(r"@triton_heuristics\.\w+\(.*?\n\)\n", "", body, flags=re.DOTALL)
    meta = text[start:start + len(body) + 4000]
    signature = ast.literal_eval(re.search(r"'signature': (\{.*?\})", meta).group(1))
    attrs = ast.literal_eval(re.search(r"'configs': \[(\{.*?\})\]", meta).group(1))
    fusion = "'enable_fp_fusion': False" not in meta
    return body, signature, attrs, fusion


def compile_sm90(body: str, name: str, signature: dict, attrs: dict, fusion: bool, constants: dict, warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = Path(tempfile.mkdtemp()) / "kernel.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location("kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    constants = {k: v for k, v in constants.items() if k in signature}
    names = list(signature)
    src = ASTSource(getattr(module, name), signature=signature,
                    constexprs={(names.index(k),): v for k, v in constants.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "enable_fp_fusion": fusion})


def sass(cubin: bytes) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout


def longest_loop(listing: str) -> list[tuple[int, str]] | None:
    """The instructions from the target of the longest backward branch to the branch; None for
    a kernel without a loop."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", listing)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (?:!?U?P\d, )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    if not loops:
        return None
    lo, hi = max(loops, key=lambda ab: ab[1] - ab[0])
    return [(a, t) for a, t in ins if lo <= a <= hi]


def count(text: str, name: str, start: int | None, xblock: int, rblock: int, warps: int, sass_path=None):
    """(instructions counted, elements a thread, where, opcode counts) of one kernel."""
    body, signature, attrs, fusion = kernel_source(text, name, start)
    constants = {"XBLOCK": xblock, "R0_BLOCK": rblock, "RBLOCK": rblock}
    for k in constants:
        if k in signature:
            signature[k] = "constexpr"
    kernel = compile_sm90(body, name, signature, attrs, fusion, constants, warps)
    listing = sass(kernel.asm["cubin"])
    if sass_path:
        Path(sass_path).write_text(listing)
    loop = longest_loop(listing)
    if loop is None:  # no loop: every instruction once, for XBLOCK elements, or XBLOCK whole rows of
        # a reduction whose loop was unrolled
        loop = [(0, m.group(1).strip()) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", listing)]
        row = re.search(r"^\s+r0_numel = (\d+)$", body, re.MULTILINE)
        per_thread = xblock * (int(row.group(1)) if row and "R0_BLOCK" in signature else 1) / (32 * warps)
        where = "in the kernel (no loop)"
    else:
        per_thread = xblock * rblock / (32 * warps)
        where = "in its loop"
    ops = collections.Counter(t.split()[0] if not t.startswith("@") else t.split()[1] for _, t in loop)
    return len(loop), per_thread, where, ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dump")
    p.add_argument("kernel", nargs="?")
    p.add_argument("--all", action="store_true",
                   help="instructions an element of every large one-dimensional triton_red (XBLOCK 1, RBLOCK 2048, "
                        "8 warps) and triton_poi kernel (XBLOCK 1024, 4 warps)")
    p.add_argument("--xblock", type=int, default=1)
    p.add_argument("--rblock", type=int, default=2048)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--sass", help="write the whole listing here")
    p.add_argument("--top", type=int, default=12, help="opcodes to list")
    a = p.parse_args(argv)
    text = PREFIX.sub("", Path(a.dump).read_text())  # the output code without the log's prefixes
    if a.all:
        skipped = 0
        for name, start in kernel_names(text):
            shape = (1, 2048, 8) if name.startswith("triton_red") else (1024, 1, 4) if name.startswith("triton_poi") else None
            body = kernel_source(text, name, start)[0]
            sizes = [int(n) for n in re.findall(r"^\s+(?:x|r0_)numel = (\d+)$", body, re.MULTILINE)]
            # counted: one-dimensional launches over a million elements or more (a persistent
            # reduction's RBLOCK is its whole row, a 2-D pointwise tile has a YBLOCK, and a small
            # kernel's loop is not its elements')
            if shape is None or "YBLOCK" in body or not sizes or math.prod(sizes) < 2**20:
                skipped += 1
                continue
            try:
                n, per_thread, where, _ = count(text, name, start, *shape)
            except Exception as e:  # noqa: BLE001 (one kernel that does not compile here)
                print(f"   -   {name[:110]}: not compiled here ({type(e).__name__})")
                continue
            print(f"{n / per_thread:6.1f}  {name[:110]}")
        print(f"({skipped} kernels not counted: small, persistent or two-dimensional)")
        return 0
    if not a.kernel:
        p.error("give a kernel's name, or --all")
    n, per_thread, where, ops = count(text, a.kernel, None, a.xblock, a.rblock, a.warps, a.sass)
    print(f"{a.kernel}: {n} instructions {where}, {per_thread:g} elements a thread: {n / per_thread:.1f} an element")
    for op, k in ops.most_common(a.top):
        print(f"  {k:4d}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
