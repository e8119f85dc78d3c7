"""How fast the SwiGLU's FP8 amax reductions can run: inductor's, under several of its options,
against a Triton kernel written for them, each alone on a GPU, as a share of the copy rate.

    python3 scripts/swiglu_amax.py

The shapes are llama3-8b-8layers' at batch 4 x 2048 (8192 tokens, ffn 14336, bf16). The forward
reduction is amax|silu(g) * u| (the down projection's input), the backward's the amaxes of the
gate's and up's gradients from the output gradient dy and the saved g and u, as a per-tensor FP8
step computes them before its casts. "equal to eager" compares each amax with the uncompiled
function's (inductor's fp32 arithmetic need not be the eager function's).
"""
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

torch.manual_seed(0)
T, FF = 8192, 14336
dev = "cuda"
g = torch.randn(T, FF, device=dev, dtype=torch.bfloat16)
u = torch.randn(T, FF, device=dev, dtype=torch.bfloat16)
dy = torch.randn(T, FF, device=dev, dtype=torch.bfloat16) * 1e-3
nbytes = g.numel() * 2

def fwd(g, u):
    h = F.silu(g) * u
    return h.abs().amax().float()

def bwd(g, u, dy):
    gf, uf, dyf = g.float(), u.float(), dy.float()
    s = torch.sigmoid(gf)
    du = (dyf * gf * s).to(torch.bfloat16)
    dg = (dyf * uf * s * (1 + gf * (1 - s))).to(torch.bfloat16)
    return du.abs().amax().float(), dg.abs().amax().float()

@triton.jit
def _fwd_amax(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        gv = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        uv = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
        h = (gv * tl.sigmoid(gv) * uv).to(tl.bfloat16).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(h))
    tl.atomic_max(out_ptr, tl.max(acc, 0))

@triton.jit
def _bwd_amax(g_ptr, u_ptr, dy_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    ag = tl.zeros([BLOCK], tl.float32)
    au = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        gv = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        uv = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
        d = tl.load(dy_ptr + offs, mask=m, other=0.0).to(tl.float32)
        s = tl.sigmoid(gv)
        du = (d * gv * s).to(tl.bfloat16).to(tl.float32)
        dg = (d * uv * s * (1 + gv * (1 - s))).to(tl.bfloat16).to(tl.float32)
        au = tl.maximum(au, tl.abs(du))
        ag = tl.maximum(ag, tl.abs(dg))
    tl.atomic_max(out_ptr, tl.max(au, 0))
    tl.atomic_max(out_ptr + 1, tl.max(ag, 0))

SMS = torch.cuda.get_device_properties(0).multi_processor_count

def hand_fwd(g, u, progs, block, warps):
    out = torch.zeros(1, device=dev, dtype=torch.float32)
    _fwd_amax[(progs,)](g, u, out, g.numel(), BLOCK=block, num_warps=warps)
    return out

def hand_bwd(g, u, dy, progs, block, warps):
    out = torch.zeros(2, device=dev, dtype=torch.float32)
    _bwd_amax[(progs,)](g, u, dy, out, g.numel(), BLOCK=block, num_warps=warps)
    return out

def rate(ms, reads):
    return reads * nbytes / (ms * 1e-3) / 1e12

copy_src = torch.empty(3 * g.numel(), device=dev, dtype=torch.bfloat16)
copy_dst = torch.empty_like(copy_src)
cms = do_bench(lambda: copy_dst.copy_(copy_src), warmup=50, rep=300)
copy_rate = 2 * copy_src.numel() * 2 / (cms * 1e-3) / 1e12
print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print(f"copy {copy_src.numel() * 2 / 1e6:.0f} MB each way: {cms:.3f} ms, {copy_rate:.2f} TB/s")

ref_f = fwd(g, u); ref_b = bwd(g, u, dy)
configs = {"default": {}, "coordinate_descent_tuning": {"coordinate_descent_tuning": True},
           "max_autotune_pointwise": {"max_autotune_pointwise": True},
           "cooperative_reductions": {"triton.cooperative_reductions": True},
           "force_cooperative_reductions": {"triton.cooperative_reductions": True,
                                            "triton.force_cooperative_reductions": True},
           "no persistent_reductions": {"triton.persistent_reductions": False}}
for name, opts in configs.items():
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(opts):
            cf = torch.compile(fwd); cb = torch.compile(bwd)
            t0 = time.time(); cf(g, u); cb(g, u, dy); torch.cuda.synchronize(); ct = time.time() - t0
            fms = do_bench(lambda: cf(g, u), warmup=25, rep=200)
            bms = do_bench(lambda: cb(g, u, dy), warmup=25, rep=200)
            same = cf(g, u).item() == ref_f.item(), [a.item() == b.item() for a, b in zip(cb(g, u, dy), ref_b)]
    except Exception as e:
        print(f"inductor {name}: failed: {type(e).__name__}: {str(e)[:200]}")
        continue
    print(f"inductor {name:28s} fwd {fms:.3f} ms ({rate(fms, 2) / copy_rate:.0%})  bwd {bms:.3f} ms "
          f"({rate(bms, 3) / copy_rate:.0%})  compile {ct:.1f} s  equal to eager: {same}")

for progs_per_sm in (2, 4, 8):
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            p = progs_per_sm * SMS
            fms = do_bench(lambda: hand_fwd(g, u, p, block, warps), warmup=25, rep=200)
            bms = do_bench(lambda: hand_bwd(g, u, dy, p, block, warps), warmup=25, rep=200)
            hf = hand_fwd(g, u, p, block, warps); hb = hand_bwd(g, u, dy, p, block, warps)
            print(f"hand {progs_per_sm}/SM block {block} warps {warps}: fwd {fms:.3f} ms "
                  f"({rate(fms, 2) / copy_rate:.0%})  bwd {bms:.3f} ms ({rate(bms, 3) / copy_rate:.0%})  "
                  f"fwd={hf.item() == ref_f.item()} bwd={hb[0].item() == ref_b[0].item()},{hb[1].item() == ref_b[1].item()}")
