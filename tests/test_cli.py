"""The command line, and the README's promises about it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fewerbits import FORMATS
from fewerbits.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_formats_table(capsys):
    assert main(["formats", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in FORMATS:
        assert re.search(rf"^{name}\s", out, re.M), name
    e4m3 = next(line for line in out.splitlines() if line.startswith("fp8_e4m3 "))
    assert "448" in e4m3 and "2^-6" in e4m3 and "2^-9" in e4m3 and "17.8" in e4m3


def test_formats_json_is_derived(capsys):
    assert main(["formats", "--device", "cpu", "--json"]) == 0
    rows = {r["format"]: r for r in json.loads(capsys.readouterr().out)["formats"]}
    assert set(rows) == set(FORMATS)
    for name, f in FORMATS.items():
        assert rows[name]["max"] == f.max and rows[name]["bits"] == f.bits
    assert rows["fp32"]["native_matmul"] is True and rows["e8m0"]["native_matmul"] is None
    assert rows["fp4_e2m1"]["native_matmul"] is False  # no CPU has FP4 matrix units


def test_bad_device_is_one_clear_line(capsys):
    assert main(["formats", "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fewerbits: error:") and "\n" not in err


@pytest.mark.parametrize("device", ["tpu", "mps", "meta", "cuda:x", ""])
def test_devices_other_than_cpu_and_cuda_are_refused_by_name(device, capsys):
    """Every command's --device: a device torch does not know, or one fewerbits does not run
    on, is refused in one line that names it and the choices (not torch's list of device types)."""
    for command in (["formats"], ["bench", "gemm"], ["bench", "linear"], ["bench", "train"]):
        assert main([*command, "--device", device]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"fewerbits: error: device {device!r} is not one fewerbits runs on: auto, cpu, cuda or cuda:N"


def test_train_and_compare_refuse_a_bad_device_before_making_a_folder(tmp_path, capsys):
    """`train` and `compare` check --device before anything is written: no run folder, no
    comparison folder, and compare starts no run (one error line, not one a recipe)."""
    for command in ("train", "compare"):
        out = tmp_path / command
        assert main([command, "--device", "tpu", "--out", str(out), "--steps", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == "fewerbits: error: device 'tpu' is not one fewerbits runs on: auto, cpu, cuda or cuda:N"
        assert not out.exists()


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "fewerbits", "formats", "--device", "cpu"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert re.search(r"^fp8_e4m3\s+8\s+4\s+3\s+7\s+448\s", out, re.M)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert "pytest" in ci and f"\n{ci}\n" in readme


@pytest.mark.parametrize("snippet", ["fewerbits compare"])
def test_readme_main_command(snippet):
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"pip install torch==2\.13\.0 -e \. && " + snippet, readme)
