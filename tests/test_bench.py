"""`fewerbits bench`: shapes, rows and errors (CPU; the timings that matter are taken on a GPU)."""

import json
import sys
import time

import pytest

import fewerbits as fb
from fewerbits import bench
from fewerbits.cli import main


def test_linear_shapes_are_the_models_distinct_linears():
    shapes = {(k, n): names for names, m, k, n in bench.linear_shapes("llama3-8b-8layers", 8192)}
    assert shapes == {
        (4096, 4096): "o_proj/q_proj", (4096, 1024): "k_proj/v_proj",
        (4096, 14336): "gate_proj/up_proj", (14336, 4096): "down_proj",
    }
    assert {m for _, m, _, _ in bench.linear_shapes("tiny", 512)} == {512}
    with pytest.raises(ValueError, match="tokens"):
        bench.linear_shapes("tiny", 0)


def test_time_ms_is_the_median_of_the_runs():
    calls = []
    ms = bench.time_ms(lambda: (calls.append(1), time.sleep(0.004)), iters=5, warmup=2)
    assert len(calls) == 7 and 4.0 <= ms < 60.0
    with pytest.raises(ValueError):
        bench.time_ms(lambda: None, iters=0)  # the one timing helper, shared with the scripts


def test_bench_gemm_rows():
    rows = bench.bench_gemm("tiny", ["mxfp4", "fp8_tensorwise"], tokens=64, device="cpu", iters=1, warmup=0)
    assert len(rows) == 4 * 3  # four distinct shapes × (bf16 first, then the two recipes)
    assert [r["recipe"] for r in rows[:3]] == ["bf16", "mxfp4", "fp8_tensorwise"]
    for r in rows:
        for g in ("fprop", "dgrad", "wgrad"):
            assert r[f"{g}_ms"] > 0 and r[f"{g}_tflops"] > 0
            if r["recipe"] == "bf16":
                assert r[f"{g}_vs_bf16"] == 1.0
    assert "| 64x128x384 | gate_proj/up_proj | mxfp4 |" in bench.gemm_table(rows)


def test_bench_train_measures_every_recipe_after_bf16(capsys):
    cfg = bench.TrainBench(preset="tiny", batch_size=2, seq_len=16, steps=2, warmup=1, device="cpu")
    rows = bench.bench_train(cfg, ["nvfp4", "bf16"])
    assert [r["recipe"] for r in rows] == ["bf16", "nvfp4"]
    assert rows[0]["vs_bf16"] == 1.0 and rows[1]["tokens_per_s"] > 0
    assert rows[1]["tokens_per_s"] == pytest.approx(2 * 16 / rows[1]["ms_per_step"] * 1e3)
    assert rows[1]["peak_memory_bytes"] is None  # no allocator statistics on a CPU
    assert all(r["first_step_s"] > 0 for r in rows)
    assert bench.train_table(rows).splitlines()[0].endswith("| first step s |")
    with pytest.raises(ValueError, match="max_seq_len"):
        bench.bench_train(bench.TrainBench(seq_len=4096, device="cpu"), ["bf16"])
    with pytest.raises(ValueError, match="unknown peer"):
        bench.bench_train(cfg, ["bf16"], peers=["nemo"])
    with pytest.raises(ValueError, match="valid recipes"):
        bench.bench_train(cfg, ["fp7"])


