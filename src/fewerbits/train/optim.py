"""AdamW over fp32 master weights, with the optimizer states in fp32 (default) or bf16.

    m ← β1·m + (1 − β1)·g          v ← β2·v + (1 − β2)·g²
    p ← p − lr·( m̂ / (√v̂ + ε) + wd·p )      m̂, v̂ bias-corrected

The update is computed in fp32 whatever the state dtype; bf16 states are rounded (to nearest)
when stored, halving the optimizer's memory. Weight decay applies to matrices only: norms'
gains and other vectors are not decayed, nor are embeddings.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.weak import WeakIdKeyDictionary

from .. import kernels


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "embed" in name
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class AdamW(torch.optim.Optimizer):
    """fused: None (default) updates each fp32 parameter in one Triton kernel where the kernel
    backend says so (CUDA tensors), with torch's multi-tensor ops elsewhere; True insists on
    the kernel, False never uses it. Both run the formula above in the same order."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 state_dtype: torch.dtype = torch.float32, fused: bool | None = None):
        if state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError("state_dtype must be torch.float32 or torch.bfloat16")
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None, True or False, not {fused!r}")
        if fused and not kernels.triton_available():
            raise RuntimeError("AdamW(fused=True) needs the triton package (pip install triton)")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.state_dtype = state_dtype
        self.fused = fused
        # parameter → (its amax as the fused kernel wrote it, its columns' or None, its version
        # just after)
        self._amaxes = WeakIdKeyDictionary()
        self._columns_asked = WeakIdKeyDictionary()  # 2-D parameters whose columns' amaxes were asked for
        self._slot_buffers: dict = {}  # device → ({id(parameter): (its first slot, its slots)}, their buffer)

    def weight_amax(self, p: torch.Tensor, dim: int | None = None) -> torch.Tensor | None:
        """max |p| (a 0-d fp32 tensor on p's device, NaN if p holds NaN) as the fused kernel
        found it while writing p at the last step, or None: p was not updated by the kernel, or
        has changed since (its version counter moved). For `QuantizedLinear.set_weight_amax`,
        whose quantizers then need no pass over the weight to find it.

        dim=0: a 2-D p's amaxes over dim 0, one per column (fp32, shape (p.shape[1],)), for a
        copy of p quantized with one scale per column (fp8_rowwise's input-gradient weight).
        The kernel finds them from the step after the first ask for them (until then: None)."""
        if dim not in (None, 0):
            raise ValueError(f"weight_amax gives the amax of the whole parameter (dim=None) or of its columns "
                             f"(dim=0), not dim={dim!r}")
        if dim == 0:
            if p.dim() != 2:
                raise ValueError(f"weight_amax(dim=0) is for a 2-D parameter, not one of shape {tuple(p.shape)}")
            self._columns_asked[p] = True
        hit = self._amaxes.get(p)
        if hit is None or hit[2] != p._version:
            return None
        return hit[0] if dim is None else hit[1]

    def _fused_for(self, p: torch.Tensor) -> bool:
        if self.fused is False:
            return False
        from ..kernels import adamw

        if self.fused and not adamw.supported(p, self.state_dtype):
            raise ValueError(f"AdamW(fused=True) updates contiguous fp32 parameters with fp32 gradients; "
                             f"got a {p.dtype} parameter with a {p.grad.dtype} gradient")
        return (self.fused or kernels.uses_triton(p)) and adamw.supported(p, self.state_dtype)

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale: torch.Tensor | None = None):
        """One update of every parameter with a gradient: by the fused kernel (see the class),
        or with torch's multi-tensor ops for the parameters of a group that share a device,
        dtype and step count. The arithmetic per element is the single-tensor formula's, in
        the same order.

        grad_scale: a one-element tensor (`clip_coefficient`'s coefficient) that every gradient
        is multiplied by first — the update clipping then stepping would make, bit for bit. The
        fused kernel applies it as it reads the gradient (no pass of its own) and leaves the
        gradient as it was; the multi-tensor path scales the gradients in place first.

        The fused kernel also finds each parameter's amax as it writes it, and its columns'
        where they were asked for (`weight_amax`)."""
        if closure is not None:
            raise ValueError("AdamW.step takes no closure")
        if grad_scale is not None and (not isinstance(grad_scale, torch.Tensor) or grad_scale.numel() != 1
                                       or not grad_scale.is_floating_point()):
            raise ValueError("grad_scale must be a one-element floating-point tensor (clip_coefficient's)")
        scales: dict = {}  # grad_scale on each parameter's device, moved once
        fused = [p for group in self.param_groups for p in group["params"]
                 if p.grad is not None and self._fused_for(p)]
        # the fused kernel's amaxes of the new parameters: one int32 slot each, and one a column
        # for those whose columns' amaxes were asked for. The slots keep their addresses from
        # step to step, as CUDA graphs that read them need (a new address makes them record
        # again): a parameter keeps its slots while its width stays, through steps that leave
        # it out too (an expert that got no tokens: it keeps the amax it was given last), and
        # nobody's slots move for it. A new buffer only for a parameter never laid out before or
        # a width that changed (columns asked for).
        width = {id(p): 1 + (p.shape[1] if p in self._columns_asked and p.dim() == 2 else 0) for p in fused}
        slot_of = {}  # id(parameter) → its slots (amax, then its columns'), for the parameters the kernel updates
        for dev in {p.device for p in fused}:
            now = [id(p) for p in fused if p.device == dev]
            kept = self._slot_buffers.get(dev)
            if kept is not None and all(kept[0].get(i, (0, 0))[1] == width[i] for i in now):
                starts, buffer = kept
                if len(now) == len(starts):
                    buffer.zero_()
                else:  # only the slots this step writes, run by run: a parameter
                    # left out keeps the amax it was given last (`_amaxes`)
                    runs: list[list[int]] = []
                    for a, w in sorted(starts[i] for i in now):
                        if runs and runs[-1][1] == a:
                            runs[-1][1] = a + w
                        else:
                            runs.append([a, a + w])
                    for a, b in runs:
                        buffer[a:b].zero_()
            else:
                widths = {i: width[i] for i in now}
                for i, (_, w) in ({} if kept is None else kept[0]).items():
                    widths.setdefault(i, w)  # left out this step: a slot in the new buffer too
                starts, total = {}, 0
                for i, w in widths.items():
                    starts[i], total = (total, w), total + w
                buffer = torch.zeros(total, dtype=torch.int32, device=dev)
                self._slot_buffers[dev] = (starts, buffer)
            for i in now:
                slot_of[i] = buffer[starts[i][0]:starts[i][0] + width[i]]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            batches: dict = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype)
                state["step"] += 1
                if grad_scale is not None and p.device not in scales:
                    scales[p.device] = grad_scale.reshape(()).to(p.device)
                scale = scales.get(p.device)
                bits = slot_of.get(id(p))
                if bits is not None:  # the fused kernel
                    from ..kernels.adamw import adamw_step

                    columns = bits[1:] if bits.numel() > 1 else None
                    adamw_step(p, state["exp_avg"], state["exp_avg_sq"], lr=group["lr"], beta1=b1, beta2=b2,
                               eps=group["eps"], weight_decay=group["weight_decay"], step=state["step"].item(),
                               grad_scale=None if scale is None else scale.float(), amax_bits=bits[:1],
                               column_bits=columns)
                    self._amaxes[p] = (bits[:1].view(torch.float32).reshape(()),
                                       None if columns is None else columns.view(torch.float32), p._version)
                    continue
                self._amaxes.pop(p, None)
                key = (p.device, p.dtype, state["step"].item())
                batches.setdefault(key, []).append((p, state))
            for (device, _dtype, t), members in batches.items():
                if grad_scale is not None:  # in place, as clipping scales them
                    torch._foreach_mul_([p.grad for p, _ in members], scales[device])
                self._update([p for p, _ in members], [s for _, s in members], group, b1, b2, t)

    def _update(self, params, states, group, b1, b2, t):
        grads = [p.grad.float() for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        m = [e.float() for e in exp_avgs]  # the states themselves when they are fp32
        v = [e.float() for e in exp_avg_sqs]
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        if self.state_dtype != torch.float32:  # round the new states into their storage
            torch._foreach_copy_(exp_avgs, m)
            torch._foreach_copy_(exp_avg_sqs, v)
        denom = torch._foreach_div(v, 1 - b2**t)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, group["eps"])
        update = torch._foreach_div(m, 1 - b1**t)
        torch._foreach_div_(update, denom)
        if group["weight_decay"]:
            torch._foreach_add_(update, [p.float() for p in params], alpha=group["weight_decay"])
        torch._foreach_add_(params, [u.to(p.dtype) for u, p in zip(update, params)], alpha=-group["lr"])


@torch.no_grad()
def clip_coefficient(params, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(total 2-norm of the gradients, min(max_norm / (norm + 1e-6), 1)), both 0-d tensors on
    the device (fp32 for fp32 gradients), computed as torch.nn.utils.clip_grad_norm_ computes
    them, without scaling any gradient: `AdamW.step(grad_scale=coefficient)` then makes
    clip-then-step's update bit for bit, and on the fused kernel saves clipping's read and
    write of every gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        zero = torch.zeros((), dtype=torch.float32)
        return zero, torch.ones((), dtype=torch.float32)
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    coefficient = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    return norm, coefficient
