"""convert(): the layer policy, the report, Hugging Face models, and torch.compile."""

import contextlib
import re

import pytest
import torch
import torch.nn as nn

import fewerbits as fb


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.router = nn.Linear(d, 4)

    def forward(self, x):
        return x + self.mlp(self.attn(x))


class TinyLM(nn.Module):
    def __init__(self, d=32, n=8, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.embed_proj = nn.Linear(d, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed_proj(self.embed(ids))
        for block in self.layers:
            x = block(x)
        return self.lm_head(x)


def test_default_policy_and_report():
    model = TinyLM()
    report = fb.convert(model, "fp8_tensorwise")
    rows = {r.name: r for r in report.layers}
    assert len(rows) == 2 + 8 * 4
    assert rows["lm_head"].got == "bfloat16" and "lm_head" in rows["lm_head"].reason
    assert rows["embed_proj"].got == "bfloat16"
    assert rows["layers.3.router"].got == "bfloat16"
    assert rows["layers.3.mlp.0"].got == "fp8_tensorwise"
    assert isinstance(model.layers[3].mlp[0], fb.QuantizedLinear)
    assert type(model.lm_head) is nn.Linear
    assert len(report.converted) == 8 * 3
    text = str(report)
    assert "layers.7.mlp.2" in text and "24 of 34 Linear layers converted to fp8_tensorwise" in text


def test_nvfp4_keeps_the_last_15_percent_of_blocks():
    model = TinyLM(n=20)
    report = fb.convert(model, "nvfp4")
    kept_blocks = {int(r.name.split(".")[1]) for r in report.kept if r.name.startswith("layers.") and "blocks" in r.reason}
    assert kept_blocks == {17, 18, 19}  # round(0.15 · 20) = 3
    assert "one of the last 3 of 20 blocks" in str(report)


def test_the_blocks_are_the_outermost_list_even_with_more_experts_than_blocks():
    """keep_last_blocks counts transformer blocks, not a block's experts, however many."""
    class MoEBlock(nn.Module):
        def __init__(self, d=16, n_experts=8):
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(n_experts))

    model = nn.Module()
    model.layers = nn.ModuleList(MoEBlock() for _ in range(4))
    report = fb.convert(model, "fp8_tensorwise", policy=fb.Policy(min_features=0, keep_last_blocks=1))
    kept = {r.name.split(".")[1] for r in report.kept if "blocks" in r.reason}
    assert kept == {"3"}


def test_policy_options():
    model = TinyLM(n=6)
    policy = fb.Policy(extra_keep=("*.attn",), keep_first_blocks=1, keep_last_blocks=2)
    report = fb.convert(model, "mxfp8", policy=policy)
    got = {r.name: r.got for r in report.layers}
    assert got["layers.2.attn"] == "bfloat16" and got["layers.2.mlp.0"] == "mxfp8"
    assert got["layers.0.mlp.0"] == "bfloat16" and got["layers.5.mlp.2"] == "bfloat16"
    assert got["layers.4.mlp.2"] == "bfloat16" and got["layers.3.mlp.2"] == "mxfp8"
    assert fb.Policy().matches("model.layers.0.mlp.gate") == "gate"
    assert fb.Policy().matches("model.layers.0.mlp.gate_proj") is None


def test_converting_twice_is_harmless():
    model = TinyLM(n=2)
    first = fb.convert(model, "mxfp4")
    layer = model.layers[0].mlp[0]
    second = fb.convert(model, "mxfp4")
    assert model.layers[0].mlp[0] is layer
    assert [r.got for r in second.layers] == [r.got for r in first.layers]
    assert all(r.reason == "already converted" for r in second.converted)
    out = model(torch.randint(0, 50, (2, 5)))
    assert out.shape == (2, 5, 50)


def test_no_linear_warns_and_bad_input():
    with pytest.warns(UserWarning, match="no nn.Linear"):
        report = fb.convert(nn.Sequential(nn.ReLU(), nn.LayerNorm(4)), "fp8_tensorwise")
    assert report.layers == []
    with pytest.raises(ValueError, match="valid recipes"):
        fb.convert(TinyLM(), "fp4_everything")
    with pytest.raises(ValueError, match="from_linear"):
        fb.convert(nn.Linear(4, 4), "mxfp8")


def test_training_step_after_conversion():
    torch.manual_seed(0)
    model = TinyLM(n=2)
    fb.convert(model, "nvfp4")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 50, (4, 16))
    losses = []
    for _ in range(5):
        logits = model(ids[:, :-1]).float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def test_hugging_face_llama_from_a_config():
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 16))
    ref = model(ids).logits
    report = fb.convert(model, "fp8_blockwise")
    rows = {r.name: r for r in report.layers}
    assert rows["lm_head"].got == "bfloat16"
    assert rows["model.layers.0.mlp.gate_proj"].got == "fp8_blockwise"
    assert rows["model.layers.3.self_attn.k_proj"].got == "fp8_blockwise"
    assert len(report.converted) == 4 * 7
    out = model(ids).logits
    assert out.shape == ref.shape and torch.isfinite(out).all()
    cos = nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), dim=0)
    assert cos > 0.99
    out.float().sum().backward()
    assert model.model.layers[0].mlp.gate_proj.weight.grad is not None


