"""Generate text from a trained run, in the precision it was trained in."""

from __future__ import annotations

from pathlib import Path

import torch

from ..hardware import resolve_device
from . import checkpoint as ckpt
from .checkpoint import CheckpointError
from .loop import TrainConfig
from .data import TokenData


def load_run(run_dir: str | Path, device="auto"):
    """(model, tokenizer or None, config) from a run folder (or a checkpoint folder)."""
    from .loop import build

    path = Path(run_dir)
    found = ckpt.find(path) if not (path / "manifest.json").exists() else path
    if found is None:
        raise CheckpointError(f"{path} holds no checkpoint; point --checkpoint at a run folder")
    state = ckpt.verify(found)
    cfg = TrainConfig.from_dict(state["config"])
    device = resolve_device(device)
    identity = state["identity"]
    stub = TokenData(None, None, identity["vocab_size"], identity["data_sha256"], "", None)
    model, _, _ = build(cfg, stub, device)
    ckpt.load(found, model, device=device)
    tok_path = found.parent / "tokenizer.json"
    tokenizer = None
    if tok_path.exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tok_path))
    return model, tokenizer, cfg


@torch.no_grad()
def generate(model, ids: list[int], n_tokens: int, temperature: float = 0.8, top_k: int = 50,
             seed: int = 0) -> list[int]:
    """Sample n_tokens after `ids` (top-k, temperature; greedy at temperature 0)."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    out = list(ids)
    ctx_len = model.config.max_seq_len
    for _ in range(n_tokens):
        x = torch.tensor([out[-ctx_len:]], device=device)
        logits = model(x)[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = torch.where(logits < kth, -torch.inf, logits)
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        out.append(nxt)
    return out


def sample(run_dir, prompt: str, n_tokens: int = 200, temperature: float = 0.8, top_k: int = 50,
           seed: int = 0, device="auto") -> str:
    model, tokenizer, _ = load_run(run_dir, device)
    if tokenizer is None:
        raise CheckpointError(f"{run_dir} was trained on pre-tokenized data: there is no tokenizer to sample text with")
    ids = tokenizer.encode(prompt).ids or [0]
    out = generate(model, ids, n_tokens, temperature, top_k, seed)
    return tokenizer.decode(out)

