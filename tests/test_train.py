"""The trainer on CPU: loss falls under every recipe, resume, checkpoints, loss scaling, guards."""

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fewerbits as fb
from fewerbits.cli import main
from fewerbits.diagnostics import sqnr_db
from fewerbits.models import Llama, get_preset
from fewerbits.train import TrainConfig, compare, train
from fewerbits.train import checkpoint as ckpt
from fewerbits.train.data import DataError, batch, eval_windows, prepare
from fewerbits.train.loop import RunError
from fewerbits.train.metrics import read_metrics
from fewerbits.train.precision import apply_recipe
from fewerbits.train.scaler import LossScaler

WORDS = "def return self if else for in range len value index total count result item key data node".split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A folder of 300 small generated 'source files' (deterministic)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(300):
        lines = []
        for _ in range(rng.randint(5, 30)):
            indent = "    " * rng.randint(0, 2)
            words = [rng.choice(WORDS) if rng.random() < 0.8 else f"x{rng.randint(0, 2000)}" for _ in range(rng.randint(2, 8))]
            lines.append(indent + " ".join(words))
        (root / f"module_{i:03d}.py").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def config(corpus, cache, tmp_path, **kw):
    base = dict(data=str(corpus), cache_dir=str(cache), vocab_size=512, preset="tiny", steps=20,
                batch_size=4, seq_len=64, eval_every=10, eval_windows=8, log_every=1,
                checkpoint_every=10, progress=False, tensorboard=False, out=str(tmp_path / "run"))
    base.update(kw)
    return TrainConfig(**base)


# -- data -----------------------------------------------------------------------------------------


def test_user_folder_is_split_by_document_and_cached(corpus, cache):
    data = prepare(str(corpus), 512, cache)
    assert 300 < data.vocab_size <= 512 and len(data.train) > 20 * len(data.val) > 0
    again = prepare(str(corpus), 512, cache)
    assert np.array_equal(np.asarray(again.train), np.asarray(data.train))
    meta = json.loads((data.tokenizer_path.parent / "meta.json").read_text())
    assert meta["val_documents"] > 0 and meta["train_documents"] + meta["val_documents"] == 300


def test_batches_are_a_function_of_seed_and_step(corpus, cache):
    data = prepare(str(corpus), 512, cache)
    a = batch(data.train, 4, 32, seed=0, step=7)
    assert all(torch.equal(u, v) for u, v in zip(a, batch(data.train, 4, 32, seed=0, step=7)))
    assert not torch.equal(a[0], batch(data.train, 4, 32, seed=0, step=8)[0])
    x, y = a
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    w1, w2 = eval_windows(data.val, 8, 32), eval_windows(data.val, 8, 32)
    assert torch.equal(w1[0], w2[0])


def test_jsonl_text_and_bin_data(tmp_path, cache):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": f"document {i} " + "words " * (i % 7 + 3)}) for i in range(400)))
    assert prepare(str(jsonl), 300, cache).vocab_size <= 300
    txt = tmp_path / "d.txt"
    txt.write_text("\n\n".join(f"paragraph {i} " + "more text " * (i % 5 + 1) for i in range(400)))
    assert len(prepare(str(txt), 300, cache).val) > 0
    ids = np.random.default_rng(0).integers(0, 1000, 50_000).astype(np.uint16)
    ids.tofile(tmp_path / "ids.bin")
    data = prepare(str(tmp_path / "ids.bin"), 1000, cache)
    assert data.tokenizer_path is None and len(data.val) == 1000
    with pytest.raises(DataError, match="beyond the vocabulary of 500; pass --vocab-size 1000"):
        prepare(str(tmp_path / "ids.bin"), 500, cache)


def test_bad_data_paths(tmp_path, cache):
    with pytest.raises(DataError, match="does not exist"):
        prepare(str(tmp_path / "missing.txt"), 512, cache)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no text"):
        prepare(str(tmp_path / "empty"), 512, cache)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="bad.jsonl:1: each JSONL line needs"):
        prepare(str(bad), 512, cache)


def test_default_corpus_is_pinned_and_large(cache):
    data = prepare(None, 8192, cache)
    assert data.source == "default corpus" and data.vocab_size == 8192
    assert len(data.train) + len(data.val) >= 10_000_000
    # sympy 1.14.0 + mpmath 1.3.0 + networkx 3.6.1, byte for byte
    assert data.fingerprint == "5f132ad279cff5edf8c52f8b4b52e6865c9bd1848557a812c61b0db7c34e02da"
    assert data.describe().startswith("default corpus:")


# -- the model and its precision -----------------------------------------------------------------


def test_conversion_of_the_model_keeps_head_and_router():
    cfg = get_preset("tiny-moe", 512)
    model = Llama(cfg)
    report = apply_recipe(model, "mxfp4_qat_experts")
    rows = {r.name: r for r in report.layers}
    assert rows["lm_head"].got == "bfloat16" and not rows["lm_head"].quantized
    assert rows["layers.0.mlp.router"].got == "bfloat16"
    assert rows["layers.0.mlp.experts.1.up_proj"].got == "mxfp4_qat_expert"
    assert rows["layers.0.attn.q_proj"].got == "mxfp4_qat_experts"
    assert isinstance(model.lm_head, fb.QuantizedLinear)  # in the compute dtype
    logits = model(torch.randint(0, 512, (2, 16)))
    assert logits.dtype == torch.bfloat16 and model.aux_loss() is not None


def test_model_config_errors():
    with pytest.raises(ValueError, match="valid presets: tiny"):
        get_preset("huge")
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        fb.models.ModelConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=3, ffn_dim=64)


