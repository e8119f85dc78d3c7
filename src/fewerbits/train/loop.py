"""The training loop: one recipe, one model, fp32 master weights, everything logged.

    for each step:
        lr from warm-up + cosine
        for each micro-batch (seeded by (seed, step, micro)):
            loss = cross_entropy(model(x) in fp32) (+ MoE load balancing)
            backward(loss × loss_scale / micro-batches)        gradients accumulate in fp32
        unscale; global norm; clip                             inf/NaN → skip, count, back off
        loss spike (above spike_factor × running mean) → logged, and skipped if asked
        AdamW step on the fp32 master weights
        every log_every: metrics.jsonl; every eval_every: validation loss on fixed windows;
        every checkpoint_every: an atomic checkpoint

`train(TrainConfig(...))` returns the run's summary (also written to RUN/summary.json).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..convert import Policy, check_compile_mode, compile_model, uses_cuda_graphs
from ..hardware import resolve_device
from ..linear import QuantizedLinear, prepare_weights, set_weight_amaxes, share_input_scales
from ..models import Llama, get_preset
from ..recipes import get_recipe
from . import checkpoint as ckpt
from .data import TokenData, batch, eval_windows, prepare
from .metrics import Metrics, Progress, read_metrics
from .optim import AdamW, clip_coefficient, param_groups
from .precision import apply_recipe
from .scaler import LossScaler

#: a preset's learning rate when --lr is not given
DEFAULT_LR = {"tiny": 3e-3, "tiny-moe": 3e-3, "small": 1e-3, "small-moe": 1e-3}


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Every field is also a command-line option (--field-name)."""

    recipe: str = "bf16"  #: precision recipe (see `fewerbits.RECIPES`)
    preset: str = "tiny"  #: model shapes (see `fewerbits.models.PRESETS`)
    steps: int = 200  #: optimizer steps
    out: str = "runs/run"  #: run folder: metrics, checkpoint, tokenizer, summary
    data: str | None = None  #: text file, folder, .jsonl or .bin of token ids; default: the embedded corpus
    seed: int = 0  #: initial weights and data order
    device: str = "auto"  #: auto, cpu or cuda
    batch_size: int = 8  #: sequences per micro-batch
    seq_len: int = 128  #: tokens per sequence
    grad_accum: int = 1  #: micro-batches per step
    lr: float | None = None  #: peak learning rate (default: 3e-3 tiny, 1e-3 small, 3e-4 larger)
    min_lr_ratio: float = 0.1  #: final learning rate as a fraction of the peak
    warmup: int | None = None  #: warm-up steps (default: 5% of the steps)
    weight_decay: float = 0.1  #: AdamW weight decay (matrices only)
    grad_clip: float = 1.0  #: maximum global gradient norm (0: no clipping)
    optimizer_states: str = "float32"  #: AdamW state dtype: float32 or bfloat16
    loss_scaling: str = "auto"  #: auto (dynamic for fp16), dynamic, static or none
    static_loss_scale: float = 65536.0  #: the scale of --loss-scaling static
    spike_factor: float = 2.0  #: a loss above this × its running mean is a spike
    skip_spikes: bool = False  #: skip the optimizer step on a loss spike
    moe_aux_coef: float = 0.01  #: weight of the MoE load-balancing loss
    eval_every: int = 25  #: steps between validation losses
    eval_windows: int = 32  #: fixed validation windows (seq_len tokens each)
    log_every: int = 5  #: steps between metrics lines
    checkpoint_every: int = 100  #: steps between checkpoints (0: only at the end)
    vocab_size: int = 8192  #: tokenizer vocabulary (or the vocabulary of a .bin)
    token_dtype: str = "uint16"  #: dtype of a .bin data file: uint16 or uint32
    cache_dir: str | None = None  #: tokenizer and token cache (default: ~/.cache/fewerbits)
    stop_after: int | None = None  #: stop with a checkpoint after this many steps of the schedule (--resume continues)
    resume: bool = False  #: continue the run in --out from its checkpoint
    overwrite: bool = False  #: start over in --out, deleting its checkpoint and metrics
    compile: bool = False  #: torch.compile the model
    compile_blocks: bool = False  #: torch.compile each transformer block instead (one graph for all blocks: about one block's compile time)
    compile_mode: str | None = None  #: torch.compile's mode, with --compile or --compile-blocks: default, reduce-overhead (on a GPU the compiled graphs replayed as CUDA graphs: the host launches a block at a time), max-autotune or max-autotune-no-cudagraphs
    save_quantized_inputs: bool = False  #: Linears keep their input's quantized column-wise copy for backward instead of the input (less activation memory; the same bits where inputs round to nearest, as in every built-in recipe)
    recompute_weight_values: bool = False  #: NVFP4 on a GPU: the input-gradient GEMM quantizes each weight again instead of keeping the forward's bf16 values (2 bytes a weight less memory between forward and backward, one more pass over the weights; the same bits)
    delayed_weight_once: bool = False  #: delayed scaling (fp8_delayed) with --grad-accum above 1: quantize each weight once a step for all its micro-batches, as Transformer Engine's is_first_microbatch does (the weight's amax history gets its amax for the first micro-batch and 0 for each later one): TE's numerics, not a speed-up (0.90× the default's tokens/s in a step of llama3-8b-8layers timed on an H100: its eager preparation costs the host more than the casts it saves; docs/kernels-notes.md v89); off, every micro-batch quantizes the weight again and records its amax
    progress: bool = True  #: show a progress line on the terminal
    tensorboard: bool = True  #: also write TensorBoard events (if tensorboard is installed)

    def __post_init__(self):
        get_recipe(self.recipe)  # unknown names fail here, with the list of valid ones
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_windows", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.optimizer_states not in ("float32", "bfloat16"):
            raise ValueError("optimizer_states must be float32 or bfloat16")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other; pick one")
        check_compile_mode(self.compile_mode, self.compile or self.compile_blocks)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class RunError(RuntimeError):
    """The run folder cannot be used as asked; the message says what to do."""


