"""A Llama-style decoder that never mentions precision.

    tokens → embed → n_layers × [ x + attn(norm(x)) ; x + mlp(norm(x)) ] → norm → lm_head → logits

- RMSNorm: x / rms(x) · weight, computed in fp32 and returned in the input's dtype.
- Rotary position embeddings on queries and keys (computed in fp32, cast back).
- Grouped-query attention: n_heads query heads share n_kv_heads key/value heads, through
  torch's scaled_dot_product_attention (causal).
- SwiGLU MLP: down(silu(gate(x)) · up(x)), or a mixture of such experts (moe.py).
- An untied output head named `lm_head`.

Every activation keeps the dtype it arrives in; precision is applied from outside, by converting
the Linears and casting the embedding output (fewerbits.train does both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Llama-style decoder."""

    dim: int  #: model width
    n_layers: int  #: transformer blocks
    n_heads: int  #: query heads
    n_kv_heads: int  #: key/value heads (grouped-query attention)
    ffn_dim: int  #: hidden width of the SwiGLU MLP (of each expert, with experts)
    vocab_size: int | None = None  #: None: taken from the tokenizer
    max_seq_len: int = 2048  #: longest sequence the rotary tables cover
    rope_theta: float = 10000.0  #: rotary base
    norm_eps: float = 1e-5  #: RMSNorm epsilon
    n_experts: int = 0  #: 0: dense MLP; otherwise a mixture of this many experts
    top_k: int = 2  #: experts per token
    init_std: float = 0.02  #: standard deviation of the initial weights

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must lie in [1, n_experts={self.n_experts}]")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


def rotary_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_seq_len, head_dim / 2), fp32."""
    half = cfg.head_dim // 2
    freqs = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x, cos, sin):
    """x: (B, H, T, D); rotate pairs (x[..., :D/2], x[..., D/2:]) by position."""
    d = x.shape[-1] // 2
    x1, x2 = x.float()[..., :d], x.float()[..., d:]
    cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        # (B, T, H·D) → (B, H, T, D)
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        groups = self.n_heads // self.n_kv_heads
        if groups > 1:  # each key/value head serves `groups` query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from .moe import MoE  # the MoE MLP is optional

        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MoE(cfg) if cfg.n_experts else SwiGLU(cfg.dim, cfg.ffn_dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """The decoder. forward(tokens (B, T)) → logits (B, T, vocab)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size is not set (take it from the tokenizer)")
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # output projections scaled down with depth (GPT-2 style)
                scale = 1 / math.sqrt(2 * self.config.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1
                nn.init.normal_(p, std=std * scale)

    def forward(self, tokens):
        if tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds max_seq_len {self.config.max_seq_len}")
        x = self.embed_tokens(tokens)
        for block in self.layers:
            x = block(x, self.rope_cos, self.rope_sin)
        return self.lm_head(self.norm(x))

    def aux_loss(self):
        """Sum of the experts' load-balancing losses from the last forward (0 without experts)."""
        losses = [b.mlp.aux_loss for b in self.layers if getattr(b.mlp, "aux_loss", None) is not None]
        return sum(losses) if losses else None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