# -- training ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", list(fb.RECIPES))
def test_loss_falls_under_every_recipe(recipe, corpus, cache, tmp_path):
    preset = "tiny-moe" if recipe == "mxfp4_qat_experts" else "tiny"
    summary = train(config(corpus, cache, tmp_path, recipe=recipe, preset=preset))
    vals = [r["val_loss"] for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    first_loss = read_metrics(tmp_path / "run")[0]["loss"]
    assert summary["final_val_loss"] < first_loss - 1.0, (first_loss, vals)
    assert summary["skipped_steps"] == 0 and summary["steps"] == 20


def test_metrics_lines(corpus, cache, tmp_path):
    train(config(corpus, cache, tmp_path, steps=10, tensorboard=True))
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 100
    data = json.loads((tmp_path / "run" / "data.json").read_text())
    assert len(data["sha256"]) == 64 and data["train_tokens"] > 0
    rows = read_metrics(tmp_path / "run")
    step_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in step_rows] == list(range(1, 11))
    assert set(step_rows[0]) >= {"step", "loss", "lr", "grad_norm", "tokens_per_s", "loss_scale", "skipped"}
    assert [r["step"] for r in rows if "val_loss" in r] == [10]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["peak_memory_bytes"] > 0 and summary["tokens_per_s"] > 0
    assert (tmp_path / "run" / "tokenizer.json").exists() and (tmp_path / "run" / "conversion.txt").exists()


@pytest.mark.parametrize("recipe", ["fp8_delayed", "nvfp4"])
def test_resume_equals_an_uninterrupted_run(recipe, corpus, cache, tmp_path):
    full = config(corpus, cache, tmp_path, recipe=recipe, out=str(tmp_path / "full"), steps=12, checkpoint_every=0)
    train(full)
    part = config(corpus, cache, tmp_path, recipe=recipe, out=str(tmp_path / "part"), steps=12, checkpoint_every=0, stop_after=5)
    train(part)
    state = ckpt.verify(tmp_path / "part" / "checkpoint")
    assert state["counters"]["step"] == 5
    train(config(corpus, cache, tmp_path, recipe=recipe, out=str(tmp_path / "part"), steps=12, checkpoint_every=0, resume=True))
    losses = lambda run: {r["step"]: r["loss"] for r in read_metrics(tmp_path / run) if "loss" in r}  # noqa: E731
    assert losses("part") == losses("full")  # steps 6 … 12 included: bit for bit
    from safetensors.torch import load_file

    w_full = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    w_part = load_file(str(tmp_path / "part" / "checkpoint" / "model.safetensors"))
    assert w_full.keys() == w_part.keys() and all(torch.equal(w_full[k], w_part[k]) for k in w_full)


def test_delayed_scaling_shares_input_scales_with_the_losses_of_unshared_ones(corpus, cache, tmp_path, monkeypatch):
    """The trainer lets fp8_delayed's q/k/v and gate/up quantize their shared input with one
    amax (`share_input_scales`, two groups a block) and trains to the losses, bit for bit, of
    each Linear reading its own scale."""
    import fewerbits.train.loop as loop

    notes = []
    kw = dict(recipe="fp8_delayed", steps=6, checkpoint_every=0)
    train(config(corpus, cache, tmp_path, out=str(tmp_path / "shared"), **kw), log=notes.append)
    assert f"delayed scaling: {2 * get_preset('tiny').n_layers} groups of Linears share their input's scale" in notes
    monkeypatch.setattr(loop, "share_input_scales", lambda model, *a, **k: [])
    train(config(corpus, cache, tmp_path, out=str(tmp_path / "own"), **kw))
    losses = lambda run: [r["loss"] for r in read_metrics(tmp_path / run) if "loss" in r]  # noqa: E731
    assert len(losses("shared")) == 6 and losses("shared") == losses("own")