@pytest.mark.parametrize("name", list(fb.RECIPES))
def test_every_recipe_traces_without_graph_breaks(name):
    torch._dynamo.reset()
    model = TinyLM(n=1)
    fb.convert(model, name)
    explained = torch._dynamo.explain(model)(torch.randint(0, 50, (2, 8)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_torch_compile_of_a_converted_model():
    """Forward and backward through AOT autograd equal eager mode (inductor: docs/recipes.md)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyLM(n=2)
    fb.convert(model, "fp8_tensorwise")
    ids = torch.randint(0, 50, (2, 8))
    eager = model(ids)
    eager.float().sum().backward()
    grad = model.layers[0].mlp[0].weight.grad.clone()
    model.zero_grad()
    out = fb.compile_model(model, backend="aot_eager")(ids)  # torch.compile with no inductor options
    out.float().sum().backward()
    assert torch.equal(out, eager)
    assert torch.equal(model.layers[0].mlp[0].weight.grad, grad)


def two_linears(recipe: str, device: str = "cpu") -> nn.Module:
    """Two bias-free Linears, both converted: the second quantizes the first's bf16 output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024, bias=False), nn.Linear(1024, 512, bias=False)).to(device)
    fb.convert(model, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    return model


@pytest.mark.parametrize("name", ["fp8_tensorwise", "fp8_delayed", "fp8_rowwise", "fp8_blockwise", "mxfp8",
                                  "mxfp4", "nvfp4"])
def test_an_empty_batch_passes_through_a_converted_linear(name):
    """A batch of no tokens (an MoE expert that got none) gives an empty output, zero gradients
    and no amax in delayed scaling's history, as nn.Linear would (fp8_tensorwise's backward
    and fp8_delayed's forward once failed on it)."""
    model = two_linears(name)
    model[0].bias = nn.Parameter(torch.ones(1024))
    states = [m.delayed_scaling for m in model]
    history = [{k: v.clone() for k, v in s.state_dict().items()} if s is not None else None for s in states]
    x = torch.randn(0, 512, dtype=torch.bfloat16, requires_grad=True)
    out = model(x)
    out.float().square().sum().backward()
    assert out.shape == (0, 512) and out.dtype == torch.bfloat16 and x.grad.shape == (0, 512)
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any()
    assert (name == "fp8_delayed") == all(s is not None for s in states)
    for s, before in zip(states, history):
        if s is not None:
            assert all(torch.equal(v, before[k]) for k, v in s.state_dict().items())


def eager_then_compiled(model: nn.Module, x: torch.Tensor, before=None, between=None):
    """(eager output, its gradients, compiled output, its gradients) for the loss sum(output²),
    eagerly and then through fb.compile_model; the gradients are x's (where x needs one), then
    the parameters'. before(model) runs before each forward, between() after the eager run."""
    before = before or (lambda m: None)
    before(model)
    eager = model(x)
    eager.float().square().sum().backward()
    grads = ([x.grad.clone()] if x.requires_grad else []) + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    if between is not None:
        between()
    before(model)
    out = fb.compile_model(model)(x)
    out.float().square().sum().backward()
    return eager, grads, out, ([x.grad] if x.requires_grad else []) + [p.grad for p in model.parameters()]


def compiled_against_eager_under_triton(model: nn.Module, x: torch.Tensor, calls: list, before=None) -> bool:
    """`eager_then_compiled` under the triton backend (the kernels interpreted on a CPU): whether
    the outputs and every gradient are eager mode's bits. `calls` is emptied after the eager
    run, so it holds what the compiled run recorded."""
    from fewerbits import kernels

    torch._dynamo.reset()
    kernels.set_backend("triton")
    try:
        eager, grads, out, compiled_grads = eager_then_compiled(model, x, before, calls.clear)
    finally:
        kernels.set_backend("auto")
        torch._dynamo.reset()
    return torch.equal(out, eager) and all(torch.equal(c, g) for c, g in zip(compiled_grads, grads))


def compiled_under_triton(name: str, calls: list, before=None):
    """Two Linears converted to `name`, run eagerly and compiled under the triton backend (the
    kernels interpreted on a CPU), loss sum(output²): (whether outputs and every gradient are
    eager mode's bits, dynamo's explanation of the compiled model). `calls` holds what the
    compiled run recorded. before(model) runs before each forward."""
    from fewerbits import kernels

    model, x = two_linears(name), torch.randn(64, 512, dtype=torch.bfloat16)
    same = compiled_against_eager_under_triton(model, x, calls, before)
    recorded = list(calls)
    kernels.set_backend("triton")
    try:
        if before is not None:
            before(model)
        explained = torch._dynamo.explain(model)(x)
    finally:
        kernels.set_backend("auto")
        torch._dynamo.reset()
    calls[:] = recorded
    return same, explained


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4_naive"])
def test_compiled_emulated_gemms_take_their_values_from_the_one_kernel(name, monkeypatch):
    """In a compiled graph an emulated GEMM's operands come from the Triton kernel that makes
    the bf16 values in one pass, called as the operator fewerbits::rowblock_values, not from
    inductor's fusion of the reference quantizer and a dequantization: forward and backward
    are eager mode's bits, in one graph (the kernel interpreted on a CPU, under the triton
    backend)."""
    from fewerbits.kernels import rowblock

    calls = []
    real = rowblock.quantize_rowblocks

    def counted(*args, **kwargs):
        calls.append(kwargs.get("values", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(rowblock, "quantize_rowblocks", counted)
    same, explained = compiled_under_triton(name, calls)
    # forward: input and weight of two Linears; backward: dgrad's and wgrad's operands
    assert calls.count(True) >= 8, calls
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]
    assert same


def test_compiled_block_casts_take_their_codes_from_the_one_kernel(monkeypatch):
    """In a compiled graph the FP8 1x128 and 128x128 codes come from the one-read Triton kernel,
    called as the operator fewerbits::rowblock_codes, not from inductor's fusion of the
    reference's block amaxes, scales and codes: forward and backward are eager mode's bits, in
    one graph (the kernel interpreted on a CPU, under the triton backend)."""
    from fewerbits.kernels import rowblock

    calls = []
    real = rowblock.quantize_rowblocks

    def counted(X, scheme, seed, **kwargs):
        calls.append((scheme.name, kwargs.get("values", False)))
        return real(X, scheme, seed, **kwargs)

    monkeypatch.setattr(rowblock, "quantize_rowblocks", counted)
    same, explained = compiled_under_triton("fp8_blockwise", calls)
    codes = [n for n, values in calls if not values]
    # forward: each Linear's input (1x128) and weight (128x128); backward: the second Linear's
    # grad_output row- and column-wise and its weight column-wise (dgrad), the first's
    # grad_output column-wise only (x needs no gradient), each input column-wise (wgrad)
    assert codes.count("fp8_e4m3_1x128") == 7 and codes.count("fp8_e4m3_128x128") == 3, calls
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]
    assert same


def test_compiled_rowwise_copies_take_their_codes_from_the_kernels(monkeypatch):
    """In a compiled graph fp8_rowwise's column-wise copies (one scale per column: the
    weight-gradient GEMM's operands, dgrad's weight) come from the operator
    fewerbits::rowblock_codes (`rowblock.quantize_with_amax`), and so do row-wise copies of
    rows from rowblock.LONG_ROW elements up (here 1024: the second Linear's input and weight in
    the forward), one program a row; shorter rows stay with inductor. The weights' columns'
    amaxes given (set_weight_amaxes, as the trainer gives the fused AdamW's) enter the graph
    as inputs, and dgrad's weight copy takes them instead of reducing the weight. Forward and
    backward are eager mode's bits, in one graph (the kernels interpreted on a CPU, under the
    triton backend)."""
    from fewerbits.kernels import rowblock
    from fewerbits.linear import set_weight_amaxes

    calls = []
    real = rowblock.quantize_with_amax

    def counted(X, scheme, seed, amax=None, **kwargs):
        kind = "columns" if rowblock.column_codes_supported(X, scheme) else (
            "one read" if rowblock.rows_in_one_read(X, scheme, amax) else "other")
        calls.append((scheme.name, tuple(X.shape), kind, kwargs.get("block_amaxes") is not None))
        return real(X, scheme, seed, amax, **kwargs)

    monkeypatch.setattr(rowblock, "quantize_with_amax", counted)
    monkeypatch.setattr(rowblock, "LONG_ROW", 1024)
    monkeypatch.setattr(rowblock, "ONE_READ_ROWS", 16)  # fewer programs for the interpreter
    same, explained = compiled_under_triton("fp8_rowwise", calls, before=set_weight_amaxes)
    assert all(call[0] == "fp8_e4m3_row" for call in calls), calls
    # backward, column-wise: each Linear's grad_output and input (wgrad), the second Linear's
    # weight (dgrad, with its columns' amaxes given; x needs no gradient, so the first makes none)
    assert sum(kind == "columns" for _, _, kind, _ in calls) == 5, calls
    assert [(shape, kind) for _, shape, kind, given in calls if given] == [((1024, 512), "columns")], calls
    assert sorted(shape for _, shape, kind, _ in calls if kind == "one read") == [(64, 1024), (512, 1024)], calls
    assert len(calls) == 7, calls
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]
    assert same


def test_compiled_swiglu_gradients_reach_both_copies_as_one_tensor(monkeypatch):
    """A tensor that one GEMM quantizes along its rows and another along its columns enters
    both operator calls as one buffer: with the transposed view given to the column-wise call,
    inductor wrote the up projection's gradient twice from the SwiGLU backward, a second buffer
    for that call (docs/kernels-notes.md, v29). fp8_rowwise on the model's SwiGLU, compiled
    under the triton backend (kernels interpreted on a CPU): the row-wise calls (forward: the
    down projection's input h; backward: the gate and up projections' gradients) and the
    column-wise calls for the weight-gradient GEMMs read the same three storages, and the
    outputs and gradients are eager mode's bits."""
    from fewerbits.kernels import rowblock
    from fewerbits.models.llama import SwiGLU

    calls = []  # (kind, X): X kept alive, so no storage is freed and reused during the run
    real = rowblock.quantize_with_amax

    def counted(X, scheme, seed, amax=None, **kwargs):
        if X.shape in ((64, 256), (256, 64)):
            calls.append(("columns" if rowblock.column_codes_supported(X, scheme) else "rows", X))
        return real(X, scheme, seed, amax, **kwargs)

    monkeypatch.setattr(rowblock, "quantize_with_amax", counted)
    monkeypatch.setattr(rowblock, "LONG_ROW", 256)
    monkeypatch.setattr(rowblock, "ONE_READ_ROWS", 16)  # fewer programs for the interpreter
    torch.manual_seed(0)
    model = SwiGLU(32, 256).to(torch.bfloat16)
    fb.convert(model, "fp8_rowwise", policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)  # (so gate and up make dgrad)
    same = compiled_against_eager_under_triton(model, x, calls)
    compiled = calls
    storages = {kind: {X.untyped_storage().data_ptr() for k, X in compiled if k == kind}
                for kind in ("rows", "columns")}
    assert len(compiled) == 6 and len(storages["rows"]) == 3, [(k, X.shape) for k, X in compiled]
    assert storages["columns"] == storages["rows"]
    assert same


_VIEWS = ("view", "reshape", "_unsafe_view", "permute", "t", "transpose", "alias", "detach")


def stored_by_graph(graph, into: list) -> None:
    """Append to `into` the ops whose outputs a post-grad graph stores for a per-tensor cast
    (`prims.inductor_force_stride_order`), each traced back through views; a graph input is
    "placeholder" (stored already: the operator copies nothing)."""
    for node in graph.nodes:
        if node.target is torch.ops.prims.inductor_force_stride_order.default:
            source = node.args[0]
            while source.op == "call_function" and source.target.__name__.split(".")[0] in _VIEWS:
                source = source.args[0]
            into.append("placeholder" if source.op == "placeholder" else source.target.__name__.split(".")[0])


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_delayed"])
def test_compiled_per_tensor_casts_store_the_tensor_their_two_passes_read(recipe):
    """A per-tensor cast that finds its amax from the tensor reads it twice, in two kernels (the
    amax's reduction, then the codes); in a compiled graph the tensor is stored first, so that a
    fused producer (the SwiGLU's output, forward; its gradients, backward) is computed once,
    not again in each kernel. Delayed scaling's amax is given (its history), so it stores
    nothing: its record of the amax and its codes are one pass. Outputs and every gradient are
    eager mode's bits."""
    import torch._inductor.config as inductor_config

    from fewerbits.models.llama import SwiGLU

    torch.manual_seed(0)
    model = SwiGLU(32, 256).to(torch.bfloat16)
    fb.convert(model, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # delayed scaling's histories too
    stored = []
    torch._dynamo.reset()
    try:
        with inductor_config.patch(post_grad_custom_post_pass=lambda graph: stored_by_graph(graph, stored)):
            eager, grads, out, compiled_grads = eager_then_compiled(model, x, lambda m: m.load_state_dict(state))
    finally:
        torch._dynamo.reset()
    computed = sorted(op for op in stored if op != "placeholder")
    if recipe == "fp8_tensorwise":  # h = silu(g) * u forward; the gate's and up's gradients backward
        assert computed == ["convert_element_type", "mul", "mul"], stored
    else:
        assert stored == [], stored
    assert torch.equal(out, eager) and all(torch.equal(c, g) for c, g in zip(compiled_grads, grads))


def counted_transposes(monkeypatch) -> list:
    """A list that fills with the shape of the codes each call of the tiled transpose kernel
    gets (the kernel still runs)."""
    from fewerbits.kernels import transpose

    calls = []
    real = transpose.transpose

    def counted(x):
        calls.append(tuple(x.shape))
        return real(x)

    monkeypatch.setattr(transpose, "transpose", counted)
    return calls


def test_compiled_fp8_gemms_transpose_their_codes_by_the_tiled_kernel(monkeypatch):
    """In a compiled graph the column-wise copies of per-tensor FP8 codes (wgrad's input and
    grad_output) come from the tiled transpose kernel, called as the operator
    fewerbits::transpose_codes, not from a transposed store inductor fuses into the kernel that
    makes the codes: forward and backward are eager mode's bits, in one graph (the kernel
    interpreted on a CPU, under the triton backend)."""
    calls = counted_transposes(monkeypatch)
    same, explained = compiled_under_triton("fp8_tensorwise", calls)
    # backward: both inputs' codes, and the second Linear's grad_output codes (the first
    # Linear makes no dgrad, x needing no gradient, so its grad_output is cast column-wise)
    assert sorted(calls) == [(64, 512), (64, 512), (64, 1024)], calls
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]
    assert same


class SharedInput(nn.Module):
    """Two Linears that read one input, as gate_proj and up_proj do."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(256, 128, bias=False)
        self.up = nn.Linear(256, 128, bias=False)

    def forward(self, x):
        return self.gate(x) * self.up(x)


def test_compiled_linears_that_read_one_input_share_its_codes(monkeypatch):
    """Two per-tensor FP8 Linears reading one tensor quantize it the same way; in a compiled
    graph the common-subexpression pass makes it one cast, so the tensor's codes are made,
    saved and transposed once for both weight-gradient GEMMs. A NaN constant in the scale
    (unequal to itself) kept the two casts apart: four transposes here instead of three (the
    two gradients' and the input's once), with eager mode's bits either way."""
    calls = counted_transposes(monkeypatch)
    torch.manual_seed(0)
    model = SharedInput().to(torch.bfloat16)
    fb.convert(model, "fp8_tensorwise", policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    same = compiled_against_eager_under_triton(model, x, calls)
    assert sorted(calls) == [(64, 128), (64, 128), (64, 256)], calls
    assert same


def first_argument(call: str) -> str:
    """The text of a call's first argument in a line of output code (up to its first comma at
    the call's own depth)."""
    depth, text = 0, call[call.index("(") + 1:]
    for i, ch in enumerate(text):
        depth += ch in "(["
        depth -= ch in ")]"
        if (ch == "," and depth == 0) or depth < 0:
            return text[:i]
    return text


def test_compiled_native_fp8_gemms_that_read_one_input_read_one_buffer_of_its_codes(monkeypatch):
    """A compiled FP8 cast makes its codes as FP8 values viewed as uint8; each GEMM views them
    as FP8 again and the transpose reads the uint8. Held (`quantize.held`), they are one buffer
    that both forward GEMMs of two Linears reading one input take and the transpose reads;
    otherwise each reader of the unstored view stored a copy of its own (torch 2.13: buf6 and
    buf12 for the GEMMs; docs/kernels-notes.md, v81). The GEMMs run natively (torch._scaled_mm
    runs on a CPU; the device check is passed over), the transpose under the triton backend;
    eager mode's bits."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from fewerbits import gemm

    monkeypatch.setattr(gemm, "_device_reason", lambda dev: None)
    torch.manual_seed(0)
    model = SharedInput().to(torch.bfloat16)
    fb.convert(model, "fp8_tensorwise", policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    with inductor_config.patch(fx_graph_cache=False):  # a cached graph may predate the lowering
        same, codes = run_and_get_code(compiled_against_eager_under_triton, model, x, [])
    assert same
    forward = codes[0].splitlines()
    gemms = [first_argument(line.split("_scaled_mm", 1)[1]) for line in forward if "extern_kernels._scaled_mm(" in line]
    read = [re.findall(r"\bbuf\d+\b", arg) for arg in gemms]
    assert len(read) == 2 and read[0] == read[1] and len(read[0]) == 1, gemms
    transposed = [first_argument(line.split("transpose_codes.default", 1)[1]) for line in forward
                  if "= torch.ops.fewerbits.transpose_codes.default(" in line]
    assert transposed == read[0], (transposed, gemms)


def test_compiled_scales_of_non_finite_amaxes_are_eager_modes_nan():
    """The scale of a non-finite amax is the NaN 0x7FC00000 in a compiled graph too, where it
    is made from the scale's bits rather than written as a constant."""
    from fewerbits import formats, scaling

    amax = torch.tensor([3.0, float("inf"), float("-inf"), float("nan"), 0.0])
    e4m3 = formats.get_format("fp8_e4m3")

    def scales(a):
        return scaling.amax_scale(a, e4m3), scaling.pow2_scale(a, e4m3, "floor", formats.get_format("fp32"))

    torch._dynamo.reset()
    try:
        compiled = torch.compile(scales, fullgraph=True)(amax)
    finally:
        torch._dynamo.reset()
    for c, e in zip(compiled, scales(amax)):
        assert torch.equal(c.view(torch.int32), e.view(torch.int32)), (c, e)
        assert (c[1:4].view(torch.int32) == 0x7FC00000).all()


def test_compile_model_warns_where_this_torchs_cpu_kernels_round_unlike_eager(monkeypatch):
    """The version test behind compile_model's warning agrees with this torch's inductor: a
    fused silu(g) * u of bf16 tensors, compiled for the CPU with the rounding option on, gives
    eager mode's bits exactly where `_cpu_rounds_casts()` says so. A model on the CPU under an
    older torch is compiled with the warning; under torch 2.13, or with its parameters on
    another device, it is not."""
    import sys
    import warnings

    convert_module = sys.modules["fewerbits.convert"]
    torch.manual_seed(0)
    g, u = torch.randn(2, 64, 256, dtype=torch.bfloat16)

    def swiglu(g, u):
        return torch.nn.functional.silu(g) * u

    eager = swiglu(g, u)
    assert not torch.equal(eager, (torch.nn.functional.silu(g.float()) * u.float()).bfloat16())
    torch._dynamo.reset()
    try:
        compiled = torch.compile(swiglu, options={"emulate_precision_casts": True})(g, u)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, eager) == convert_module._cpu_rounds_casts()

    for version, model, warned in (("2.12.0+cu130", nn.Linear(4, 4), True), ("2.13.0", nn.Linear(4, 4), False),
                                   ("2.11.0", nn.Linear(4, 4, device="meta"), False)):
        monkeypatch.setattr(torch, "__version__", version)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fb.compile_model(model)
        found = [w for w in caught if "differ from eager mode's" in str(w.message)]
        assert len(found) == int(warned), (version, [str(w.message) for w in caught])
        if warned:
            assert "torch 2.12.0+cu130" in str(found[0].message) and found[0].filename == __file__

    # a function brings its tensors with each call: under an older torch it is warned of
    # wherever no GPU is present, not where one is
    for version, gpu, warned in (("2.12.0", False, True), ("2.12.0", True, False), ("2.13.0", False, False)):
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fb.compile_model(swiglu)
        found = [w for w in caught if "differ from eager mode's" in str(w.message)]
        assert len(found) == int(warned), (version, gpu, [str(w.message) for w in caught])


def test_compile_model_takes_a_function_as_torch_compile_does():
    """A plain function (a quantizer call, say) compiles through compile_model and gives eager
    mode's bits; blocks=True, which needs a module's list of blocks, refuses it clearly."""
    scheme = fb.get_scheme("fp8_e4m3_tensor")
    torch.manual_seed(0)
    x = torch.randn(64, 256, dtype=torch.bfloat16) * 3

    def q(t):
        out = fb.quantize(t, scheme)
        return out.data, out.scale

    codes, scale = q(x)
    torch._dynamo.reset()
    try:
        compiled_codes, compiled_scale = fb.compile_model(q, fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled_codes, codes)
    assert torch.equal(compiled_scale.view(torch.int32), scale.view(torch.int32))
    with pytest.raises(ValueError, match="blocks=True.*takes an nn.Module, not function"):
        fb.compile_model(q, blocks=True)


def test_compile_model_gives_eager_bits_through_inductor():
    """Two FP8 Linears compiled by inductor: the second quantizes the first's bf16 output, which
    inductor would keep in fp32 inside a fused kernel; compile_model makes it round as eager
    mode does, so outputs and gradients are eager mode's bits."""
    torch._dynamo.reset()
    model = two_linears("fp8_tensorwise")
    eager, grads, out, compiled_grads = eager_then_compiled(model, torch.randn(256, 512, dtype=torch.bfloat16))
    assert torch.equal(out, eager)
    assert all(torch.equal(c, g) for c, g in zip(compiled_grads, grads))
    torch._dynamo.reset()


def graphs_for_token_counts(model: nn.Sequential, counts) -> int:
    """Feed `model` (one converted Linear) each token count in turn, eagerly and compiled
    (`aot_eager`), assert the same output and gradients bit for bit, and return how many graphs
    compiling took."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    for n in counts:
        x = torch.randn(n, model[0].in_features, dtype=torch.bfloat16, device=model[0].weight.device)
        outs = []
        for run in (model, compiled):
            torch.manual_seed(1)  # stochastic rounding's noise drawn alike
            xr = x.clone().requires_grad_()
            out = run(xr)
            out.float().square().sum().backward()
            outs.append((out, xr.grad, model[0].weight.grad))
            model.zero_grad(set_to_none=True)
        assert all(torch.equal(e, c) for e, c in zip(*outs)), n
    return counter.frame_count


def test_a_token_count_that_native_fp8_cannot_take_leaves_the_compiled_graph_general(monkeypatch):
    """Whether a GEMM runs natively depends on its sizes (cuBLAS's FP8 kernels want K and N
    multiples of 16, and the weight gradient's K is the token count), and deciding it must not
    format a size into the message it would give: in a compiled graph whose token count is
    dynamic (an MoE's experts see another count at every call), formatting one made dynamo
    specialise the graph to that count, and torch 2.11 then failed to trace the quantized
    Linear (an AssertionError on an H200, and on a CPU). Here the device check is passed over,
    so that the size checks run and torch._scaled_mm takes the per-tensor GEMMs on a CPU: a
    compiled fp8_tensorwise Linear fed five token counts compiles three graphs (the first count;
    then dynamic counts that are multiples of 16; then the others), with eager mode's bits."""
    from fewerbits import gemm

    monkeypatch.setattr(gemm, "_device_reason", lambda dev: None)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False))
    fb.convert(model, "fp8_tensorwise", policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    # 40 and 24 are not multiples of 16: wgrad runs emulated
    assert graphs_for_token_counts(model, (48, 96, 64, 40, 24)) == 3
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe, block", [("fp8_blockwise", 128), ("mxfp4", 32), ("nvfp4", 16)])
def test_a_token_count_of_one_whole_block_leaves_the_compiled_graph_general(recipe, block):
    """The weight gradient's operands are quantized (and, under the FP4 recipes, Hadamard
    transformed) along the tokens, in blocks of 128, 32 or 16. In a graph compiled for dynamic
    token counts, asking whether one block spans the count, or padding the count only where it
    is no multiple of the block, specialised the graph when the count was exactly one block (an
    expert given 128 tokens): torch 2.13 compiled a graph for that count alone, and torch 2.11
    failed to trace the quantized Linear (on an H200, the reference backend's `small-moe`
    compiled, docs/kernels-notes.md v47). Fed the first count, a dynamic one, one whole block,
    less than a block and more, a compiled Linear compiles three graphs (the first count;
    counts over one block; counts within one), with eager mode's bits at every count."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256, bias=False))
    fb.convert(model, recipe, policy=fb.Policy(keep=(), min_features=0, keep_last_blocks=0))
    assert graphs_for_token_counts(model, (512, 530, block, block - 3, 300)) == 3
    torch._dynamo.reset()


@pytest.mark.parametrize(("scheme", "rows"), [("fp8_e4m3_tensor", 1300), ("fp8_e4m3_1x128", 1300),
                                             ("mxfp8_e4m3", 1300), ("nvfp4", 1300), ("fp8_e4m3_128x128", 100)])
@pytest.mark.parametrize("axis", [1, 0])
def test_inductor_compiles_the_quantizer_to_the_same_bits(scheme, rows, axis):
    """The quantizer compiled by inductor (C++ on a CPU, where the auto backend keeps the Triton
    kernels and their operators out of the graph) gives the reference's bits, in the reference's
    row-major layout (the native GEMMs read the codes by their strides); compiled, the element
    pass runs over all rows at once, eagerly in slices. Neither dimension fills its last block
    (inductor once miscompiled such a block: quantize._per_element), nor do 100 rows fill a
    128x128 block (inductor then split the loop over the columns into whole blocks:
    quantize._block_of)."""
    torch._dynamo.reset()
    x = torch.randn(rows, 650, generator=torch.Generator().manual_seed(3)).bfloat16() * 5
    x[7, 11] = float("nan")

    def q(t):
        out = fb.quantize(t, scheme, axis=axis)
        return out.data, out.scale

    data, scale = torch.compile(q, fullgraph=True)(x)
    ref = fb.quantize(x, scheme, axis=axis)
    assert torch.equal(data, ref.data)
    assert data.is_contiguous() and ref.data.is_contiguous()
    assert torch.equal(scale.view(torch.uint8) if scale.dtype == torch.uint8 else scale.view(torch.int32),
                       ref.scale.view(torch.uint8) if ref.scale.dtype == torch.uint8 else ref.scale.view(torch.int32))


def cpp_kernels(code: str) -> list[str]:
    """The C++ kernels of inductor's output code for a CPU, each as its source."""
    return re.findall(r"async_compile\.cpp_pybinding\(\[.*?\], r'''(.*?)'''\)", code, re.S)


def cpp_parameters(kernel: str) -> dict[str, str]:
    """A C++ kernel's parameters, name: type (`out_ptr3`: `double*`)."""
    signature = re.search(r"kernel\((.*?)\)", kernel, re.S).group(1)
    return {p.split()[-1]: " ".join(p.split()[:-1]) for p in signature.split(",")}


def innermost_loops(kernel: str) -> list[str]:
    """The bodies of a C++ kernel's innermost loops over the tensors' indices."""
    bodies = []
    for start in (m.start() for m in re.finditer(r"for\(int64_t", kernel)):
        open_at = kernel.index("{", start)
        depth, i = 1, open_at + 1
        while depth:
            depth += {"{": 1, "}": -1}.get(kernel[i], 0)
            i += 1
        body = kernel[open_at:i]
        if "for(int64_t" not in body:
            bodies.append(body)
    return bodies


@pytest.mark.parametrize("scheme", ["fp8_e4m3_tensor", "fp8_e4m3_row"])
@pytest.mark.parametrize("axis", [1, 0])
def test_compiled_casts_store_the_reciprocals_of_their_scales_for_the_codes(scheme, axis):
    """Compiled, a per-tensor or per-row cast multiplies each element by its scale's fp64
    reciprocal; held (`quantize.held`), the reciprocal is stored where the scale is made, and
    the loops that write codes read it and divide nothing, where inductor otherwise computed
    the scale and its reciprocal, a division, again for every element (docs/kernels-notes.md,
    v79 to v81). Per tensor, the column-wise copy by `requantize` too. Codes and scales are the
    reference's."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from fewerbits.quantize import hold_lowering, requantize

    hold_lowering()  # as compile_model registers it
    torch._dynamo.reset()
    x = torch.randn(96, 160, generator=torch.Generator().manual_seed(5)).bfloat16() * 7
    per_tensor = scheme == "fp8_e4m3_tensor"
    if not per_tensor:
        x[5, 9] = float("nan")  # one NaN row (per tensor it would leave every code zero)

    def q(t):
        out = fb.quantize(t, scheme, axis=axis)
        if per_tensor:
            return out.data, out.scale, requantize(t, out, 1 - axis).data
        return out.data, out.scale

    with inductor_config.patch(fx_graph_cache=False):  # a cached graph may predate the lowering
        got, code = run_and_get_code(torch.compile(q, fullgraph=True), x)
    torch._dynamo.reset()
    ref = fb.quantize(x, scheme, axis=axis)
    want = [ref.data, ref.scale] + ([fb.quantize(x, scheme, axis=1 - axis).data] if per_tensor else [])
    assert len(got) == len(want)
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
    writing_codes = 0
    for kernel in cpp_kernels("".join(code)):
        params = cpp_parameters(kernel)
        codes_out = [n for n, t in params.items() if t == "uint8_t*"]
        fp64_in = [n for n, t in params.items() if t in ("double*", "const double*")]
        for body in innermost_loops(kernel):
            if any(re.search(rf"\b{n}\b", body) for n in codes_out):
                writing_codes += 1
                assert any(re.search(rf"\b{n}\b", body) for n in fp64_in), body
                assert " / " not in body and "reciprocal()" not in body, body
    assert writing_codes >= (2 if per_tensor else 1)


@pytest.mark.parametrize("scheme", ["fp8_e4m3_1x128", "fp8_e4m3_128x128", "mxfp8_e4m3"])
def test_a_dynamic_token_count_within_one_block_quantizes_to_the_same_bits(scheme):
    """Quantized along the tokens (the weight gradient's operands), a compiled quantizer meets
    one token count after another, as an MoE's experts do: the second count makes the graph
    dynamic, and a count within one block makes the number of blocks along the tokens a
    symbolic size that only a guard holds at 1. With those amaxes blocked, inductor indexed them
    by each element's column instead of its block (at 77 tokens 16,735 of 19,712 codes of
    fp8_e4m3_1x128 were wrong; docs/kernels-notes.md, v45), and so did the dequantization
    compiled with it (mxfp8 at 20 tokens)."""
    torch._dynamo.reset()

    def q(t):
        out = fb.quantize(t, scheme, axis=0)
        return out.data, out.scale, out.dequantize_matrix()

    compiled = torch.compile(q)
    for n in (512, 530, 77, 20):  # 77 and 20 fit in one block of 128 (20 in one of 32)
        x = torch.randn(n, 256, generator=torch.Generator().manual_seed(n)).bfloat16() * 3
        ref = fb.quantize(x, scheme, axis=0)
        for got, want in zip(compiled(x), (ref.data, ref.scale, ref.dequantize_matrix())):
            assert torch.equal(got, want), n
    torch._dynamo.reset()


def _column_codes(x, scheme):
    """The reference's codes and scales of x quantized along its columns (axis 0), as new tensors."""
    q = fb.quantize(x, scheme, axis=0)
    return q.data.clone(), q.scale.clone()


# an operator like fewerbits::rowblock_codes given a tensor as stored (columns=True): the
# reference's bits, the kernel operator's fake shapes
_SYMBOLIC_SCALES = torch.library.Library("fewerbits_test", "DEF")
_SYMBOLIC_SCALES.define("column_codes(Tensor x, str scheme) -> (Tensor, Tensor)")
_SYMBOLIC_SCALES.impl("column_codes", _column_codes, "CompositeExplicitAutograd")


@torch.library.register_fake("fewerbits_test::column_codes", lib=_SYMBOLIC_SCALES)
def _column_codes_fake(x, scheme):
    from fewerbits.kernels import _rowblock_codes_fake

    return _rowblock_codes_fake(x, scheme, fb.get_scheme(scheme).scale_rule, None, None, True)


@pytest.mark.parametrize("scheme", ["fp8_e4m3_1x128", "fp8_e4m3_128x128", "mxfp8_e4m3"])
def test_scales_counted_symbolically_dequantize_to_the_same_values(scheme):
    """On a GPU a compiled graph takes the column-wise codes of a weight gradient's operands
    from an operator (`fewerbits::rowblock_codes`), whose scales count the blocks along the
    tokens symbolically: a count that only a guard makes 1 where the tokens fit in one block.
    Broadcast from that dimension, inductor read each element's scale at its column instead of
    its block (the H200's compiled MoE experts: wrong weight gradients below 128 tokens, then
    NaN; docs/kernels-notes.md, v46). Here an operator with the kernel operator's shapes and
    the reference's bits, compiled on a CPU, and the dequantization compiled after it: eager
    mode's values at every count (77 and 20 failed before)."""
    torch._dynamo.reset()

    def values(t):
        codes, scales = torch.ops.fewerbits_test.column_codes(t, scheme)
        return fb.QuantizedTensor(codes, scales, fb.get_scheme(scheme), t.shape, 0).dequantize_matrix()

    compiled = torch.compile(values)
    for n in (512, 530, 77, 20, 300):
        x = torch.randn(n, 256, generator=torch.Generator().manual_seed(n)).bfloat16() * 3
        assert torch.equal(compiled(x), fb.quantize(x, scheme, axis=0).dequantize_matrix()), n
    torch._dynamo.reset()


def test_compile_model_asks_inductor_for_eager_rounding(monkeypatch):
    """compile_model passes inductor the options that make compiled quantizers see eager mode's
    values — rounding where the program casts, correctly rounded division under this torch's
    name for it — keeps a mode's options, lets the caller's options win, and gives another
    backend none."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(kw) or model)
    fb.compile_model(nn.Linear(2, 2))
    options = seen[-1]["options"]
    assert options["emulate_precision_casts"] is True
    division = [k for k in ("eager_numerics.division_rounding", "emulate_divison_rounding")
                if k in torch._inductor.config._config]
    assert division and all(options[k] is True for k in division[:1])
    fb.compile_model(nn.Linear(2, 2), mode="max-autotune", options={"emulate_precision_casts": False})
    options = seen[-1]["options"]
    assert options["emulate_precision_casts"] is False and options["max_autotune"] is True
    assert "mode" not in seen[-1]
    fb.compile_model(nn.Linear(2, 2), backend="aot_eager")
    assert seen[-1] == {"backend": "aot_eager"}


@contextlib.contextmanager
def divide_like_a_gpu(monkeypatch):
    """Make inductor lower a division by a constant as a product with its reciprocal on a CPU
    too, as it does on a GPU (torch's inductor `div_prim`; off for CPU tensors), with its caches
    off so that no kernel compiled without the rewrite is reused."""
    import torch._inductor.lowering as L

    original = L.div_prim

    def div_prim(a, b):
        divisor = L.get_constant_value(b) if isinstance(b, L.ir.IRNode) else None
        if divisor is not None and a.get_dtype().is_floating_point and divisor.value != 0:
            return L.mul(a, 1.0 / divisor.value)
        return original(a, b)

    keys = [k for k, v in L.lowerings.items() if v is original]
    assert keys, "inductor's lowering of prims.div has moved: update divide_like_a_gpu"
    for k in keys:
        monkeypatch.setitem(L.lowerings, k, div_prim)
    monkeypatch.setattr(L, "div_prim", div_prim)  # aten.div's lowering calls it by this name
    with torch._inductor.config.patch(force_disable_caches=True):
        yield


def test_compiled_block_scales_survive_the_gpus_division_rewrite(monkeypatch):
    """On a GPU, inductor turns amax / 448 into amax × fp32(1/448), which is not always the
    correctly rounded quotient; compiled fp8_blockwise Linears then differed from eager mode by
    1% on the H200. Compiled graphs take the scale through scaling.divide_by_constant, whose
    result either lowering rounds correctly. With the rewrite forced on a CPU, the compiled
    model gives eager mode's bits; with a plain division it reproduces the GPU's difference."""
    import fewerbits.scaling as scaling

    x = torch.randn(256, 512, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with divide_like_a_gpu(monkeypatch):
        torch._dynamo.reset()
        eager, grads, out, compiled_grads = eager_then_compiled(two_linears("fp8_blockwise"), x)
        assert torch.equal(out, eager)
        assert all(torch.equal(c, g) for c, g in zip(compiled_grads, grads))

        monkeypatch.setattr(scaling, "divide_by_constant", lambda t, d: t / d)  # the rewrite applies
        torch._dynamo.reset()
        eager, grads, out, compiled_grads = eager_then_compiled(two_linears("fp8_blockwise"), x)
        assert not torch.equal(out, eager)
    torch._dynamo.reset()


def tiny_fp8_llama(n_layers: int):
    """A small Llama under fp8_tensorwise (every Linear but the head) and a batch of token ids,
    with dynamo's caches and counters reset and the seed fixed."""
    from torch._dynamo.utils import counters

    from fewerbits.models import Llama, ModelConfig
    from fewerbits.train.precision import apply_recipe

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    cfg = ModelConfig(dim=64, n_layers=n_layers, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=128,
                      max_seq_len=32)
    model = Llama(cfg)
    apply_recipe(model, "fp8_tensorwise", policy=fb.Policy(min_features=0, keep_last_blocks=0))
    return model, torch.randint(0, 128, (2, 32))


def test_compile_model_by_blocks_traces_one_block_for_all():
    """compile_model(blocks=True) compiles each block in place: one graph serves every block,
    and the quantized Linears' outputs and weight gradients are eager mode's bits (RMSNorm's
    weight gradients are fp32 sums in another order)."""
    from torch._dynamo.utils import counters

    model, ids = tiny_fp8_llama(n_layers=3)
    eager = model(ids)
    eager.float().square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    assert fb.compile_model(model, blocks=True) is model
    assert all(block._compiled_call_impl is not None for block in model.layers)
    out = model(ids)
    out.float().square().sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(out, eager)
    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.allclose(p.grad, grads[name], rtol=1e-5, atol=1e-7), name
        else:
            assert torch.equal(p.grad, grads[name]), name
    with pytest.raises(ValueError, match="no list of blocks"):
        fb.compile_model(nn.Linear(4, 4), blocks=True)
    torch._dynamo.reset()


def test_compiled_blocks_take_the_weights_amaxes_as_inputs():
    """With each weight's amax given before every forward (set_weight_amaxes, as the trainer
    does from its AdamW), compiled blocks take the amaxes as graph inputs: one graph over steps
    whose weights and amaxes change, eager mode's bits, and the amax given is the one used."""
    from torch._dynamo.utils import counters

    from fewerbits.linear import set_weight_amaxes

    model, ids = tiny_fp8_llama(n_layers=2)

    def step(forward):
        set_weight_amaxes(model)
        out = forward(ids)
        out.float().square().sum().backward()
        got = [out.detach()] + [p.grad.clone() for n, p in model.named_parameters() if "norm" not in n]
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.01 * p.grad)
        model.zero_grad(set_to_none=True)
        return got

    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager = [step(model) for _ in range(2)]
    model.load_state_dict(state)
    fb.compile_model(model, blocks=True)
    compiled = [step(model) for _ in range(2)]
    for a, b in zip(eager, compiled):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert counters["stats"]["unique_graphs"] == 1
    set_weight_amaxes(model)
    for m in model.modules():
        if isinstance(m, fb.QuantizedLinear) and m.uses_weight_amax:  # (the bf16 head has none)
            m.set_weight_amax(m._weight_amax * 3)
    assert not torch.equal(model(ids), eager[0][0])  # (a different amax, other codes)
    torch._dynamo.reset()