def _prepare_run_dir(cfg: TrainConfig) -> Path:
    run = Path(cfg.out)
    existing = ckpt.find(run)
    has_metrics = (run / "metrics.jsonl").exists()
    if cfg.resume:
        if existing is None:
            raise RunError(f"{run} has no checkpoint to resume; drop --resume to start a new run there")
    elif existing is not None or has_metrics:
        if not cfg.overwrite:
            raise RunError(
                f"{run} already holds a run; pass --resume to continue it or --overwrite to start over"
            )
        for name in ("checkpoint", ".checkpoint-old", ".checkpoint-new", "metrics.jsonl", "summary.json", "tensorboard"):
            path = run / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    run.mkdir(parents=True, exist_ok=True)
    return run


def lr_at(step: int, cfg: TrainConfig, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to peak · min_lr_ratio at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    floor = peak * cfg.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA max allocated"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "process peak RSS"
    except OSError:
        pass
    return 0, "unknown"


def set_weight_cache(model: nn.Module, on: bool) -> list:
    """Switch weight reuse (QuantizedLinear.cache_weight) on or off; returns the previous states."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    before = [m.cache_weight for m in layers]
    for m in layers:
        m.cache_weight = on
    return list(zip(layers, before))


@torch.no_grad()
def evaluate(model, windows, batch_size: int, device, cuda_graphs: bool = False) -> float:
    """Mean cross-entropy over fixed validation windows (no state is updated); the quantized
    weights are prepared once for all windows. With `cuda_graphs` (a model compiled in a mode
    that replays them) each batch begins a new replay, the previous batch's loss being read."""
    was_training = model.training
    model.eval()
    previous = set_weight_cache(model, True)
    x_all, y_all = windows
    total, count = 0.0, 0
    for i in range(0, len(x_all), batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = model(x).float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    for layer, on in previous:
        layer.cache_weight = on
    return total / count


def replays_cuda_graphs(compiled: bool, device: torch.device, mode: str | None) -> bool:
    """Whether the compiled step runs as CUDA graphs (a compiled model, a CUDA device, a mode
    that replays them)."""
    return compiled and device.type == "cuda" and uses_cuda_graphs(mode)


def moe_graphs_note(mode: str) -> str:
    """The note for an MoE model compiled in a mode that replays CUDA graphs."""
    return (f"note: --compile-mode {mode} replays CUDA graphs, and an MoE's experts see another token count "
            "at every call, for which graphs are recorded anew or not used: MoE models train slower under it "
            "(bf16 on small-moe: 0.41x the tokens/s without it on an H200; docs/recipes.md)")


def build(cfg: TrainConfig, data: TokenData, device: torch.device):
    """The model (seeded fp32 init, moved to device, recipe applied) and its conversion report."""
    model_cfg = get_preset(cfg.preset, data.vocab_size)
    if cfg.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"--seq-len {cfg.seq_len} exceeds preset {cfg.preset}'s max_seq_len {model_cfg.max_seq_len}")
    torch.manual_seed(cfg.seed)
    model = Llama(model_cfg).to(device)
    policy = Policy(save_quantized_input=cfg.save_quantized_inputs, recompute_weight_values=cfg.recompute_weight_values)
    report = apply_recipe(model, cfg.recipe, policy, device=device)
    return model, model_cfg, report


def train(cfg: TrainConfig, log=lambda line: None) -> dict:
    """Run (or resume) one training run; returns its summary. `log` receives progress notes."""
    device = resolve_device(cfg.device)
    run = _prepare_run_dir(cfg)
    data = prepare(cfg.data, cfg.vocab_size, cfg.cache_dir, cfg.token_dtype)
    log(f"data: {data.describe()}")
    (run / "data.json").write_text(json.dumps({
        "source": data.source, "sha256": data.fingerprint, "vocab_size": data.vocab_size,
        "train_tokens": len(data.train), "val_tokens": len(data.val),
    }, indent=2))
    if data.tokenizer_path is not None:
        shutil.copyfile(data.tokenizer_path, run / "tokenizer.json")
    recipe = get_recipe(cfg.recipe)
    model, model_cfg, report = build(cfg, data, device)
    (run / "conversion.txt").write_text(str(report) + "\n")

    opt = AdamW(
        param_groups(model, cfg.weight_decay), lr=0.0, weight_decay=cfg.weight_decay,
        state_dtype=getattr(torch, cfg.optimizer_states),
    )
    mode = cfg.loss_scaling
    if mode == "auto":
        mode = "dynamic" if recipe.loss_scaling == "dynamic" else "none"
    scaler = LossScaler.create(mode, cfg.static_loss_scale)
    peak_lr = cfg.lr if cfg.lr is not None else DEFAULT_LR.get(cfg.preset, 3e-4)
    warmup = cfg.warmup if cfg.warmup is not None else max(1, cfg.steps // 20)

    identity = {
        "recipe": recipe.name, "model_config": asdict(model_cfg), "data_sha256": data.fingerprint,
        "vocab_size": data.vocab_size, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
        "grad_accum": cfg.grad_accum, "seed": cfg.seed, "delayed_weight_once": cfg.delayed_weight_once,
    }
    counters = {"step": 0, "skipped": 0, "spikes": 0, "loss_ema": None, "tokens_seen": 0}
    if cfg.resume:
        path = ckpt.find(run)
        saved = ckpt.verify(path)
        was = {"delayed_weight_once": False, **saved["identity"]}  # (checkpoints from before the option)
        differs = [k for k, v in identity.items() if was.get(k) != v]
        if differs:
            raise RunError(
                f"{run}'s checkpoint was written with different {', '.join(differs)}; "
                "resume with the original options or start a new run"
            )
        state = ckpt.load(path, model, opt, device)
        scaler.load_state_dict(state["scaler"])
        counters.update(state["counters"])
        _truncate_metrics(run, counters["step"])

    metrics = Metrics(run, cfg.tensorboard)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if cfg.grad_accum > 1:  # the micro-batches of a step share each quantized weight
        set_weight_cache(model, True)
    # delayed scaling: the Linears that read one tensor quantize it with one amax (the same bits),
    # found by watching one forward, before any graph is made (none without delayed scaling)
    shared = share_input_scales(model, torch.zeros(1, cfg.seq_len, dtype=torch.long, device=device))
    if shared:
        log(f"delayed scaling: {len(shared)} groups of Linears share their input's scale")
    if cfg.delayed_weight_once and (cfg.grad_accum == 1 or not any(
            isinstance(m, QuantizedLinear) and m.delayed_scaling is not None for m in model.modules())):
        log("delayed_weight_once changes nothing here: it needs delayed scaling and --grad-accum above 1")
    compiled = cfg.compile or cfg.compile_blocks
    how = {"mode": cfg.compile_mode} if cfg.compile_mode else {}
    step_model = compile_model(model, blocks=cfg.compile_blocks, **how) if compiled else model
    graphs = replays_cuda_graphs(compiled, device, cfg.compile_mode)
    if graphs and model_cfg.n_experts:
        log(moe_graphs_note(cfg.compile_mode))
    windows = eval_windows(data.val, cfg.eval_windows, cfg.seq_len)
    params = [p for p in model.parameters() if p.requires_grad]
    progress = Progress(cfg.steps, f"{recipe.name} ", cfg.progress)
    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum
    rates, val_losses = [], []
    wall0 = time.perf_counter()

    def save_checkpoint():
        ckpt.save(run, model, opt, {
            "identity": identity, "config": asdict(cfg), "scaler": scaler.state_dict(),
            "counters": counters, "data_source": data.source,
        })

    try:
        end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
        for step in range(counters["step"], end):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg, peak_lr, warmup)
            for group in opt.param_groups:
                group["lr"] = lr
            loss_value = 0.0
            # the weights' amaxes as the fused AdamW found them writing the weights (per-tensor
            # quantizers then read no weight for them), before the weights are prepared
            set_weight_amaxes(model, opt.weight_amax)
            # compiled graphs do not look into the weight cache: they take the step's quantized
            # weights as inputs, made here once for all its micro-batches (under CUDA graphs into
            # the last step's tensors: a graph's inputs stay where they were)
            # (delayed scaling's weights only with delayed_weight_once, eager code too: they make
            # the step's entries of the weight's amax history here, and its forwards record none)
            once = cfg.grad_accum if cfg.delayed_weight_once else None
            prepared = (prepare_weights(model, in_place=graphs, micro_batches=once)
                        if (compiled or once) and cfg.grad_accum > 1 else [])
            ours = set()  # data pointers of gradients copied out of the CUDA graphs' memory
            for micro in range(cfg.grad_accum):
                x, y = (t.to(device) for t in batch(data.train, cfg.batch_size, cfg.seq_len, cfg.seed, step, micro))
                if graphs:  # a new replay: the previous micro-batch's outputs are done with
                    torch.compiler.cudagraph_mark_step_begin()
                # the logits have no name here: once the loss is computed, only what its
                # backward saves stays alive (a name would hold the fp32 logits through it)
                loss = F.cross_entropy(step_model(x).float().flatten(0, -2), y.reshape(-1))
                aux = model.aux_loss()
                total = loss + cfg.moe_aux_coef * aux if aux is not None else loss
                (total * (scaler.scale / cfg.grad_accum)).backward()
                loss_value += loss.item() / cfg.grad_accum
                if graphs and micro + 1 < cfg.grad_accum:
                    # a gradient first made by a replayed backward can be that replay's output
                    # itself, in the graphs' memory, which the next micro-batch's replay writes
                    # over: it moves out once, and the later micro-batches add to it in place
                    for p in params:
                        if p.grad is not None and p.grad.data_ptr() not in ours:
                            p.grad = p.grad.clone()
                            ours.add(p.grad.data_ptr())
            for layer in prepared:  # before the optimizer changes the weights
                layer.release_weight()

            if scaler.scale != 1.0:  # (no list of the gradients outlives this line: it
                # would keep them alive through the next step's forward and backward)
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], 1.0 / scaler.scale)
            clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            # clipping's coefficient goes to the optimizer, which scales each gradient as it
            # reads it (the fused AdamW: no pass over the gradients of its own)
            norm, clip_coef = clip_coefficient(params, clip)
            grad_norm = norm.item()
            found_inf = not (math.isfinite(grad_norm) and math.isfinite(loss_value))
            ema = counters["loss_ema"]
            spike = ema is not None and step >= warmup and loss_value > cfg.spike_factor * ema
            skip = found_inf or (spike and cfg.skip_spikes)
            if skip:
                counters["skipped"] += 1
            else:
                opt.step(grad_scale=clip_coef)
            opt.zero_grad(set_to_none=True)
            scaler.update(found_inf)
            counters["spikes"] += int(spike)
            if not found_inf and not spike:
                counters["loss_ema"] = loss_value if ema is None else 0.9 * ema + 0.1 * loss_value
            counters["step"] = step + 1
            counters["tokens_seen"] += tokens_per_step
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            rate = tokens_per_step / (time.perf_counter() - t0)
            rates.append(rate)
            progress.update(step + 1, loss_value, rate)

            last = step + 1 == end
            if (step + 1) % cfg.log_every == 0 or last or skip or spike:
                metrics.log({
                    "step": step + 1, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                    "tokens_per_s": rate, "loss_scale": scaler.scale, "skipped": bool(skip),
                    **({"spike": True} if spike else {}),
                })
            if (step + 1) % cfg.eval_every == 0 or last:
                set_weight_amaxes(model, opt.weight_amax)
                val = evaluate(step_model, windows, cfg.batch_size, device, cuda_graphs=graphs)
                val_losses.append((step + 1, val))
                metrics.log({"step": step + 1, "val_loss": val})
            if (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or last:
                save_checkpoint()
    except KeyboardInterrupt:
        save_checkpoint()
        progress.close()
        metrics.close()
        raise
    progress.close()
    metrics.close()

    peak, kind = _peak_memory(device)
    history = [r for r in read_metrics(run) if "val_loss" in r]
    summary = {
        "recipe": recipe.name, "preset": cfg.preset, "steps": counters["step"],
        "params": model.num_parameters(), "final_val_loss": history[-1]["val_loss"] if history else None,
        "tokens_per_s": statistics.median(rates[len(rates) // 5 :]) if rates else None,
        "peak_memory_bytes": peak, "peak_memory_kind": kind, "skipped_steps": counters["skipped"],
        "spikes": counters["spikes"], "loss_scale": scaler.scale, "device": str(device),
        "data": data.describe(), "data_sha256": data.fingerprint,
        "wall_s": time.perf_counter() - wall0, "run_dir": str(run),
        "torch": torch.__version__,
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _truncate_metrics(run: Path, step: int) -> None:
    """Drop metric lines past the checkpoint's step (written by an interrupted segment)."""
    path = run / "metrics.jsonl"
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))
