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


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "embed" in name
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 state_dtype: torch.dtype = torch.float32):
        if state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError("state_dtype must be torch.float32 or torch.bfloat16")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.state_dtype = state_dtype

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype)
                state["step"] += 1
                t = state["step"].item()
                g = p.grad.float()
                m = state["exp_avg"].float().lerp_(g, 1 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
                denom = (v / (1 - b2**t)).sqrt_().add_(group["eps"])
                update = (m / (1 - b1**t)) / denom
                if group["weight_decay"]:
                    update = update.add(p.float(), alpha=group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-group["lr"])
