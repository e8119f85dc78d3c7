"""A mixture-of-experts SwiGLU MLP: top-k routing and a load-balancing loss.

    probs = softmax(router(x))                        router: Linear(dim → n_experts), named
                                                      `router` so the default policy keeps it
    top-k experts per token, weights = their probs renormalised to sum to 1
    y = Σ_k weight_k · expert_k(x)

Load balancing (Switch Transformer, Fedus et al. 2021): aux = n_experts · Σ_i f_i · P_i, f_i the
fraction of routing slots that chose expert i, P_i the mean router probability of i. It is 1
for a perfectly even router and grows as routing collapses; the trainer adds it to the loss.
Experts are plain SwiGLU modules in `experts`, so each expert Linear can be converted.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .llama import ModelConfig, SwiGLU


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.dim, cfg.ffn_dim) for _ in range(cfg.n_experts))
        self.aux_loss = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (tokens, dim)
        probs = torch.softmax(self.router(x).float(), dim=-1)  # (tokens, n_experts)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            if token.numel():
                out.index_add_(0, token, (expert(x[token]) * weights[token, slot, None].to(x.dtype)))
        counts = torch.zeros(self.n_experts, device=x.device).index_add_(
            0, chosen.reshape(-1), torch.ones(chosen.numel(), device=x.device)
        )
        self.aux_loss = self.n_experts * ((counts / chosen.numel()) * probs.mean(0)).sum()
        return out.reshape(shape)
