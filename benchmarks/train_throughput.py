"""Training throughput: the old recipe's loop vs Hugging Face Trainer at its best vs nli_helpers.

Trains the same model on the same real MultiNLI pairs for the same number of optimizer steps
(same per_device_train_batch_size, max_seq_length and learning rate: one process, so the batch is
the whole batch) three ways, each in its own process, interleaved
and repeated so that the drift of a shared machine cancels out, then scores each on the same
premise-disjoint held-out rows:

    python benchmarks/train_throughput.py --quick --out results.json      # about 5 minutes on 2 cores
    python benchmarks/train_throughput.py --steps 150 --repeats 3          # the numbers in README.md
    python benchmarks/train_throughput.py --model roberta-base --learning_rate 2e-5 --steps 300  # GPU

Writes `{"runs": {runner: {...}}, "ratios": {"vs_seed": x, "vs_trainer": y}, "data_pipeline":
{"collate": {...}, "tokenise": {...}}, "config": {...}, "machine": {...}}` and prints a table.
Each run's numbers are medians over the repeats; each ratio is the median of the per-repeat
ratios (runners of one repeat run back to back). Throughput counts
the training loop from the first training forward call to the last optimizer step (so it includes
torch.compile time, if any, but not model loading or tokenising); `wall_s` is the whole process.
`data_pipeline` (from `data_pipeline.py`, its own process, first) times loading the file, fetching
and collating the training batches as the package's loader does, and tokenising the data with the
token cache cold and warm.
See benchmarks/README.md for the machine, results and what each speed-up gave.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
RUNNER_NAMES = ("seed_recipe", "hf_trainer", "nli_helpers")
DEFAULT_DATA = os.environ.get("NLI_REAL_DATA")  # else MultiNLI dev_matched where nli_helpers.mnli finds it
MEDIAN_KEYS = ("examples_per_s", "tokens_per_s", "padded_fraction", "peak_rss_mb", "train_peak_rss_mb",
               "wall_s", "loop_s", "setup_s", "cpu_ms_per_example", "accuracy")
# Steps are a multiple of 50 because Trainer's group_by_length sampler sorts each mega-batch of 50
# batches longest first: a run that stops inside a mega-batch would hand Trainer only its longest pairs.
QUICK = {"steps": 50, "repeats": 2, "seed_repeats": 1, "max_eval_samples": 500}
FULL = {"steps": 150, "repeats": 3, "seed_repeats": None, "max_eval_samples": None}
TRAINER_MEGA_BATCH = 50


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"a short run (about 5 minutes on 2 CPU cores): defaults become {QUICK}")
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run (default {FULL['steps']})")
    p.add_argument("--repeats", type=int, default=None, help=f"rounds of all runners (default {FULL['repeats']})")
    # TrainingArguments' names, with underscores or dashes, as the trainer command takes them
    p.add_argument("--per_device_train_batch_size", "--per-device-train-batch-size", type=int, default=32,
                   help="examples per optimizer step (every runner trains in one process)")
    p.add_argument("--max_seq_length", "--max-seq-length", type=int, default=128,
                   help="truncate pairs to this many tokens")
    p.add_argument("--learning_rate", "--learning-rate", type=float, default=1e-4,
                   help="peak learning rate (all runners)")
    p.add_argument("--seed-repeats", type=int, default=None,
                   help="rounds that include seed_recipe, the slowest runner by far (default: all; 1 with --quick)")
    p.add_argument("--runners", default=",".join(RUNNER_NAMES),
                   help="comma-separated runners ('': the data pipeline only); RUNNER@VARIANT adds "
                        "an ablation for the change log: "
                        "nli_helpers@foreach_adamw (the optimizer before fused AdamW), nli_helpers@fp32 (no bf16 "
                        "autocast), nli_helpers@no_grouping (random batches, dynamic padding only); join with +")
    p.add_argument("--model", default="minilm-l6",
                   help="model name or directory (minilm-l6, roberta-base, a saved model folder, ...)")
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="NLI pairs file, or 'sample' (default: $NLI_REAL_DATA, else MultiNLI dev_matched from "
                        "../shared/data or the Hugging Face hub's cache)")
    p.add_argument("--max-eval-samples", type=int, default=None,
                   help="cap the held-out rows (default: all in full mode, 500 with --quick)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per run (0: torch's default)")
    p.add_argument("--seed", type=int, default=42, help="seed for weights, data order and the premise split")
    p.add_argument("--timeout", type=int, default=3600, help="seconds before one run is killed")
    p.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True,
                   help="time collating and tokenising (data_pipeline.py) before the training runs")
    p.add_argument("--tokenise-scale", type=int, default=1,
                   help="tokenise the training split this many times over (44: ~full MultiNLI)")
    return p


def make_spec(args: argparse.Namespace, model_path: str) -> dict:
    mode = QUICK if args.quick else FULL
    return {
        "model": args.model, "model_path": model_path, "data": args.data,
        "steps": args.steps or mode["steps"], "per_device_train_batch_size": args.per_device_train_batch_size,
        "max_seq_length": args.max_seq_length,
        "learning_rate": args.learning_rate, "warmup_ratio": 0.1, "weight_decay": 0.01, "seed": args.seed,
        "eval_fraction": 0.1,
        "max_eval_samples": args.max_eval_samples if args.max_eval_samples is not None else mode["max_eval_samples"],
        "threads": args.threads, "tokenise_scale": args.tokenise_scale,
    }


def reap(proc: subprocess.Popen, timeout: float):
    """Wait for `proc` with wait4, which returns that child's own rusage (max RSS in kB on Linux)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return usage


