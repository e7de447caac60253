"""The throughput benchmark keeps working: a tiny model, a few steps, the JSON shape (never its speed)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "train_throughput.py"
RUNNERS = ("seed_recipe", "hf_trainer", "nli_helpers")
RUN_KEYS = {"examples_per_s", "tokens_per_s", "padded_fraction", "peak_rss_mb", "wall_s", "accuracy"}


def load_harness():
    spec = importlib.util.spec_from_file_location("train_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-random", "--data", "sample",
                           "--steps", "2", "--repeats", "1", "--batch-size", "8", "--max-length", "64",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vs_trainer" in proc.stdout  # the printed table and ratios
    return json.loads(out.read_text())


def test_json_has_the_documented_shape(report):
    assert set(report) == {"runs", "ratios", "config", "machine"}
    assert set(report["runs"]) == set(RUNNERS)
    assert set(report["ratios"]) == {"vs_seed", "vs_trainer"}
    for name, run in report["runs"].items():
        assert RUN_KEYS <= set(run), name
        assert run["examples"] == 2 * 8 and run["steps"] == 2, name  # same steps and batch for every runner
        assert run["examples_per_s"] > 0 and run["tokens_per_s"] > 0 and run["peak_rss_mb"] > 0
        assert 0 <= run["padded_fraction"] < 1 and 0 <= run["accuracy"] <= 1
    assert report["runs"]["seed_recipe"]["precision"] == "fp32"
    config = report["config"]
    assert (config["steps"], config["batch_size"], config["max_length"]) == (2, 8, 64)
    assert report["machine"]["cpus"] >= 1 and "torch" in report["machine"]


def test_every_runner_scores_the_same_held_out_rows(report):
    sizes = {run["eval_examples"] for run in report["runs"].values()}
    trains = {run["train_examples"] for run in report["runs"].values()}
    assert len(sizes) == 1 and len(trains) == 1


def test_ratios_are_medians_of_per_repeat_ratios():
    harness = load_harness()

    def rnd(seed, trainer, ours):
        return {name: {"examples_per_s": v, **{k: 1.0 for k in harness.MEDIAN_KEYS if k != "examples_per_s"},
                       "precision": "x", "device": "cpu", "threads": 1, "steps": 1, "examples": 1,
                       "real_tokens": 1, "padded_tokens": 1, "eval_examples": 1, "train_examples": 1,
                       "mean_train_tokens": 1.0}
                for name, v in zip(RUNNERS, (seed, trainer, ours))}

    runs, ratios = harness.summarise([rnd(10, 100, 120), rnd(5, 50, 70), rnd(10, 100, 150)], list(RUNNERS))
    assert runs["nli_helpers"]["examples_per_s"] == 120
    assert ratios["vs_trainer"] == pytest.approx(1.4)  # median of 1.2, 1.4, 1.5
    assert ratios["vs_seed"] == pytest.approx(14)  # median of 12, 14, 15


def test_unknown_runner_is_refused():
    with pytest.raises(SystemExit, match="unknown runner"):
        load_harness().main(["--runners", "nli_helpers,fastest", "--data", "sample"])


def test_the_gpu_check_runs_its_shape_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--steps", "3",
                           "--data", "sample", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) == {"device", "peak_flops", "shape", "config", "runs", "skipped"}
    assert "hf_trainer" in report["runs"] and any(r.startswith("nli_helpers@") for r in report["runs"])
    assert report["skipped"] == {"nli_helpers@fp16": "fp16 needs a CUDA GPU"}  # this CPU: no fp16, no MFU
    for name, run in report["runs"].items():
        assert run["steps"] == 3 and run["examples"] == 3 * 8, name
        assert [step for step, _ in run["loss_curve"]] == [1, 2, 3], name
        assert run["examples_per_s"] > 0 and run["mfu"] is None and run["peak_gpu_memory_gb"] is None
    assert "| runner | precision | examples/s | tokens/s | MFU |" in proc.stdout


def test_mfu_counts_the_recipe_flops():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # roberta-base at 40 tokens a pair: about 20.6 GFLOP of matmuls per pair, 0.18 of attention (benchmarks/README.md)
    flops = module.model_flops({"real_tokens": 40, "examples": 1}, module.ROBERTA_BASE)
    assert 20.5e9 < flops < 21.0e9
    assert module.peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and module.peak_flops("Tesla T4") == 65e12
    assert module.peak_flops("Some Future GPU") is None
