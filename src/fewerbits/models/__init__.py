"""Models and their presets. Models never mention precision; see fewerbits.convert."""

from __future__ import annotations

from dataclasses import replace

from .llama import Llama, ModelConfig
from .moe import MoE

#: Named shapes. tiny and small take the tokenizer's vocabulary; the larger ones use 32000.
PRESETS: dict[str, ModelConfig] = {
    # ~2.9 M parameters with vocab 8192: a few hundred steps on two CPU cores in a minute or two
    "tiny": ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=384, max_seq_len=512),
    "tiny-moe": ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=512, n_experts=4, top_k=2),
    # ~27 M with vocab 8192
    "small": ModelConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=1024, max_seq_len=1024),
    "small-moe": ModelConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=512, max_seq_len=1024, n_experts=8, top_k=2),
    # GPT-3 125M / 350M widths and depths with a Llama block, vocab 32000
    "125m": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000),
    "350m": ModelConfig(dim=1024, n_layers=24, n_heads=16, n_kv_heads=8, ffn_dim=2816, vocab_size=32000),
    # TinyLlama-1.1B's shapes
    "1b": ModelConfig(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632, vocab_size=32000),
    # eight blocks of Llama-3-8B (d 4096, ffn 14336, 32 heads, 8 kv heads), vocab 32000
    "llama3-8b-8layers": ModelConfig(
        dim=4096, n_layers=8, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32000, rope_theta=500000.0
    ),
}


def get_preset(name: str, vocab_size: int | None = None) -> ModelConfig:
    """A preset's config; `vocab_size` fills it in where the preset leaves it to the data."""
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None
    if cfg.vocab_size is None:
        cfg = replace(cfg, vocab_size=vocab_size)
    elif vocab_size is not None and vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the data's vocabulary ({vocab_size}) is larger than preset {name}'s ({cfg.vocab_size})"
        )
    return cfg


__all__ = ["Llama", "ModelConfig", "MoE", "PRESETS", "get_preset"]
