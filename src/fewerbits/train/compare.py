"""Train one model under several recipes, side by side, and show what each recipe did.

Every recipe starts from the same initial weights (the same seed builds the same fp32 model)
and sees the same batches in the same order (batches are a function of seed and step) and the
same validation windows. Each run is a separate process (`fewerbits train`), so tokens/s and
peak memory belong to that recipe alone — unless `jobs` > 1 trains several at once on one
device, which the table's header then says; its folder is OUT/<recipe>. With `resume`, runs
that finished with the same options are kept and the others continue or start.

Outputs: OUT/compare.md (one row per recipe: final validation loss, gap to the first recipe,
tokens/s, peak memory, skipped steps) and OUT/compare.png (training loss, validation loss, and
the validation loss's relative gap to the first recipe, against steps).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..convert import compile_options
from ..hardware import device_name, resolve_device
from ..recipes import get_recipe
from . import checkpoint as ckpt
from .data import prepare
from .loop import RunError, TrainConfig
from .metrics import read_metrics

DEFAULT_RECIPES = ("bf16", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "mxfp4", "nvfp4")


def compare(cfg: TrainConfig, recipes: list[str], *, jobs: int = 1, echo=print) -> list[dict]:
    """Run every recipe (each in its own process, `jobs` at a time) and write the table and
    the figure. With cfg.resume, a recipe whose run already finished with these options is
    taken as it is, and an unfinished one continues from its checkpoint."""
    recipes = [get_recipe(r).name for r in recipes]  # unknown names fail before any work
    if len(set(recipes)) != len(recipes):
        raise ValueError("each recipe may appear once in --recipes")
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    device = resolve_device(cfg.device)  # a device the runs cannot use fails here, before any folder
    out = Path(cfg.out)
    if (out / "compare.md").exists() and not (cfg.resume or cfg.overwrite):
        raise RunError(f"{out} already holds a comparison; pass --resume to continue it or --overwrite to start over")
    out.mkdir(parents=True, exist_ok=True)
    data = prepare(cfg.data, cfg.vocab_size, cfg.cache_dir, cfg.token_dtype)  # once, here: the
    echo(f"data: {data.describe()}")  # runs then only read the cache, and their memory is their own
    pending = []  # (index, name, run_dir, command)
    summaries: list[dict | None] = [None] * len(recipes)
    for i, name in enumerate(recipes):
        run_dir = out / name
        run_cfg = replace(cfg, recipe=name, out=str(run_dir),
                          resume=cfg.resume and ckpt.find(run_dir) is not None,
                          progress=cfg.progress and jobs == 1)
        done = _finished(run_dir, run_cfg) if cfg.resume else None
        if done is not None:
            echo(f"[{i + 1}/{len(recipes)}] {name}: finished earlier, kept ({run_dir})")
            summaries[i] = done
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = run_dir / "config.json"
        config_path.write_text(json.dumps(asdict(run_cfg), indent=2))
        command = [sys.executable, "-m", "fewerbits", "train", "--config-json", str(config_path)]
        pending.append((i, name, run_dir, command))
    interrupted = False
    running: list[tuple[int, str, Path, subprocess.Popen, object]] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i, name, run_dir, command = pending.pop(0)
                echo(f"[{i + 1}/{len(recipes)}] {name}: {get_recipe(name).describe()}"
                     + (f" (log: {run_dir / 'train.log'})" if jobs > 1 else ""))
                log = open(run_dir / "train.log", "a") if jobs > 1 else None
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT if log else None)
                running.append((i, name, run_dir, proc, log))
            finished = _wait_any(running)
            i, name, run_dir, proc, log = running.pop(finished)
            if log is not None:
                log.close()
            code = proc.returncode
            summary_path = run_dir / "summary.json"
            if code in (130, -2):  # interrupted: the run saved its checkpoint
                interrupted = True
                pending.clear()
            if code != 0 or not summary_path.exists():
                summaries[i] = {"recipe": name, "error": f"exit code {code}", "run_dir": str(run_dir)}
                continue
            summaries[i] = json.loads(summary_path.read_text())
            if jobs > 1:
                echo(f"{name}: done, final validation loss {summaries[i]['final_val_loss']:.4f}")
    except KeyboardInterrupt:
        for *_, proc, log in running:  # the runs got the interrupt too: let them checkpoint
            proc.wait()
        raise
    if interrupted:
        raise KeyboardInterrupt
    header = (f"`{command_line(cfg, recipes, jobs)}`, {datetime.date.today().isoformat()}, "
              f"{device_name(device)}, torch {torch.__version__}")
    if jobs > 1:
        header += (f"\n\n{jobs} recipes trained at once on one device: tokens/s and peak memory "
                   "were measured while sharing it (see `fewerbits train` alone for either)")
    table = markdown_table(summaries)
    (out / "compare.md").write_text(f"{header}\n\n{table}\n")
    plot(out, summaries)
    echo(table)
    echo(f"\nwrote {out / 'compare.md'} and {out / 'compare.png'}")
    return summaries


def command_line(cfg: TrainConfig, recipes: list[str], jobs: int = 1) -> str:
    """The `fewerbits compare` command that the table's header names: the options that shape the
    runs' losses, speed and memory (the model, the batches, delayed scaling's weight casts,
    compilation, processes at once)."""
    return (
        f"fewerbits compare --recipes {','.join(recipes)} --preset {cfg.preset} --steps {cfg.steps} "
        f"--batch-size {cfg.batch_size} --seq-len {cfg.seq_len} --seed {cfg.seed}"
        + (f" --grad-accum {cfg.grad_accum}" if cfg.grad_accum > 1 else "")
        + (" --delayed-weight-once" if cfg.delayed_weight_once else "")
        + compile_options(cfg.compile, cfg.compile_blocks, cfg.compile_mode)
        + (f" --jobs {jobs}" if jobs > 1 else "")
    )


def _finished(run_dir: Path, run_cfg: TrainConfig) -> dict | None:
    """The summary of a run in run_dir that finished with run_cfg's options, else None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    volatile = ("out", "resume", "overwrite", "progress", "stop_after")
    same = all(saved.get(k) == v for k, v in asdict(run_cfg).items() if k not in volatile)
    return summary if same and summary.get("steps") == run_cfg.steps else None


def _wait_any(running) -> int:
    """Index of a finished process in `running` (polls; the runs take minutes)."""
    while True:
        for k, entry in enumerate(running):
            if entry[3].poll() is not None:
                return k
        time.sleep(0.2)


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