def test_bench_cli(tmp_path, capsys, monkeypatch):
    out = tmp_path / "b.json"
    argv = ["bench", "linear", "--shapes", "64x32x48", "--recipes", "fp8_tensorwise", "--device", "cpu",
            "--iters", "1", "--warmup", "0", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "fewerbits bench linear --shapes 64x32x48 --recipes fp8_tensorwise" in printed
    assert "| 64x32x48 | fp8_tensorwise | emulated |" in printed  # no FP8 units on a CPU
    rows = json.loads(out.read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["nn.Linear (bf16)", "fp8_tensorwise"]
    with pytest.raises(SystemExit):
        main(["bench", "linear", "--shapes", "64x32"])
    assert "not a shape MxKxN" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if torchao were not installed
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    assert main(["bench", "train", "--peer", "torchao", "--device", "cpu", "--iters", "1"]) == 2
    assert "--peer torchao needs torchao" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["gemm", "linear", "train"])
def test_bench_json_path_is_checked_before_anything_runs(what, tmp_path, capsys, monkeypatch):
    """A --json file in a folder that does not exist, or a folder itself, is refused with one
    line before a benchmark runs (bench train writes after each arm: it would fail after the
    first one's minutes)."""
    ran = []
    for name in ("bench_gemm", "bench_linear", "bench_train"):
        monkeypatch.setattr(bench, name, lambda *a, **kw: ran.append(a))
    for path, says in ((tmp_path / "missing" / "b.json", "does not exist"), (tmp_path, "is a folder")):
        assert main(["bench", what, "--device", "cpu", "--json", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fewerbits: error: --json") and says in err and "\n" not in err
    assert ran == [] and not (tmp_path / "missing").exists()


def test_bench_train_json_keeps_the_arms_of_a_run_stopped_early(tmp_path, capsys, monkeypatch):
    """`bench train --json` writes the arms measured so far after each one (complete: false),
    so a run cut off by a time limit keeps them; a finished run writes complete: true."""
    out = tmp_path / "t.json"
    argv = ["bench", "train", "--preset", "tiny", "--batch-size", "1", "--seq-len", "8", "--iters", "1",
            "--warmup", "0", "--device", "cpu", "--recipes", "bf16,fp8_tensorwise,mxfp4", "--json", str(out)]
    real = bench._time_training
    seen = []

    def stop_at_the_third_arm(model, *a, **kw):
        seen.append(json.loads(out.read_text())["rows"] if out.exists() else [])
        if len(seen) == 3:
            raise KeyboardInterrupt  # as a time limit would stop it
        return real(model, *a, **kw)

    monkeypatch.setattr(bench, "_time_training", stop_at_the_third_arm)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and [r["recipe"] for r in kept["rows"]] == ["bf16", "fp8_tensorwise"]
    assert kept["rows"][1]["vs_bf16"] > 0 and "bench train --preset tiny" in kept["header"]
    assert [len(s) for s in seen] == [0, 1, 2] and not (tmp_path / "t.json.tmp").exists()
    monkeypatch.setattr(bench, "_time_training", real)
    assert main(argv) == 0
    done = json.loads(out.read_text())
    assert done["complete"] is True and [r["recipe"] for r in done["rows"]] == ["bf16", "fp8_tensorwise", "mxfp4"]
    capsys.readouterr()


@pytest.mark.cuda
def test_bench_train_on_cuda_reports_peak_memory():
    cfg = bench.TrainBench(preset="tiny", batch_size=2, seq_len=32, steps=2, warmup=1, device="cuda")
    rows = bench.bench_train(cfg, ["fp8_tensorwise"])
    assert all(r["peak_memory_bytes"] > 0 for r in rows) and rows[1]["memory_vs_bf16"] > 0


def test_bench_train_compile_blocks_compiles_block_by_block(capsys, monkeypatch):
    """--compile-blocks reaches compile_model as blocks=True for every arm (compilation itself
    is replaced here: tests/test_convert.py compiles by blocks)."""
    calls = []
    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: calls.append(kw) or model)
    argv = ["bench", "train", "--preset", "tiny", "--batch-size", "1", "--seq-len", "8", "--iters", "1",
            "--warmup", "0", "--device", "cpu", "--recipes", "bf16,fp8_tensorwise", "--compile-blocks"]
    assert main(argv) == 0
    assert calls == [{"blocks": True}] * 2
    assert "--compile-blocks --recipes bf16,fp8_tensorwise" in capsys.readouterr().out


def test_bench_train_compile_mode_reaches_every_arms_compilation(capsys, monkeypatch):
    """--compile-mode reaches compile_model as torch.compile's mode for every arm, and the table's
    header names it (compilation itself is replaced here; on a GPU tests/test_cuda.py trains
    with the graphs replayed)."""
    calls = []
    monkeypatch.setattr(bench, "compile_model", lambda model, **kw: calls.append(kw) or model)
    argv = ["bench", "train", "--preset", "tiny", "--batch-size", "1", "--seq-len", "8", "--iters", "1",
            "--warmup", "0", "--device", "cpu", "--recipes", "bf16,fp8_tensorwise", "--compile-blocks",
            "--compile-mode", "reduce-overhead"]
    assert main(argv) == 0
    assert calls == [{"blocks": True, "mode": "reduce-overhead"}] * 2
    assert "--compile-blocks --compile-mode reduce-overhead --recipes bf16,fp8_tensorwise" in capsys.readouterr().out


def test_bench_train_compile_mode_needs_compilation_and_a_known_mode(capsys):
    argv = ["bench", "train", "--preset", "tiny", "--iters", "1", "--device", "cpu", "--recipes", "bf16",
            "--compile-mode", "reduce-overhead"]
    assert main(argv) == 2
    assert "compile mode 'reduce-overhead' needs compilation (--compile or --compile-blocks)" in capsys.readouterr().err
    cfg = bench.TrainBench(preset="tiny", compile_blocks=True, compile_mode="fastest", device="cpu")
    with pytest.raises(ValueError, match="unknown compile mode 'fastest'; valid modes: default, reduce-overhead"):
        bench.bench_train(cfg, ["bf16"])


def test_uses_cuda_graphs_names_the_modes_that_replay_cuda_graphs():
    """The modes whose steps training_step marks (`cudagraph_mark_step_begin`): those whose
    inductor options replay CUDA graphs, and no other."""
    assert bench.uses_cuda_graphs("reduce-overhead") and bench.uses_cuda_graphs("max-autotune")
    assert not any(bench.uses_cuda_graphs(m) for m in (None, "default", "max-autotune-no-cudagraphs"))


def test_synchronizing_calls_runs_the_step_once():
    """Without CUDA nothing can make the host wait for it: the step runs once, the list is empty
    (on a GPU, tests/test_cuda.py asserts that no compiled training step makes such a call)."""
    from fewerbits.bench import synchronizing_calls

    calls = []
    assert synchronizing_calls(lambda: calls.append(1)) == [] and calls == [1]


def test_bench_train_repeats_go_over_the_arms_in_turn_and_pool_their_steps(monkeypatch, tmp_path, capsys):
    """`repeats` rounds measure bf16, the recipes, then bf16 and the recipes again, each on a new
    model; an arm's median and range come from all its rounds' timed steps, its ratio to bf16
    from both arms' pooled medians."""
    real, order = bench._time_training, []
    fake_ms = {"bf16": [[10.0, 12.0], [20.0, 22.0]], "fp8_tensorwise": [[5.0, 6.0], [7.0, 30.0]]}

    def timed(model, x, y, cfg, device, autocast):
        recipes = {m.recipe.name for m in model.modules() if isinstance(m, fb.QuantizedLinear)}
        name = "fp8_tensorwise" if "fp8_tensorwise" in recipes else "bf16"
        real(model, x, y, cfg, device, autocast)  # the step runs for real
        order.append(name)
        ms = fake_ms[name][sum(n == name for n in order) - 1]
        return 1.0, ms, [t / 2 for t in ms]

    monkeypatch.setattr(bench, "_time_training", timed)
    cfg = bench.TrainBench(preset="tiny", batch_size=1, seq_len=8, steps=2, warmup=0, device="cpu", repeats=2)
    rows = bench.bench_train(cfg, ["fp8_tensorwise"])
    assert order == ["bf16", "fp8_tensorwise", "bf16", "fp8_tensorwise"]
    base, fp8 = rows
    assert base["step_ms"] == fake_ms["bf16"] and fp8["step_ms"] == fake_ms["fp8_tensorwise"]
    assert base["ms_per_step"] == 16.0 and (base["ms_min"], base["ms_max"]) == (10.0, 22.0)  # median of 4 steps
    assert fp8["ms_per_step"] == 6.5 and (fp8["ms_min"], fp8["ms_max"]) == (5.0, 30.0)
    assert fp8["vs_bf16"] == pytest.approx(16.0 / 6.5) and fp8["tokens_per_s"] == pytest.approx(8 / 6.5e-3)
    assert fp8["host_ms"] == [[2.5, 3.0], [3.5, 15.0]] and fp8["host_ms_per_step"] == 3.25  # pooled too
    assert "| fp8_tensorwise | 6.5 | 5.0–30.0 | 3.2 |" in bench.train_table(rows)
    with pytest.raises(ValueError, match="repeats"):
        bench.bench_train(bench.TrainBench(preset="tiny", device="cpu", repeats=0), ["bf16"])
    out = tmp_path / "r.json"
    argv = ["bench", "train", "--preset", "tiny", "--batch-size", "1", "--seq-len", "8", "--iters", "2",
            "--warmup", "0", "--device", "cpu", "--recipes", "fp8_tensorwise", "--repeats", "2", "--json", str(out)]
    order.clear()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "--repeats 2" in printed and "2 rounds over the arms in turn" in printed
    saved = json.loads(out.read_text())
    assert saved["complete"] is True and [len(r["step_ms"]) for r in saved["rows"]] == [2, 2]
    assert [[len(h) for h in r["host_ms"]] for r in saved["rows"]] == [[2, 2], [2, 2]]  # the real steps'


def test_time_samples_gives_the_hosts_time_of_each_timed_run():
    """`host` gets one figure per timed run (none for warm-up runs): the time until the call
    returned, on a CPU the run's own time."""
    from fewerbits.benchmark import time_samples

    calls, host = [], []
    times = time_samples(lambda: (calls.append(1), time.sleep(0.002)), iters=3, warmup=2, device="cpu", host=host)
    assert len(calls) == 5 and len(times) == len(host) == 3
    assert all(h >= 2.0 for h in host) and host == times