def run_one(runner: str, spec: dict, workdir: Path, timeout: int,
            script: str = "throughput_runners.py") -> dict:
    """One run in a fresh process; its peak RSS comes from the kernel's accounting of that process."""
    stem = runner.replace("@", "-").replace("+", "-")
    spec_path, out_path = workdir / f"{stem}.spec.json", workdir / f"{stem}.result.json"
    spec_path.write_text(json.dumps({**spec, "runner": runner}))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["NLI_CACHE_DIR"] = str(workdir / "cache")  # the runs share a token cache, deleted after
    cmd = [sys.executable, str(Path(__file__).with_name(script)),
           "--spec", str(spec_path), "--out", str(out_path)]
    log_path = workdir / f"{stem}.log"
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        usage = reap(proc, timeout)
    wall = time.perf_counter() - start
    if not out_path.is_file():
        tail = log_path.read_text()[-3000:]
        why = f"stopped at its {timeout:.0f} s limit" if wall >= timeout else "failed"
        raise RuntimeError(f"runner {runner} {why} (see {log_path.name}):\n{tail}")
    result = json.loads(out_path.read_text())
    result["wall_s"] = wall
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


def summarise(rounds: list[dict[str, dict]], runners: list[str]) -> tuple[dict, dict]:
    """Medians over the rounds each runner ran in; ratios: the median of per-round ratios."""
    runs = {}
    for name in runners:
        reps = [r[name] for r in rounds if name in r]
        runs[name] = {k: median(rep[k] for rep in reps) for k in MEDIAN_KEYS}
        runs[name].update({k: reps[0][k] for k in ("precision", "device", "threads", "steps", "examples",
                                                   "real_tokens", "padded_tokens", "eval_examples",
                                                   "train_examples", "mean_train_tokens")})
        runs[name]["accuracy_per_repeat"] = [rep["accuracy"] for rep in reps]
        runs[name]["examples_per_s_per_repeat"] = [rep["examples_per_s"] for rep in reps]
    ratios = {}
    for key, other in (("vs_seed", "seed_recipe"), ("vs_trainer", "hf_trainer")):
        if "nli_helpers" in runners and other in runners:
            ratios[key] = median(r["nli_helpers"]["examples_per_s"] / r[other]["examples_per_s"]
                                 for r in rounds if "nli_helpers" in r and other in r)
    return runs, ratios


