"""The memory planner: exact for what the trainer holds, its activation count against autograd's
own saved tensors, sharding arithmetic, the command line and bad input."""

import json

import pytest
import torch

import fewerbits as fb
from fewerbits import kernels, memory
from fewerbits.cli import main
from fewerbits.linear import QuantizedLinear
from fewerbits.models import Llama, get_preset
from fewerbits.quantize import QuantizedTensor
from fewerbits.train.optim import AdamW, param_groups
from fewerbits.train.precision import apply_recipe


def trainer_model(recipe, preset="tiny", vocab=512, save_quantized_input=False, recompute_weight_values=False):
    torch.manual_seed(0)
    model = Llama(get_preset(preset, vocab))
    apply_recipe(model, recipe, fb.Policy(save_quantized_input=save_quantized_input,
                                          recompute_weight_values=recompute_weight_values))
    return model


def saved_bytes(model) -> int:
    """Bytes of the distinct storages (parameters and buffers aside) autograd saves in a forward
    of two 64-token sequences, on the Triton backend (the interpreter here) as on a GPU."""
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in fixed:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(0, 512, (2, 64))
    kernels.set_backend("triton")  # the GPU's paths (NVFP4 keeps its weight values: the kernel's)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
    finally:
        kernels.set_backend("auto")
    return sum(saved.values())


def nbytes(t):
    if isinstance(t, QuantizedTensor):
        return t.nbytes
    return t.nbytes


@pytest.mark.parametrize("recipe, state_dtype, preset", [
    ("bf16", "float32", "tiny"), ("fp8_delayed", "bfloat16", "tiny"), ("nvfp4", "float32", "tiny"),
    ("mxfp4", "float32", "tiny"), ("fp8_blockwise", "float32", "tiny-moe")])
def test_everything_but_activations_is_the_sum_of_the_real_tensors(recipe, state_dtype, preset):
    model = trainer_model(recipe, preset)
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.cache_weight = True  # as the trainer sets it for gradient accumulation
    opt = AdamW(param_groups(model, 0.1), lr=1e-3, state_dtype=getattr(torch, state_dtype))
    x = torch.randint(0, 512, (2, 32))
    for _ in range(2):  # two micro-batches of one step
        torch.nn.functional.cross_entropy(model(x).float().reshape(-1, 512), x.reshape(-1)).backward()
    opt.step()
    est = fb.estimate_memory(get_preset(preset, 512), recipe, batch_size=2, seq_len=32, state_dtype=state_dtype,
                             grad_accum=2)
    params = list(model.parameters())
    assert est.params == sum(p.numel() for p in params) == model.num_parameters()
    assert est.items["master weights (fp32)"] == sum(p.nbytes for p in params)
    assert est.items["gradients"] == sum(p.grad.nbytes for p in params)
    assert est.items["optimizer states"] == sum(t.nbytes for s in opt.state.values() for t in s.values())
    kept = sum(nbytes(entry[1]) for m in model.modules() if isinstance(m, QuantizedLinear)
               for entry in m._config.weight_cache.values())
    assert est.items["kept weight copies"] == kept and (kept > 0)
    delayed = sum(b.nbytes for n, b in model.named_buffers() if ".delayed_scaling." in n)
    assert est.items["recipe state (amax histories)"] == delayed and (delayed > 0) == (recipe == "fp8_delayed")
    assert est.items["model buffers"] == model.rope_cos.nbytes + model.rope_sin.nbytes
    assert fb.estimate_memory(get_preset(preset, 512), recipe, seq_len=32).items["kept weight copies"] == 0


def test_delayed_weights_kept_once_a_step_are_what_prepare_weight_holds():
    """With delayed_weight_once, the kept weight copies grow by the operands prepare_weight
    holds for the delayed-scaling Linears (the fprop codes and their transpose, with scales);
    without gradient accumulation nothing is kept."""
    model = trainer_model("fp8_delayed", "tiny")
    held = 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear) and m.delayed_scaling is not None:
            assert m.prepare_weight(micro_batches=2)
            held += sum(t.nbytes for t in m._prepared if t is not None)
    cfg = get_preset("tiny", 512)
    kept = [fb.estimate_memory(cfg, "fp8_delayed", batch_size=2, seq_len=32, grad_accum=2, delayed_weight_once=once)
            .items["kept weight copies"] for once in (False, True)]
    assert held > 0 and kept[1] - kept[0] == held
    assert fb.estimate_memory(cfg, "fp8_delayed", seq_len=32, delayed_weight_once=True).items["kept weight copies"] == 0


