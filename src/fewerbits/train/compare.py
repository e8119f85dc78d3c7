"""Train one model under several recipes, side by side, and show what each recipe did.

Every recipe starts from the same initial weights (the same seed builds the same fp32 model)
and sees the same batches in the same order (batches are a function of seed and step) and the
same validation windows. Each run is a separate process (`fewerbits train`), so tokens/s and
peak memory belong to that recipe alone; its folder is OUT/<recipe>.

Outputs: OUT/compare.md (one row per recipe: final validation loss, gap to the first recipe,
tokens/s, peak memory, skipped steps) and OUT/compare.png (training loss, validation loss, and
the validation loss's relative gap to the first recipe, against steps).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..hardware import device_name, resolve_device
from ..recipes import get_recipe
from .data import prepare
from .loop import RunError, TrainConfig
from .metrics import read_metrics

DEFAULT_RECIPES = ("bf16", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "mxfp4", "nvfp4")


def compare(cfg: TrainConfig, recipes: list[str], *, echo=print) -> list[dict]:
    """Run every recipe (in its own process) and write the table and the figure."""
    recipes = [get_recipe(r).name for r in recipes]  # unknown names fail before any work
    if len(set(recipes)) != len(recipes):
        raise ValueError("each recipe may appear once in --recipes")
    out = Path(cfg.out)
    if (out / "compare.md").exists() and not (cfg.resume or cfg.overwrite):
        raise RunError(f"{out} already holds a comparison; pass --resume to continue it or --overwrite to start over")
    out.mkdir(parents=True, exist_ok=True)
    data = prepare(cfg.data, cfg.vocab_size, cfg.cache_dir, cfg.token_dtype)  # once, here: the
    echo(f"data: {data.describe()}")  # runs then only read the cache, and their memory is their own
    summaries = []
    for i, name in enumerate(recipes):
        run_cfg = replace(cfg, recipe=name, out=str(out / name))
        run_dir = out / name
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir / "config.json"
        config_path.write_text(json.dumps(asdict(run_cfg), indent=2))
        echo(f"[{i + 1}/{len(recipes)}] {name}: {get_recipe(name).describe()}")
        done = subprocess.run([sys.executable, "-m", "fewerbits", "train", "--config-json", str(config_path)])
        summary_path = run_dir / "summary.json"
        if done.returncode != 0 or not summary_path.exists():
            if done.returncode in (130, -2):  # interrupted: the run saved its checkpoint
                raise KeyboardInterrupt
            summaries.append({"recipe": name, "error": f"exit code {done.returncode}", "run_dir": str(run_dir)})
            continue
        summaries.append(json.loads(summary_path.read_text()))
    device = resolve_device(cfg.device)
    header = (
        f"`fewerbits compare --recipes {','.join(recipes)} --preset {cfg.preset} --steps {cfg.steps} "
        f"--batch-size {cfg.batch_size} --seq-len {cfg.seq_len} --seed {cfg.seed}`, "
        f"{datetime.date.today().isoformat()}, {device_name(device)}, torch {torch.__version__}"
    )
    table = markdown_table(summaries)
    (out / "compare.md").write_text(f"{header}\n\n{table}\n")
    plot(out, summaries)
    echo(table)
    echo(f"\nwrote {out / 'compare.md'} and {out / 'compare.png'}")
    return summaries


def markdown_table(summaries: list[dict]) -> str:
    ok = [s for s in summaries if "error" not in s]
    first = ok[0]["final_val_loss"] if ok else None
    lines = [
        "| recipe | final val loss | vs " + (ok[0]["recipe"] if ok else "first") + " | tokens/s | peak memory | skipped steps |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for s in summaries:
        if "error" in s:
            lines.append(f"| {s['recipe']} | failed ({s['error']}; see {s['run_dir']}) | | | | |")
            continue
        gap = 100 * (s["final_val_loss"] - first) / first
        mem = s["peak_memory_bytes"] / 2**20
        lines.append(
            f"| {s['recipe']} | {s['final_val_loss']:.4f} | {gap:+.2f}% | {s['tokens_per_s']:,.0f} | "
            f"{mem:,.0f} MiB ({s['peak_memory_kind']}) | {s['skipped_steps']} |"
        )
    return "\n".join(lines)


def plot(out: Path, summaries: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [s for s in summaries if "error" not in s]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    base = None
    for s in ok:
        rows = read_metrics(Path(s["run_dir"]))
        train = [(r["step"], r["loss"]) for r in rows if "loss" in r and not r.get("skipped")]
        val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
        if train:
            axes[0].plot(*zip(*_smooth(train)), label=s["recipe"])
        if val:
            axes[1].plot(*zip(*val), marker="o", ms=3, label=s["recipe"])
            if base is None:
                base = dict(val)
            gaps = [(step, 100 * (v - base[step]) / base[step]) for step, v in val if step in base]
            axes[2].plot(*zip(*gaps), marker="o", ms=3, label=s["recipe"])
    titles = ("training loss (smoothed)", "validation loss", f"validation loss vs {ok[0]['recipe'] if ok else ''} (%)")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[2].axhline(0, color="black", lw=0.8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)


def _smooth(points, alpha: float = 0.3):
    out, ema = [], None
    for step, v in points:
        ema = v if ema is None else (1 - alpha) * ema + alpha * v
        out.append((step, ema))
    return out