def machine_info() -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "load_average_before": list(os.getloadavg())}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        text = cpuinfo.read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
        flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        info["cpu_bf16"] = [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def print_table(runs: dict, ratios: dict) -> None:
    cols = [("runner", "{}"), ("precision", "{}"), ("examples_per_s", "{:.1f}"), ("tokens_per_s", "{:.0f}"),
            ("padded_fraction", "{:.3f}"), ("peak_rss_mb", "{:.0f}"),
            ("train_peak_rss_mb", "{:.0f}"), ("wall_s", "{:.1f}"), ("cpu_ms_per_example", "{:.1f}"),
            ("accuracy", "{:.3f}")]
    rows = [[fmt.format(name if key == "runner" else run[key]) for key, fmt in cols] for name, run in runs.items()]
    widths = [max(len(c[0]), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c[0].ljust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    for key, value in ratios.items():
        print(f"nli_helpers examples/s {key}: {value:.2f}x")


def print_pipeline(pipeline: dict) -> None:
    load, col, tok = pipeline["load"], pipeline["collate"], pipeline["tokenise"]
    print(f"load {load['pairs']:,} pairs with load_nli_splits: {load['best_s']:.2f} s")
    print(f"collate, {col['batches']} batches of {col['batch_size']}: rows fetched + DataCollatorWithPadding "
          f"{col['ms_per_batch']:.3f} ms/batch (the collator alone {col['collator_only_ms_per_batch']:.3f})")
    print(f"tokenise {tok['pairs']:,} pairs: cold cache {tok['cold_s']:.2f} s, "
          f"warm {tok['warm_s']:.3f} s ({tok['cold_over_warm']:.0f}x), "
          f"no cache {tok['no_cache_s']:.2f} s")


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    unknown = sorted({r.partition("@")[0] for r in runners} - set(RUNNER_NAMES))
    if unknown:
        raise SystemExit(f"unknown runner(s) {', '.join(unknown)}; choose from {', '.join(RUNNER_NAMES)}")
    if args.data is None:
        from nli_helpers import mnli

        try:
            args.data = str(mnli.find_dev_matched().path)
        except mnli.NotFound as e:
            raise SystemExit(f"{e}; {mnli.WHAT_TO_DO}, or pass --data sample") from None
    if args.data != "sample" and not Path(args.data).exists():  # a file, or a folder of split files
        raise SystemExit(f"data {args.data} does not exist; set NLI_REAL_DATA or pass --data "
                         "(see ../shared/data/README.md), or --data sample")
    from nli_helpers.model import resolve_model_path

    spec = make_spec(args, resolve_model_path(args.model))  # resolved once: every run loads the same weights
    mode = QUICK if args.quick else FULL
    repeats = args.repeats or mode["repeats"]
    seed_repeats = min(repeats, args.seed_repeats or mode["seed_repeats"] or repeats)
    if "hf_trainer" in runners and spec["steps"] % TRAINER_MEGA_BATCH:
        print(f"warning: --steps {spec['steps']} is not a multiple of {TRAINER_MEGA_BATCH}: Trainer's "
              "group_by_length sampler orders each mega-batch of 50 batches longest first, so it would "
              "train on longer pairs than the others", file=sys.stderr)
    machine = machine_info()
    rounds: list[dict[str, dict]] = []
    orders = []
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        pipeline = None
        if args.pipeline:  # first, on a machine not yet warmed by the training runs
            pipeline = run_one("data_pipeline", spec, Path(tmp), args.timeout, "data_pipeline.py")
        for rep in range(repeats):
            todo = [r for r in runners if r != "seed_recipe" or rep < seed_repeats]
            if not todo:  # --runners '': the data pipeline only
                break
            order = todo[rep % len(todo):] + todo[:rep % len(todo)]  # rotate: no runner always first
            orders.append(order)
            results = {}
            for name in order:
                results[name] = run_one(name, spec, Path(tmp), args.timeout)
                print(f"repeat {rep + 1}/{repeats} {name}: {results[name]['examples_per_s']:.1f} ex/s, "
                      f"acc {results[name]['accuracy']:.3f}, load {os.getloadavg()[0]:.2f}", flush=True)
            rounds.append(results)
    machine["load_average_after"] = list(os.getloadavg())
    runs, ratios = summarise(rounds, runners)
    config = {**{k: v for k, v in spec.items() if k != "model_path"}, "repeats": repeats,
              "seed_repeats": seed_repeats, "quick": args.quick,
              "orders": orders, "runners": runners}
    report = {"runs": runs, "ratios": ratios, "data_pipeline": pipeline, "config": config,
              "machine": machine}
    if runs:
        print_table(runs, ratios)
    if pipeline:
        print_pipeline(pipeline)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