@pytest.mark.parametrize("recipe, preset, save_quantized", [
    ("bf16", "tiny", False), ("fp8_tensorwise", "tiny", False), ("fp32", "tiny", False), ("bf16", "tiny-moe", False),
    ("fp8_blockwise", "tiny", True), ("mxfp8", "tiny", True), ("nvfp4", "tiny", True), ("mxfp4", "tiny", True),
    ("fp8_rowwise", "tiny", True), ("nvfp4", "tiny", False)])
def test_activations_are_what_autograd_saves(recipe, preset, save_quantized):
    """Unique storages autograd saves in a forward pass (CPU's flash attention saves what CUDA's does:
    q, k, v, the output and a fp32 log-sum-exp), against the estimate's count; with saved quantized
    inputs, nvfp4's last block (kept in bf16) still saves its bf16 inputs. On the Triton backend
    (the interpreter here), as on a GPU: nvfp4's Linears also keep their 16x16-block weights'
    bf16 values for backward."""
    model = trainer_model(recipe, preset, save_quantized_input=save_quantized)
    measured = saved_bytes(model)
    est = fb.estimate_memory(get_preset(preset, 512), recipe, batch_size=2, seq_len=64,
                             save_quantized_input=save_quantized)
    if save_quantized:  # less than the inputs themselves
        assert est.activations < fb.estimate_memory(get_preset(preset, 512), recipe, batch_size=2,
                                                    seq_len=64).activations
    if preset == "tiny-moe":  # the estimate assumes even routing; this router is not even
        assert est.activations == pytest.approx(measured, rel=0.1)
    elif recipe == "fp32":  # fp32 attention takes torch's math path on a CPU, which saves more
        assert est.activations <= measured
    else:
        assert est.activations == measured
        # four blocks (the recipe's, and those kept in its compute dtype), then the final norm
        # and the head's input
        from fewerbits.train.precision import high_precision_recipe

        cfg, r = get_preset(preset, 512), fb.get_recipe(recipe)
        n_q = memory.inventory(cfg, r).quantized_blocks
        per_block = sum(est.per_block.values())
        kept = sum(memory._block_activations(cfg, high_precision_recipe(r), 2 * 64, 1).values())
        blocks = n_q * per_block + (4 - n_q) * kept
        assert blocks < est.activations < blocks + per_block


@pytest.mark.parametrize("recipe, save_quantized", [("fp8_delayed", False), ("mxfp8 SR inputs", True)])
def test_inputs_each_linear_quantizes_its_own_way_count_once_a_linear(recipe, save_quantized):
    """Linears that read one input (q, k and v; gate and up) share what they save of it where
    they quantize it alike; under delayed scaling (each Linear's own amax) and with stochastic
    rounding of the saved copy each saves its own: the estimate counts what autograd saves,
    and more than the shared count (fp8_tensorwise's codes; mxfp8's copies rounded to nearest)."""
    from dataclasses import replace

    shared = "fp8_tensorwise"
    if recipe == "mxfp8 SR inputs":
        shared = fb.get_recipe("mxfp8")
        recipe = replace(shared, name="mxfp8_sr_inputs",
                         wgrad=replace(shared.wgrad, b=replace(shared.wgrad.b, rounding="stochastic")))
    cfg = get_preset("tiny", 512)
    est = fb.estimate_memory(cfg, recipe, batch_size=2, seq_len=64, save_quantized_input=save_quantized)
    assert est.activations == saved_bytes(trainer_model(recipe, save_quantized_input=save_quantized))
    assert est.activations > fb.estimate_memory(cfg, shared, batch_size=2, seq_len=64,
                                                save_quantized_input=save_quantized).activations


def test_nvfp4_weight_values_count_only_where_kept():
    """NVFP4's Linears keep their 16x16-block weights' bf16 values (and tensor scales) from the
    forward to the backward unless asked to quantize the weights again: with
    recompute_weight_values the estimate falls by exactly what autograd saves less."""
    cfg = get_preset("tiny", 512)
    kept, again = (fb.estimate_memory(cfg, "nvfp4", batch_size=2, seq_len=64, recompute_weight_values=r)
                   for r in (False, True))
    measured_kept, measured_again = (saved_bytes(trainer_model("nvfp4", recompute_weight_values=r))
                                     for r in (False, True))
    assert again.activations == measured_again and kept.activations == measured_kept
    assert kept.activations - again.activations == measured_kept - measured_again > 0
    assert again.settings["recompute_weight_values"] and not kept.settings["recompute_weight_values"]
    for recipe in ("bf16", "mxfp4", "fp8_blockwise"):  # nothing to recompute: the same estimate
        a, b = (fb.estimate_memory(cfg, recipe, batch_size=2, seq_len=64, recompute_weight_values=r).total_bytes
                for r in (False, True))
        assert a == b


