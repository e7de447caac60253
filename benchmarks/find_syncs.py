"""Every host-device sync in a training step of nli_helpers, with where it comes from (CUDA only).

A sync stops the CPU until the GPU has caught up: the GPU then idles while the CPU launches the next kernels, and a
graph capture (CUDA graphs, `torch.compile(mode="reduce-overhead")`) cannot contain one. PyTorch reports each
sync it makes when `torch.cuda.set_sync_debug_mode("warn")` is on; this script turns it on after the warm-up steps,
trains the roberta-base-shaped model of `gpu_check.py` for a few more, and prints each place that synced, how many
times per step, and the innermost frames of the package, transformers and torch that led there; torch.profiler
counts the GPU kernels and CUDA runtime calls (launches, copies) of the same steps:

    python benchmarks/find_syncs.py --out runs/syncs.json                    # bf16, 30 steps
    python benchmarks/find_syncs.py --precision fp16 --steps 30              # adds the loss scaler's
    python benchmarks/find_syncs.py --tokenizer DIR                          # no [smoke] extra needed

A sync that stays must be named, with why, in benchmarks/README.md ("Host syncs in a step") and in NAMED below;
tests/test_gpu_paths.py runs this on any machine with CUDA and fails on a place not named there, or on one that
syncs more often than NAMED says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")

# The syncs a step may make, by the function that makes them, and how many per step at most (benchmarks/README.md,
# "Host syncs in a step", says why each stays): the log interval's loss read (once per logging_steps) and the fp16
# loss scaler's skipped-step check (once a step).
NAMED = {"flush": 0.1, "optimizer_step": 1.0}

# Frames from these folders say nothing about the cause: the warning machinery and this script.
NOISE = ("warnings.py", "find_syncs.py", "/threading.py")


def where(stack: list[traceback.FrameSummary], depth: int = 6) -> list[str]:
    """The innermost `depth` frames that are not the warning machinery, as 'file:line in function'."""
    frames = [f for f in stack if not f.filename.endswith(NOISE)]
    return [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in frames[-depth:]]


def _short(filename: str) -> str:
    for marker in ("site-packages/", "nli_helpers/", "benchmarks/"):
        if marker in filename:
            return (marker if marker != "site-packages/" else "") + filename.split(marker, 1)[1]
    return filename


def find_syncs(spec: dict, warmup: int) -> tuple[dict, int, dict]:
    """Train per `spec` with the sync debug mode on after `warmup` steps, and torch.profiler counting the CUDA
    runtime calls; returns the sites, the steps traced and the launches per step."""
    import throughput_runners as tr
    import torch

    sites: Counter = Counter()
    stacks: dict[str, list[str]] = {}
    calls = 0
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])

    def on_forward(module, args, kwargs):
        nonlocal calls
        if module.training:
            calls += 1
            if calls == warmup + 1:
                torch.cuda.synchronize()
                profiler.start()
                torch.cuda.set_sync_debug_mode("warn")

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = where(traceback.extract_stack())
        if frames and frames[-1].endswith("in set_sync_debug_mode"):  # switching the mode on: not the step's
            return
        key = frames[-1] if frames else f"{filename}:{lineno}"
        sites[key] += 1
        stacks.setdefault(key, frames)

    inner = tr.RUNNERS["nli_helpers"]

    def traced(spec, model, tokenizer, data, device):
        handle = model.register_forward_pre_hook(on_forward, with_kwargs=True)
        try:
            return inner(spec, model, tokenizer, data, device)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            profiler.stop()
            handle.remove()

    tr.RUNNERS["nli_helpers"] = traced
    tr.apply_variant("nli_helpers", spec["precision"])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        tr.run(spec | {"runner": "nli_helpers"})
    steps = spec["steps"] - warmup
    report = {key: {"count": n, "per_step": n / steps, "stack": stacks[key]} for key, n in sites.most_common()}
    runtime = {e.key: e.count / steps for e in profiler.key_averages() if e.key.startswith(("cuda", "cu"))
               and e.device_type == torch.autograd.DeviceType.CPU}
    kernels = sum(e.count for e in profiler.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    launches = {"kernels_per_step": kernels / steps,
                "runtime_calls_per_step": dict(sorted(runtime.items(), key=lambda kv: -kv[1])[:8])}
    return report, steps, launches


def main(argv: list[str] | None = None) -> int:
    import gpu_check

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps in all (default 30)")
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps before tracing starts (default 10)")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--tokenizer", default="minilm-l6", help="a local tokenizer folder (default: MiniLM-L6's)")
    parser.add_argument("--data", default=None, help="NLI pairs file, or 'sample' (default as gpu_check.py)")
    parser.add_argument("--out", default=None, help="write the sites as JSON here")
    args = parser.parse_args(argv)
    import torch

    problem = gpu_check.gpu_problem(torch)
    if problem:
        print(f"error: {problem.split('. Or pass')[0]}; the sync debug mode exists on CUDA only", file=sys.stderr)
        return 2
    data, _ = gpu_check.resolve_data(args.data)
    spec = {"model": "roberta-base-shaped", "data": data, "steps": args.steps, "warmup_steps": 0,
            "per_device_train_batch_size": 32, "max_seq_length": 128, "learning_rate": 2e-5, "warmup_ratio": 0.06,
            "weight_decay": 0.1, "seed": 42, "eval_fraction": 0.1, "max_eval_samples": 64, "logging_steps": 10,
            "threads": 0, "precision": args.precision}
    with tempfile.TemporaryDirectory(prefix="find-syncs-") as tmp:
        os.environ["NLI_CACHE_DIR"] = str(Path(tmp) / "cache")
        model = gpu_check.build_model(gpu_check.ROBERTA_BASE, Path(tmp) / "model", args.tokenizer)
        sites, steps, launches = find_syncs(spec | {"model_path": str(model)}, args.warmup_steps)
    print(f"{args.precision}: {sum(s['count'] for s in sites.values())} syncs in {steps} traced steps, "
          f"{len(sites)} places; {launches['kernels_per_step']:.0f} GPU kernels per step; CUDA runtime calls per "
          f"step: {launches['runtime_calls_per_step']}")
    for key, site in sites.items():
        print(f"- {site['per_step']:.2f} per step at {key}")
        for frame in site["stack"][:-1]:
            print(f"      from {frame}")
    if args.out:
        Path(args.out).write_text(json.dumps({"precision": args.precision, "steps": steps, "sites": sites,
                                              "launches": launches,
                                              "torch": torch.__version__, "device": torch.cuda.get_device_name(0)},
                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