def test_ctrl_c_writes_a_checkpoint(corpus, cache, tmp_path, monkeypatch):
    import fewerbits.train.loop as loop

    real_batch = loop.batch

    def interrupt_at_step_7(tokens, b, t, seed, step, micro=0):
        if step == 7:
            raise KeyboardInterrupt
        return real_batch(tokens, b, t, seed, step, micro)

    monkeypatch.setattr(loop, "batch", interrupt_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        train(config(corpus, cache, tmp_path, steps=12, checkpoint_every=0))
    assert ckpt.verify(tmp_path / "run" / "checkpoint")["counters"]["step"] == 7
    monkeypatch.setattr(loop, "batch", real_batch)
    summary = train(config(corpus, cache, tmp_path, steps=12, checkpoint_every=0, resume=True))
    assert summary["steps"] == 12


def test_run_folder_is_never_overwritten_by_surprise(corpus, cache, tmp_path):
    cfg = config(corpus, cache, tmp_path, steps=3)
    train(cfg)
    with pytest.raises(RunError, match="already holds a run; pass --resume .* or --overwrite"):
        train(cfg)
    before = (tmp_path / "run" / "checkpoint" / "model.safetensors").read_bytes()
    assert before == (tmp_path / "run" / "checkpoint" / "model.safetensors").read_bytes()
    train(config(corpus, cache, tmp_path, steps=3, overwrite=True, seed=1))
    assert before != (tmp_path / "run" / "checkpoint" / "model.safetensors").read_bytes()
    with pytest.raises(RunError, match="no checkpoint to resume"):
        train(config(corpus, cache, tmp_path, out=str(tmp_path / "fresh"), resume=True))
    with pytest.raises(RunError, match="different model_config"):
        train(config(corpus, cache, tmp_path, steps=6, resume=True, preset="tiny-moe"))


def test_corrupted_or_half_written_checkpoints_are_detected(corpus, cache, tmp_path):
    train(config(corpus, cache, tmp_path, steps=2))
    path = tmp_path / "run" / "checkpoint"
    model_file = path / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model_file.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors does not match its recorded sha256"):
        ckpt.verify(path)
    (path / "manifest.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        ckpt.verify(path)
    # a swap cut short: only the old checkpoint and a half-written new one are left
    run = tmp_path / "run2"
    train(config(corpus, cache, tmp_path, steps=2, out=str(run)))
    (run / "checkpoint").rename(run / ".checkpoint-old")
    (run / ".checkpoint-new").mkdir()
    (run / ".checkpoint-new" / "model.safetensors").write_bytes(b"partial")
    assert ckpt.find(run) == run / ".checkpoint-old"
    train(config(corpus, cache, tmp_path, steps=4, out=str(run), resume=True))
    assert ckpt.verify(run / "checkpoint")["counters"]["step"] == 4


# -- loss scaling and guards ---------------------------------------------------------------------


def test_fp16_loss_scaling_saves_gradients_from_underflow():
    """A loss scaled down by 1e-6: in fp16 the activation gradients underflow to zero, unless
    the loss is scaled back up before backward (and the gradients unscaled after)."""
    torch.manual_seed(0)
    cfg = get_preset("tiny", 256)
    ref_model = Llama(cfg)
    x = torch.randint(0, 256, (4, 32))

    def grads(recipe, scale):
        model = Llama(cfg)
        model.load_state_dict(ref_model.state_dict())
        apply_recipe(model, recipe)
        loss = F.cross_entropy(model(x).float().reshape(-1, 256), x.reshape(-1)) * 1e-6
        (loss * scale).backward()
        return torch.cat([p.grad.flatten() / scale for p in model.parameters() if p.grad is not None])

    reference = grads("fp32", 1.0)
    unscaled = grads("fp16", 1.0)
    scaled = grads("fp16", 2.0**16)
    lost = (unscaled == 0).float().mean().item()
    assert lost > 0.5  # most gradients vanished
    assert sqnr_db(reference, unscaled) < 3
    assert sqnr_db(reference, scaled) > 20
    assert (scaled == 0).float().mean().item() < 0.05


def test_dynamic_scaler_backs_off_and_grows():
    s = LossScaler.create("dynamic")
    assert s.scale == 2.0**16
    s.update(found_inf=True)
    assert s.scale == 2.0**15
    s.growth_interval = 3
    for _ in range(3):
        s.update(found_inf=False)
    assert s.scale == 2.0**16
    static = LossScaler.create("static", 1024)
    static.update(found_inf=True)
    assert static.scale == 1024
    with pytest.raises(ValueError, match="none, dynamic or static"):
        LossScaler.create("sometimes")


def test_overflow_is_skipped_counted_and_backed_off(corpus, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(LossScaler, "create", classmethod(lambda cls, mode, s=0: cls("dynamic", 2.0**30)))
    summary = train(config(corpus, cache, tmp_path, recipe="fp16", steps=25))
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert summary["skipped_steps"] >= 1 and rows[0]["skipped"] is True
    assert summary["loss_scale"] < 2.0**30
    assert not rows[-1]["skipped"] and summary["final_val_loss"] < rows[0]["loss"]


def test_spikes_are_detected_and_can_be_skipped(corpus, cache, tmp_path):
    summary = train(config(corpus, cache, tmp_path, steps=10, spike_factor=0.5, skip_spikes=True, warmup=2))
    assert summary["spikes"] >= 1 and summary["skipped_steps"] == summary["spikes"]


def test_bf16_optimizer_states(corpus, cache, tmp_path):
    summary = train(config(corpus, cache, tmp_path, optimizer_states="bfloat16"))
    opt = torch.load(tmp_path / "run" / "checkpoint" / "optimizer.pt", weights_only=True)
    assert next(iter(opt["state"].values()))["exp_avg"].dtype == torch.bfloat16
    assert summary["final_val_loss"] < 6.0


def test_adamw_matches_torch():
    torch.manual_seed(0)
    p1 = torch.nn.Parameter(torch.randn(10, 10))
    p2 = torch.nn.Parameter(p1.detach().clone())
    ours = fb.train.optim.AdamW([p1], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW([p2], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    for _ in range(5):
        g = torch.randn(10, 10)
        p1.grad, p2.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.allclose(p1, p2, atol=1e-6)


# -- command line ---------------------------------------------------------------------------------


def cli(corpus, cache, tmp_path, *extra):
    return ["--data", str(corpus), "--cache-dir", str(cache), "--vocab-size", "512", "--batch-size", "4",
            "--seq-len", "64", "--eval-every", "5", "--eval-windows", "4", "--no-progress", "--no-tensorboard", *extra]


def test_cli_train_sample_and_errors(corpus, cache, tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(["train", "--recipe", "mxfp8", "--steps", "10", "--out", out, *cli(corpus, cache, tmp_path)]) == 0
    assert "mxfp8: 10 steps" in capsys.readouterr().out
    assert main(["sample", "--checkpoint", out, "--prompt", "def ", "--tokens", "12"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text) > 8
    for argv, message in [
        (["train", "--recipe", "fp7", "--out", out], "unknown recipe 'fp7'; valid recipes"),
        (["train", "--preset", "giant", "--out", str(tmp_path / "g"), *cli(corpus, cache, tmp_path)], "unknown preset 'giant'"),
        (["train", "--steps", "10", "--out", out, *cli(corpus, cache, tmp_path)], "already holds a run"),
        (["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "n")], "does not exist"),
        (["sample", "--checkpoint", str(tmp_path / "nothing")], "holds no checkpoint"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("fewerbits: error:") and message in err and "\n" not in err, err


def test_compare_header_names_the_options_that_set_speed_and_memory():
    """The header of compare.md names how the runs were compiled and accumulated, which change
    tokens/s and memory, beside the model and batch options; defaults stay unnamed."""
    from fewerbits.train.compare import command_line

    plain = command_line(TrainConfig(), ["bf16", "fp8_blockwise"])
    assert plain == ("fewerbits compare --recipes bf16,fp8_blockwise --preset tiny --steps 200 "
                     "--batch-size 8 --seq-len 128 --seed 0")
    cfg = TrainConfig(grad_accum=4, compile_blocks=True, compile_mode="reduce-overhead")
    assert command_line(cfg, ["bf16"], jobs=2).endswith(
        "--seed 0 --grad-accum 4 --compile-blocks --compile-mode reduce-overhead --jobs 2")
    cfg = TrainConfig(grad_accum=4, delayed_weight_once=True)
    assert command_line(cfg, ["fp8_delayed"]).endswith("--seed 0 --grad-accum 4 --delayed-weight-once")


def test_compare_writes_table_and_figure(corpus, cache, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--recipes", "bf16,mxfp4", "--steps", "6", "--out", str(out), *cli(corpus, cache, tmp_path)]
    assert main(argv) == 0
    table = (out / "compare.md").read_text()
    assert "| bf16 |" in table and "| mxfp4 |" in table and "+0.00%" in table
    assert (out / "compare.png").stat().st_size > 10_000
    assert "fewerbits compare --recipes bf16,mxfp4" in table
    s = [json.loads((out / r / "summary.json").read_text()) for r in ("bf16", "mxfp4")]
    assert s[0]["final_val_loss"] != s[1]["final_val_loss"]
    first = lambda r: read_metrics(out / r)[0]["loss"]  # noqa: E731
    assert first("bf16") == pytest.approx(first("mxfp4"), rel=0.02)  # same weights, same batch
    capsys.readouterr()
    assert main(argv) == 2 and "already holds a comparison" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid recipes"):
        compare(config(corpus, cache, tmp_path, out=str(tmp_path / "c2")), ["bf16", "fp5"])


def test_compare_runs_recipes_at_once_and_resume_keeps_finished_runs(corpus, cache, tmp_path, capsys):
    out = tmp_path / "par"
    argv = ["compare", "--recipes", "bf16,fp8_tensorwise,mxfp8", "--steps", "6", "--jobs", "3", "--out", str(out),
            *cli(corpus, cache, tmp_path)]
    assert main(argv) == 0
    table = (out / "compare.md").read_text()
    assert "--jobs 3" in table and "measured while sharing it" in table
    for r in ("bf16", "fp8_tensorwise", "mxfp8"):
        assert f"| {r} |" in table
        assert (out / r / "train.log").stat().st_size > 0  # each process wrote its own log
    sequential = tmp_path / "seq"
    assert main([*argv[:5], "--jobs", "1", "--out", str(sequential), *cli(corpus, cache, tmp_path)]) == 0
    for r in ("bf16", "fp8_tensorwise", "mxfp8"):  # sharing the device changes no number
        a, b = (json.loads((d / r / "summary.json").read_text())["final_val_loss"] for d in (out, sequential))
        assert a == b, r
    # resume: finished runs are kept as they are, a missing one is trained from scratch
    stamp = (out / "bf16" / "summary.json").stat().st_mtime_ns
    capsys.readouterr()
    argv_more = ["compare", "--recipes", "bf16,fp8_tensorwise,mxfp8,nvfp4", "--steps", "6", "--jobs", "2",
                 "--out", str(out), "--resume", *cli(corpus, cache, tmp_path)]
    assert main(argv_more) == 0
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, kept") == 3
    assert (out / "bf16" / "summary.json").stat().st_mtime_ns == stamp
    assert "| nvfp4 |" in (out / "compare.md").read_text()
    # the same folder with other options is not "finished": it continues from its checkpoint instead
    assert main([*argv_more[:4], "8", *argv_more[5:]]) == 0
    assert json.loads((out / "bf16" / "summary.json").read_text())["steps"] == 8
    with pytest.raises(ValueError, match="--jobs must be at least 1"):
        compare(config(corpus, cache, tmp_path, out=str(tmp_path / "c3")), ["bf16"], jobs=0)


def test_gradient_accumulation_reuses_quantized_weights_without_changing_a_bit(corpus, cache, tmp_path, monkeypatch):
    import fewerbits.linear as L
    import fewerbits.train.loop as loop

    prepared = []
    real = L._prepare
    monkeypatch.setattr(L, "_prepare", lambda t, *a, **k: (prepared.append(t.dim()), real(t, *a, **k))[1])
    kw = dict(recipe="fp8_tensorwise", steps=3, grad_accum=2, batch_size=2, eval_every=3, checkpoint_every=0)
    cached = train(config(corpus, cache, tmp_path, out=str(tmp_path / "a"), **kw))
    with_cache = len(prepared)
    monkeypatch.setattr(loop, "set_weight_cache", lambda model, on: [])  # no reuse anywhere
    prepared.clear()
    plain = train(config(corpus, cache, tmp_path, out=str(tmp_path / "b"), **kw))
    assert with_cache < len(prepared)  # fewer weight preparations: micro-batches and evaluation share them
    losses = lambda run: [r.get("loss", r.get("val_loss")) for r in read_metrics(tmp_path / run)]  # noqa: E731
    assert losses("a") == losses("b") and cached["final_val_loss"] == plain["final_val_loss"]


def test_compiled_gradient_accumulation_prepares_each_weight_once_a_step(corpus, cache, tmp_path, monkeypatch):
    """Compiled graphs do not look into the weight cache: under gradient accumulation the
    trainer prepares every reusable weight once a step, before its micro-batches, and releases
    it before the optimizer moves it — the same losses as without (compilation stubbed out:
    tests/test_linear.py compiles the prepared operands)."""
    import fewerbits.train.loop as loop

    events = []
    real_prepare, real_release = fb.QuantizedLinear.prepare_weight, fb.QuantizedLinear.release_weight
    def prepare(m, **kw):  # noted where there is something to prepare
        made = real_prepare(m, **kw)
        events.extend(["p"] if made else [])
        return made

    monkeypatch.setattr(fb.QuantizedLinear, "prepare_weight", prepare)
    monkeypatch.setattr(fb.QuantizedLinear, "release_weight", lambda m: events.append("r") or real_release(m))
    monkeypatch.setattr(loop, "compile_model", lambda model, **kw: model)
    kw = dict(recipe="fp8_tensorwise", steps=3, grad_accum=2, batch_size=2, eval_every=3, checkpoint_every=0)
    prepared = train(config(corpus, cache, tmp_path, out=str(tmp_path / "a"), compile=True, **kw))
    layers = events.count("p") // 3
    assert layers > 0 and events == (["p"] * layers + ["r"] * layers) * 3  # each step: all, then all released
    events.clear()
    plain = train(config(corpus, cache, tmp_path, out=str(tmp_path / "b"), **kw))
    assert events == []  # eager: the weight cache does it
    losses = lambda run: [r.get("loss", r.get("val_loss")) for r in read_metrics(tmp_path / run)]  # noqa: E731
    assert losses("a") == losses("b") and prepared["final_val_loss"] == plain["final_val_loss"]


def test_delayed_weight_once_quantizes_delayed_weights_once_a_step(corpus, cache, tmp_path, monkeypatch):
    """--delayed-weight-once under fp8_delayed with three micro-batches a step, eagerly: every
    delayed-scaling Linear is prepared once a step and released before the optimizer moves its
    weight, and its weight's amax history holds one amax a step (9 forwards, 3 amaxes), where
    without the option it holds one a micro-batch; the input's holds one a micro-batch either way.
    A run made without it does not resume with it."""
    import fewerbits.train.loop as loop

    events, models = [], []
    real_prepare, real_release, real_build = (fb.QuantizedLinear.prepare_weight, fb.QuantizedLinear.release_weight,
                                              loop.build)

    def prepare(m, **kw):
        made = real_prepare(m, **kw)
        events.extend(["p"] if made else [])
        return made

    monkeypatch.setattr(fb.QuantizedLinear, "prepare_weight", prepare)
    monkeypatch.setattr(fb.QuantizedLinear, "release_weight", lambda m: events.append("r") or real_release(m))
    monkeypatch.setattr(loop, "build", lambda *a: (lambda out: models.append(out[0]) or out)(real_build(*a)))
    kw = dict(recipe="fp8_delayed", steps=3, grad_accum=3, batch_size=2, eval_every=3, checkpoint_every=0)
    counts = {}
    for run, once in (("a", True), ("b", False)):
        events.clear()
        train(config(corpus, cache, tmp_path, out=str(tmp_path / run), delayed_weight_once=once, **kw))
        delayed = [m for m in models[-1].modules() if isinstance(m, fb.QuantizedLinear) and m.delayed_scaling is not None]
        assert delayed
        counts[run] = {tuple((m.delayed_scaling.amax_history[r] > 0).sum().item() for r in (0, 1)) for m in delayed}
        layers = events.count("p") // 3
        assert events == ((["p"] * layers + ["r"] * layers) * 3 if once else [])
        assert layers == (len(delayed) if once else 0)
    assert counts == {"a": {(9, 3)}, "b": {(9, 9)}}
    with pytest.raises(loop.RunError, match="different delayed_weight_once"):
        train(config(corpus, cache, tmp_path, out=str(tmp_path / "b"), delayed_weight_once=True, resume=True, **kw))


@torch.no_grad()
def _adamw_reference(params, states, lr, b1, b2, eps, wd, state_dtype):
    """The single-tensor AdamW formula (the optimizer's definition), one parameter at a time."""
    for p, s in zip(params, states):
        if not s:
            s.update(step=0, m=torch.zeros_like(p, dtype=state_dtype), v=torch.zeros_like(p, dtype=state_dtype))
        s["step"] += 1
        t = s["step"]
        g = p.grad.float()
        m = s["m"].float().lerp_(g, 1 - b1)
        v = s["v"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
        s["m"].copy_(m)
        s["v"].copy_(v)
        update = (m / (1 - b1**t)) / (v / (1 - b2**t)).sqrt_().add_(eps)
        if wd:
            update = update.add(p.float(), alpha=wd)
        p.add_(update.to(p.dtype), alpha=-lr)


def _adamw_steps(opt, ours, ref, state_dtype, device="cpu"):
    """Six steps of `opt` on `ours` and of the single-tensor formula on `ref` with the same
    gradients (seven orders of magnitude; parameter 1 skips step 2; the first two parameters
    decay, the others not): yields the formula's states after each step."""
    states = [{} for _ in ref]
    for step in range(6):
        for i, (a, b) in enumerate(zip(ours, ref)):
            if step == 2 and i == 1:  # a parameter without a gradient this step falls behind by one
                a.grad = b.grad = None
                continue
            g = torch.randn(a.shape, device=device) * 10 ** (step - 3)
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        live = [i for i, b in enumerate(ref) if b.grad is not None]
        for wd, idx in ((0.1, [0, 1]), (0.0, [2, 3])):
            use = [i for i in idx if i in live]
            _adamw_reference([ref[i] for i in use], [states[i] for i in use], 3e-3, 0.9, 0.95, 1e-8, wd, state_dtype)
        yield states


def _adamw_case(shapes, state_dtype, device="cpu", **kw):
    torch.manual_seed(0)
    ours = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    opt = fb.train.optim.AdamW([{"params": ours[:2], "weight_decay": 0.1}, {"params": ours[2:], "weight_decay": 0.0}],
                               lr=3e-3, state_dtype=state_dtype, **kw)
    return opt, ours, ref


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_adamw_equals_the_single_tensor_formula_bit_for_bit(state_dtype):
    opt, ours, ref = _adamw_case([(33, 17), (64,), (5, 3, 2), (1,)], state_dtype, fused=False)
    for _ in _adamw_steps(opt, ours, ref, state_dtype):
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    assert opt.state[ours[1]]["step"].item() == 5 and opt.state[ours[0]]["step"].item() == 6


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_fused_adamw_kernel_follows_the_formula(state_dtype):
    """The one-pass Triton update (compiled on a GPU, interpreted on a CPU) against the
    single-tensor formula, over steps whose gradients span seven orders of magnitude, a
    parameter that skips a step, and a group without weight decay."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # 4099: more than one program, a ragged end
    opt, ours, ref = _adamw_case([(33, 17), (4099,), (5, 3, 2), (1,)], state_dtype, device, fused=True)
    for states in _adamw_steps(opt, ours, ref, state_dtype, device):
        # every operation rounded once, as in the formula; CPU and GPU torch contract some into
        # fused multiply-adds, so the states may differ in their last bit, and the parameters by
        # a few ulps of themselves or of the step lr·u. bf16 states: a last-bit difference can
        # round a state the other way, a 2⁻⁸ change of the update (≤ lr·2⁻⁸ per step).
        atol = 3e-3 * (2**-18 if state_dtype == torch.float32 else 2**-5)
        for a, b in zip(ours, ref):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=2**-21, atol=atol)
        for i, s in enumerate(states):
            if s:  # the stored states: the same dtype, equal up to the last bits of the
                # largest (m + w·(g − m) cancels, so a small m can differ more in relative terms)
                st = opt.state[ours[i]]
                assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == state_dtype
                ulps = 2**-6 if state_dtype == torch.bfloat16 else 2**-20
                for ours_s, ref_s in ((st["exp_avg"], s["m"]), (st["exp_avg_sq"], s["v"])):
                    torch.testing.assert_close(ours_s.float(), ref_s.float(), rtol=0,
                                               atol=ulps * ref_s.float().abs().max().item())
    assert opt.state[ours[1]]["step"].item() == 5


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("max_norm", [0.5, 1e6, float("inf")])
def test_clipping_by_the_optimizer_equals_clip_then_step(fused, max_norm):
    """clip_coefficient + AdamW.step(grad_scale=…) against torch's clip_grad_norm_ then step:
    the same norm and, step after step, the same parameters and states bit for bit — on the
    multi-tensor path and on the fused kernel (interpreted on a CPU), which leaves the
    gradients unscaled instead of scaling them in place. max_norm 0.5 clips, 1e6 does not
    (coefficient 1), inf is the trainer's 'no clipping'."""
    from fewerbits.train.optim import clip_coefficient

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    shapes = [(33, 17), (4099,), (5, 3, 2), (1,)]
    ours = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    make = lambda ps: fb.train.optim.AdamW([{"params": ps[:2], "weight_decay": 0.1},  # noqa: E731
                                            {"params": ps[2:], "weight_decay": 0.0}], lr=3e-3, fused=fused)
    opt, ref_opt = make(ours), make(ref)
    clipped = 0
    for step in range(4):
        for a, b in zip(ours, ref):
            g = torch.randn(a.shape, device=device) * 10 ** (step - 1)
            a.grad, b.grad = g.clone(), g.clone()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
        ref_opt.step()
        norm, coefficient = clip_coefficient(ours, max_norm)
        grads = [a.grad.clone() for a in ours]
        opt.step(grad_scale=coefficient)
        assert torch.equal(norm, ref_norm)
        clipped += int(coefficient.item() < 1)
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
            assert torch.equal(opt.state[a]["exp_avg"], ref_opt.state[b]["exp_avg"])
            assert torch.equal(opt.state[a]["exp_avg_sq"], ref_opt.state[b]["exp_avg_sq"])
        if fused:  # the kernel scaled what it read, not the stored gradients
            assert all(torch.equal(a.grad, g) for a, g in zip(ours, grads))
    assert (clipped > 0) == (max_norm == 0.5)
    with pytest.raises(ValueError, match="one-element floating-point"):
        opt.step(grad_scale=torch.ones(2))


def test_a_cached_quantized_weight_follows_the_fused_update():
    """The fused kernel writes the parameters through raw pointers; their version counters must
    still move, or a QuantizedLinear caching its weight (the trainer's setting under gradient
    accumulation) would go on multiplying the first step's quantized weight."""
    from fewerbits.train.optim import AdamW

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    layer = fb.QuantizedLinear(64, 32, recipe="fp8_tensorwise", device=device)
    layer.cache_weight = True
    opt = AdamW(layer.parameters(), lr=1e-2, fused=True)
    x = torch.randn(16, 64, device=device)
    for _ in range(2):
        versions = [p._version for p in layer.parameters()]
        layer(x).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert all(p._version > v for p, v in zip(layer.parameters(), versions))
        with torch.no_grad():
            cached = layer(x)
            layer.cache_weight = False  # empties the cache: the weight quantized afresh
            fresh = layer(x)
            layer.cache_weight = True
        assert torch.equal(cached, fresh)


def test_fused_adamw_finds_each_parameters_amax_as_it_writes_it():
    """AdamW.weight_amax: max |p| of the parameter the fused kernel just wrote (bit for bit; NaN
    where p holds NaN), from one atomic maximum per program of the magnitudes' bits — over
    several programs and a ragged end — and None for a parameter the multi-tensor path
    updated, one that changed since, or one without a gradient at that step."""
    from fewerbits.train.optim import AdamW

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    ps = [torch.randn(s, device=device, requires_grad=True) for s in [(33, 17), (4099,), (1,), (5000,)]]
    with torch.no_grad():
        ps[1][4097] = -50.0  # the largest magnitude, negative, in the last program
        ps[3][7] = float("nan")
    opt = AdamW(ps, lr=1e-2, fused=True)
    for step in range(2):
        for i, p in enumerate(ps):
            p.grad = None if (step == 1 and i == 2) else torch.randn_like(p)
        opt.step()
        for i, p in enumerate(ps):
            amax = opt.weight_amax(p)
            if step == 1 and i == 2:
                assert amax is not None  # not written this step, unchanged: last step's still holds
            assert amax.dtype == torch.float32 and amax.shape == () and amax.device == p.device
            if i == 3:
                assert torch.isnan(amax)
            else:
                assert torch.equal(amax, p.detach().abs().amax()), (step, i)
    with torch.no_grad():
        ps[0].mul_(2.0)  # changed since the step: its amax no longer holds
    assert opt.weight_amax(ps[0]) is None and opt.weight_amax(ps[1]) is not None
    plain = AdamW(ps[:2], lr=1e-2, fused=False)
    for p in ps[:2]:
        p.grad = torch.randn_like(p)
    plain.step()
    assert plain.weight_amax(ps[0]) is None and plain.weight_amax(ps[1]) is None


def test_fused_adamw_keeps_its_amaxes_at_one_address_from_step_to_step():
    """The fused AdamW writes each parameter's amax (and its columns', asked for) where it wrote
    the last step's: CUDA graphs that take them as inputs record again when an input moves
    (docs/kernels-notes.md, v41). The values are each step's own. A step that leaves a parameter
    out (an expert that got no tokens) moves no one's slots and leaves that parameter its last
    amax; a parameter first updated after the others gets slots once, kept from then on."""
    from fewerbits.train.optim import AdamW

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    ps = [torch.randn(s, device=device, requires_grad=True) for s in [(40, 24), (300,), (5, 6)]]
    opt = AdamW(ps, lr=1e-2, fused=True)
    opt.weight_amax(ps[0], dim=0)  # asked before the first step: found from it on
    left_out = {0: [2], 3: [1], 4: [0, 2]}  # step → the parameters it leaves without a gradient
    where = []
    for step in range(7):
        before = [p.detach().abs().amax() for p in ps]
        for i, p in enumerate(ps):
            p.grad = None if i in left_out.get(step, []) else torch.randn_like(p)
        opt.step()
        amaxes = [opt.weight_amax(ps[0], dim=0)] + [opt.weight_amax(p) for p in ps]
        if step == 0:
            assert amaxes[3] is None  # never updated by the kernel yet
            continue
        assert torch.equal(amaxes[0], ps[0].detach().abs().amax(0))
        for i, p in enumerate(ps):
            assert torch.equal(amaxes[1 + i], p.detach().abs().amax())
            assert torch.equal(amaxes[1 + i], before[i]) == (i in left_out.get(step, [])), (step, i)
        where.append(tuple(a.data_ptr() for a in amaxes))
    assert len(set(where)) == 1, where


def test_fused_adamw_finds_the_columns_amaxes_asked_for():
    """AdamW.weight_amax(p, dim=0): a 2-D parameter's amax per column, found by the fused kernel
    (by tiles, with a ragged end both ways) from the step after the first ask, bit for bit
    (NaN for a column holding NaN); the update and the whole amax are the same bits as the
    kernel that finds no columns'; anything but a 2-D parameter, or another dim, is refused."""
    from fewerbits.kernels.adamw import COLUMNS_TILE
    from fewerbits.train.optim import AdamW

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    tr, tc, steps, _ = COLUMNS_TILE
    shape = (tr * steps + 3, tc + 5)  # two programs down, two across, both ragged
    ps = [torch.randn(shape, device=device, requires_grad=True) for _ in range(2)]
    vec = torch.randn(7, device=device, requires_grad=True)
    gain = torch.randn((), device=device, requires_grad=True)  # 0-d: the flat kernel, no columns
    with torch.no_grad():
        for p in ps:
            p[tr * steps + 1, tc + 2] = -40.0  # a column's largest magnitude, in the last program
        ps[1][5, 3] = float("nan")
    ours, plain = AdamW(ps + [vec, gain], lr=1e-2, fused=True), AdamW([p.detach().clone().requires_grad_() for p in ps],
                                                              lr=1e-2, fused=True)
    assert ours.weight_amax(ps[0], dim=0) is None  # asked before any step: found from the next one
    ours.weight_amax(ps[1], dim=0)
    for _ in range(2):
        for p, q in zip(ps, plain.param_groups[0]["params"]):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        vec.grad, gain.grad = torch.randn_like(vec), torch.randn_like(gain)
        ours.step()
        plain.step()
        for p, q in zip(ps, plain.param_groups[0]["params"]):
            assert torch.equal(p.detach().nan_to_num(), q.detach().nan_to_num())
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(ours.state[p][name].nan_to_num(), plain.state[q][name].nan_to_num())
            cols, whole = ours.weight_amax(p, dim=0), ours.weight_amax(p)
            assert cols.dtype == torch.float32 and cols.shape == (shape[1],) and cols.device == p.device
            want = p.detach().abs().amax(0)
            assert torch.equal(cols.nan_to_num(-1.0), want.nan_to_num(-1.0))
            assert torch.equal(whole.nan_to_num(-1.0), plain.weight_amax(q).nan_to_num(-1.0))
    assert torch.isnan(ours.weight_amax(ps[1], dim=0)[3]) and not torch.isnan(ours.weight_amax(ps[1], dim=0)[4])
    assert torch.equal(ours.weight_amax(gain), gain.detach().abs())
    with pytest.raises(ValueError, match="2-D parameter"):
        ours.weight_amax(vec, dim=0)
    with pytest.raises(ValueError, match="not dim=1"):
        ours.weight_amax(ps[0], dim=1)


def test_fused_adamw_refuses_what_it_cannot_update():
    p = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    p.grad = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32 parameters"):
        fb.train.optim.AdamW([p], fused=True).step()
    with pytest.raises(ValueError, match="fused must be"):
        fb.train.optim.AdamW([p], fused="yes")


def test_a_step_frees_its_gradients_and_logits(corpus, cache, tmp_path, monkeypatch):
    """What a step leaves behind costs memory in the next one: no gradient of step k is alive
    in the forward of step k + 1, and no fp32 logits are alive once backward starts."""
    import weakref

    from fewerbits.train.optim import AdamW

    grads, alive_grads, logits_freed = [], [], []
    real_step, real_forward, real_ce = AdamW.step, Llama.forward, F.cross_entropy

    def step(self, closure=None, **kw):
        grads[:] = [weakref.ref(p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None]
        return real_step(self, closure, **kw)

    def forward(self, tokens):
        if torch.is_grad_enabled():
            alive_grads.append(sum(r() is not None for r in grads))
        return real_forward(self, tokens)

    def cross_entropy(input, target, **kw):
        loss = real_ce(input, target, **kw)
        if loss.requires_grad:
            refs = [weakref.ref(input)] + ([weakref.ref(input._base)] if input._base is not None else [])
            loss.register_hook(lambda g: logits_freed.append(all(r() is None for r in refs)))
        return loss

    monkeypatch.setattr(AdamW, "step", step)
    monkeypatch.setattr(Llama, "forward", forward)
    monkeypatch.setattr(F, "cross_entropy", cross_entropy)
    train(config(corpus, cache, tmp_path, steps=3, eval_every=3, checkpoint_every=0))
    assert len(alive_grads) == 3 and len(grads) > 10 and alive_grads == [0, 0, 0]
    assert logits_freed == [True, True, True]


@pytest.mark.parametrize("recipe", ["fp8_blockwise", "mxfp4", "nvfp4"])
def test_saving_quantized_inputs_changes_no_bit(corpus, cache, tmp_path, recipe):
    """--save-quantized-inputs keeps each Linear's column-wise input copy instead of the input:
    the weight-gradient GEMM gets the same operand (the input is rounded to nearest in every
    recipe, so quantizing it in forward rather than backward draws no different noise)."""
    kw = dict(recipe=recipe, steps=3, eval_every=3, checkpoint_every=0)
    a = train(config(corpus, cache, tmp_path, out=str(tmp_path / "a"), **kw))
    b = train(config(corpus, cache, tmp_path, out=str(tmp_path / "b"), save_quantized_inputs=True, **kw))
    losses = lambda run: [r.get("loss", r.get("val_loss")) for r in read_metrics(tmp_path / run)]  # noqa: E731
    assert losses("a") == losses("b") and a["final_val_loss"] == b["final_val_loss"]
    from fewerbits.linear import QuantizedLinear
    from fewerbits.train.loop import build

    model, _, _ = build(config(corpus, cache, tmp_path, save_quantized_inputs=True, **kw),
                        prepare(str(corpus), 512, cache), torch.device("cpu"))
    flags = {m.save_quantized_input for m in model.modules() if isinstance(m, QuantizedLinear) and m.recipe.name == recipe}
    assert flags == {True}  # the option reached every quantized Linear


def test_recompute_weight_values_reaches_every_quantized_linear(corpus, cache, tmp_path):
    """--recompute-weight-values (NVFP4: quantize each weight again for backward instead of
    keeping its forward values) reaches every quantized Linear, and alone leaves the rest of
    the default policy (the last block kept in bf16) as it is."""
    from fewerbits.cli import build_parser
    from fewerbits.linear import QuantizedLinear
    from fewerbits.train.loop import build

    for argv in (["train", "--recipe", "nvfp4"], ["bench", "train"], ["memory"]):  # the same option everywhere
        assert build_parser().parse_args(argv + ["--recompute-weight-values"]).recompute_weight_values is True
        assert build_parser().parse_args(argv).recompute_weight_values is False
    data = prepare(str(corpus), 512, cache)
    models = [build(config(corpus, cache, tmp_path, recipe="nvfp4", recompute_weight_values=r), data,
                    torch.device("cpu"))[0] for r in (False, True)]
    for model, on in zip(models, (False, True)):
        layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        assert {m.recompute_weight_values for m in layers if m.recipe.name == "nvfp4"} == {on}
        assert {m._config.recompute_weight_values for m in layers if m.recipe.name == "nvfp4"} == {on}
    layers[0].recompute_weight_values = False  # the layer's switches are its autograd function's
    layers[0].save_quantized_input = True
    assert layers[0]._config.recompute_weight_values is False and layers[0]._config.save_quantized_input is True
    kinds = [[m.recipe.name for m in model.modules() if isinstance(m, QuantizedLinear)] for model in models]
    assert kinds[0] == kinds[1] and "bf16" in kinds[0]


def test_train_compile_blocks_reaches_compile_model(corpus, cache, tmp_path, monkeypatch, capsys):
    """`train --compile-blocks` compiles the model block by block (compile_model(blocks=True);
    the compilation itself is replaced here: tests/test_convert.py compiles by blocks)."""
    import fewerbits.train.loop as loop

    calls = []
    monkeypatch.setattr(loop, "compile_model", lambda model, **kw: calls.append(kw) or model)
    out = str(tmp_path / "c")
    assert main(["train", "--recipe", "fp8_tensorwise", "--steps", "2", "--compile-blocks", "--out", out,
                 *cli(corpus, cache, tmp_path)]) == 0
    assert calls == [{"blocks": True}]
    capsys.readouterr()


def test_an_moe_model_under_cuda_graphs_gets_a_note(corpus, cache, tmp_path, monkeypatch, capsys):
    """Under a mode that replays CUDA graphs an MoE model trains slower than without it (its
    experts' token counts change at every call): `train` says so in one line, and only for
    MoE models (the compilation and the graphs are replaced here, on a CPU)."""
    import fewerbits.train.loop as loop

    monkeypatch.setattr(loop, "compile_model", lambda model, **kw: model)
    monkeypatch.setattr(loop, "replays_cuda_graphs", lambda compiled, device, mode: compiled and bool(mode))
    for preset, noted in (("tiny-moe", True), ("tiny", False)):
        out = str(tmp_path / preset)
        assert main(["train", "--recipe", "bf16", "--preset", preset, "--steps", "1", "--compile-blocks",
                     "--compile-mode", "reduce-overhead", "--out", out, *cli(corpus, cache, tmp_path)]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "MoE models train slower" in line]
        assert len(lines) == noted, (preset, lines)


def test_train_compile_mode_reaches_compile_model_and_is_checked(corpus, cache, tmp_path, monkeypatch, capsys):
    """`train --compile-mode MODE` passes torch.compile's mode on (the compilation itself is
    replaced here; on a CPU no mode replays CUDA graphs, tests/test_cuda.py trains with them);
    a mode without compilation, or one torch.compile does not know, is a one-line error."""
    import fewerbits.train.loop as loop

    calls = []
    monkeypatch.setattr(loop, "compile_model", lambda model, **kw: calls.append(kw) or model)
    out = str(tmp_path / "m")
    assert main(["train", "--recipe", "fp8_blockwise", "--steps", "2", "--compile-blocks", "--compile-mode",
                 "reduce-overhead", "--grad-accum", "2", "--out", out, *cli(corpus, cache, tmp_path)]) == 0
    assert calls == [{"blocks": True, "mode": "reduce-overhead"}]
    assert json.loads((tmp_path / "m" / "checkpoint" / "state.json").read_text())["config"]["compile_mode"] == "reduce-overhead"
    capsys.readouterr()
    for extra, message in [
        (["--compile-mode", "reduce-overhead"], "compile mode 'reduce-overhead' needs compilation"),
        (["--compile", "--compile-mode", "fastest"], "unknown compile mode 'fastest'; valid modes: default,"),
    ]:
        assert main(["train", "--out", str(tmp_path / "e"), *extra, *cli(corpus, cache, tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fewerbits: error:") and message in err and "\n" not in err, err
    assert not (tmp_path / "e").exists()