def test_a_hugging_face_config_counts_the_same_parameters():
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=300, max_position_embeddings=128, tie_word_embeddings=False)
    n = sum(p.numel() for p in LlamaForCausalLM(hf).parameters())
    assert fb.estimate_memory(hf.to_dict(), "bf16", batch_size=1, seq_len=16).params == n


def test_parameter_count_with_a_layer_shape_gives_back_the_preset():
    cfg = get_preset("125m")
    params = Llama(cfg).num_parameters()
    again = memory.config_from_params(params, dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                      vocab_size=cfg.vocab_size, n_kv_heads=cfg.n_kv_heads)
    assert again.ffn_dim == cfg.ffn_dim
    with pytest.raises(ValueError, match="do not fill"):
        memory.config_from_params(1000, dim=64, n_layers=2, n_heads=4, vocab_size=300)


def test_sharding_divides_what_it_shards():
    base = fb.estimate_memory("125m", "bf16", batch_size=2, seq_len=256)
    for zero, sharded in [(1, {"optimizer states"}), (2, {"optimizer states", "gradients"}),
                          (3, {"optimizer states", "gradients", "master weights (fp32)"})]:
        est = fb.estimate_memory("125m", "bf16", batch_size=2, seq_len=256, dp=4, zero=zero)
        for item in ("master weights (fp32)", "gradients"):
            expect = -(-base.items[item] // 4) if item in sharded else base.items[item]
            assert est.items[item] == expect, (zero, item)
        assert est.activations == base.activations
    tp = fb.estimate_memory("125m", "bf16", batch_size=2, seq_len=256, tp=2)
    cfg = get_preset("125m")
    norms = (2 * cfg.n_layers + 1) * cfg.dim  # RMSNorm weights are replicated
    assert tp.items["master weights (fp32)"] == 4 * ((base.params - norms) // 2 + norms)
    assert tp.activations < base.activations
    ckpt = fb.estimate_memory("125m", "bf16", batch_size=2, seq_len=256, checkpointing="block")
    assert ckpt.activations < base.activations / 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(seq_len=-5), "seq_len must be a positive integer"),
    (dict(tp=5), "not divisible by the tensor-parallel size 5"),
    (dict(zero=2), "needs a data-parallel size above 1"),
    (dict(zero=4, dp=2), "zero must be 0, 1, 2 or 3"),
    (dict(state_dtype="float8"), "state_dtype must be one of"),
    (dict(checkpointing="every"), "checkpointing must be one of"),
    (dict(seq_len=4096), "exceeds the model's max_seq_len"),
])
def test_bad_input_is_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fb.estimate_memory("125m", "bf16", **kwargs)


def test_memory_cli(tmp_path, capsys):
    assert main(["memory", "--preset", "125m", "--recipes", "fp8_tensorwise", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"] > 1e8 and out["total_bytes"] == max(out["phases"].values())
    assert set(out["items"]) >= {"master weights (fp32)", "gradients", "optimizer states", "activations, bfloat16",
                                 "activations, float32", "logits and loss"}
    assert out["per_block"]["bfloat16"] > 0 and out["per_block"]["float32"] > 0
    png = tmp_path / "m.png"
    assert main(["memory", "--preset", "small", "--recipes", "bf16,nvfp4", "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "| **peak** |" in printed and png.stat().st_size > 10_000
    assert main(["memory", "--survey"]) == 0
    survey = capsys.readouterr().out
    assert "| BF16 mixed | 940 | 12 (840) | 100 | 280 | 1,220 | 1,120 | 1,220 |" in survey
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "intermediate_size": 128, "vocab_size": 300}))
    assert main(["memory", "--config", str(cfg), "--recipes", "bf16", "--seq-len", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "config.json"
    for argv, message in [
        (["memory", "--recipes", "fp7"], "unknown recipe 'fp7'"),
        (["memory", "--preset", "huge"], "neither a preset"),
        (["memory", "--params", "1000000"], "--params needs --dim"),
        (["memory", "--tp", "3"], "not divisible by the tensor-parallel size 3"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("fewerbits: error:") and message in err and "\n" not in err, err
