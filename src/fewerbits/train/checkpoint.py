"""Checkpoints that are whole or absent: written aside, checked by hash, swapped in by rename.

A checkpoint is the folder RUN/checkpoint holding

    model.safetensors   the model's state_dict (fp32 master weights, and buffers such as
                        fp8_delayed's amax histories)
    optimizer.pt        the optimizer's state_dict
    rng.pt              torch's CPU (and CUDA) generator states
    state.json          step, data position, loss scaler, counters, the run's configuration
    manifest.json       the sha256 and size of each file above

Writing: everything goes into RUN/.checkpoint-new, each file flushed to disk, manifest last;
then the old checkpoint is renamed to RUN/.checkpoint-old, the new one to RUN/checkpoint, and the
old one is deleted. A crash at any point leaves either the old or the new checkpoint complete
(`load` falls back to .checkpoint-old when RUN/checkpoint is missing). Reading: every file's
hash is checked against the manifest, so a half-written or corrupted checkpoint is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")


class CheckpointError(RuntimeError):
    """A missing, incomplete or corrupted checkpoint."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: Path, model: torch.nn.Module, optimizer, state: dict) -> Path:
    """Write RUN/checkpoint atomically; returns its path."""
    run_dir = Path(run_dir)
    new, final, old = run_dir / ".checkpoint-new", run_dir / "checkpoint", run_dir / ".checkpoint-old"
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(new / "model.safetensors"))
    torch.save(optimizer.state_dict(), new / "optimizer.pt")
    torch.save(rng_state(), new / "rng.pt")
    (new / "state.json").write_text(json.dumps(state, indent=2))
    manifest = {}
    for name in FILES:
        _fsync(new / name)
        manifest[name] = {"sha256": _sha256(new / name), "bytes": (new / name).stat().st_size}
    (new / "manifest.json").write_text(json.dumps(manifest, indent=2))
    _fsync(new / "manifest.json")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def find(run_dir: Path) -> Path | None:
    """The complete checkpoint of a run folder, if any (the old one if a swap was cut short)."""
    for name in ("checkpoint", ".checkpoint-old"):
        path = Path(run_dir) / name
        if (path / "manifest.json").exists():
            return path
    return None


def verify(path: Path) -> dict:
    """Check every file against the manifest; returns state.json's contents."""
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: no readable manifest.json: the checkpoint is incomplete") from None
    for name in FILES:
        entry = manifest.get(name)
        f = path / name
        if entry is None or not f.exists():
            raise CheckpointError(f"{path}: {name} is missing: the checkpoint is incomplete")
        if f.stat().st_size != entry["bytes"] or _sha256(f) != entry["sha256"]:
            raise CheckpointError(f"{path}: {name} does not match its recorded sha256: the checkpoint is corrupted")
    return json.loads((path / "state.json").read_text())


def load(path: Path, model: torch.nn.Module, optimizer=None, device=None) -> dict:
    """Restore model (and optimizer, RNG) from a verified checkpoint; returns its state."""
    state = verify(path)
    tensors = load_file(str(Path(path) / "model.safetensors"), device=str(device or "cpu"))
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shapes differ
        raise CheckpointError(
            f"{path} was written by a model of other shapes ({str(e).splitlines()[-1].strip()}); "
            "start a new run or pick the matching --preset"
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path} was written by a different model (missing {list(missing)[:3]}, "
            f"unexpected {list(unexpected)[:3]}); start a new run or pick the matching --preset/--recipe"
        )
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(Path(path) / "optimizer.pt", map_location=device, weights_only=True))
        set_rng_state(torch.load(Path(path) / "rng.pt", weights_only=True))
    return state
