"""Do the notebooks' short smoke runs learn for every seed? One row per recipe, one column per seed.

Each run is `run_training` on `mnli-subset` (real MultiNLI pairs: ../shared/data or the Hugging Face hub's cache),
capped at `--pairs` training pairs, with the premise split, the classifier head and the data order drawn from the
seed; it prints the held-out accuracy and its margin over the majority class of that seed's split:

    python benchmarks/short_runs.py                                  # the table of benchmarks/README.md, ~9 minutes
    python benchmarks/short_runs.py --recipes capped --seeds 0-9     # the notebooks' recipe on ten seeds
    python benchmarks/short_runs.py --out runs/short_runs.jsonl      # one JSON line per run as well

Recipes: `capped` is what `make_config(..., smoke_cap=N)` gives on real pairs (`PROFILE_DEFAULTS["smoke_capped"]`);
the default set adds the one-epoch runs it replaced and the two ends of notebook 05's learning-rate sweep. Named
with --recipes: `capped_b16_*`, cheaper runs that were tried for the demo's time, and `full_data*`, the uncapped run
on all of --data (the accuracy-per-minute table):

    python benchmarks/short_runs.py --data ../shared/data/mnli_dev_matched.jsonl --recipes full_data --seeds 0
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

B16 = {"per_device_train_batch_size": 16}
RECIPES = {
    "one_epoch_2e-4": {"num_train_epochs": 1, "learning_rate": 2e-4},
    "one_epoch_1e-4_2000": {"num_train_epochs": 1, "learning_rate": 1e-4, "pairs": 2000},
    "capped": {},  # the smoke_capped recipe itself: nothing overridden
    "capped_1e-4": {"learning_rate": 1e-4},
    "capped_3e-4": {"learning_rate": 3e-4},
    # Half the compute of `capped` (issue 29, part 5: the demo within 5 minutes on an fp32 CPU): the same 64 steps
    # of 16 pairs instead of 32.
    "capped_b16_512": {**B16, "pairs": 512},
    "capped_b16_512_3e-4": {**B16, "pairs": 512, "learning_rate": 3e-4},
    "capped_b16_1024_1ep": {**B16, "num_train_epochs": 1},
    "capped_b16_1024_1ep_1e-4": {**B16, "num_train_epochs": 1, "learning_rate": 1e-4},
    "capped_b16_1024_1ep_3e-4": {**B16, "num_train_epochs": 1, "learning_rate": 3e-4},
    # The uncapped smoke run on all of --data (issue 29, part 6: 0.65 held-out within 5 minutes on 2 cores, fp32
    # included). `pairs: None` trains on every training pair.
    "full_data": {"pairs": None},  # PROFILE_DEFAULTS["smoke_real_data"]: 2 epochs, batch 32, 1e-4
    "full_data_1_epoch": {"pairs": None, "num_train_epochs": 1},  # the profile before 2026-11-26
    "full_data_1_epoch_2e-4": {"pairs": None, "num_train_epochs": 1, "learning_rate": 2e-4},
    "full_data_1_epoch_3e-4": {"pairs": None, "num_train_epochs": 1, "learning_rate": 3e-4},
    "full_data_1_epoch_2e-4_b16": {"pairs": None, "num_train_epochs": 1, "learning_rate": 2e-4, **B16},
    "full_data_1_epoch_b16": {"pairs": None, "num_train_epochs": 1, **B16},
}


DEFAULT_RECIPES = ("one_epoch_2e-4", "one_epoch_1e-4_2000", "capped", "capped_1e-4", "capped_3e-4")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def seeds(text: str) -> list[int]:
    """'0-4' or '0,3,42'."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                        help=f"comma-separated, from {', '.join(RECIPES)} (default {','.join(DEFAULT_RECIPES)})")
    parser.add_argument("--seeds", default="0-4", type=seeds, help="'0-4' or '0,3,42' (default 0-4)")
    parser.add_argument("--pairs", type=int, default=1024, help="training pairs of a run (default 1,024)")
    parser.add_argument("--data", default="mnli-subset", help="what run_training reads (default mnli-subset; "
                        "the full_data recipes: $NLI_REAL_DATA, all of dev_matched on our machines)")
    parser.add_argument("--out", default=None, help="append one JSON line per run to this file")
    args = parser.parse_args(argv)
    unknown = set(args.recipes.split(",")) - set(RECIPES)
    if unknown:
        parser.error(f"unknown recipe {', '.join(sorted(unknown))}: choose from {', '.join(RECIPES)}")
    import torch

    from nli_helpers.config import make_config
    from nli_helpers.run import run_training

    table: dict[str, dict[int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="short-runs-") as tmp:
        for seed in args.seeds:
            for name in args.recipes.split(","):
                overrides = dict(RECIPES[name])
                pairs = overrides.pop("pairs", args.pairs)
                capped = {"max_eval_samples": 512} if pairs else {}
                cfg = make_config("smoke", data=args.data, smoke_cap=pairs, seed=seed, progress=False,
                                  output_dir=f"{tmp}/{name}-{seed}", **capped, **overrides)
                start = time.perf_counter()
                metrics = run_training(cfg, verbose=False).metrics
                accuracy = metrics["validation_matched"]["accuracy"]
                majority = metrics["majority_baseline"]["validation_matched"]
                row = {"recipe": name, "seed": seed, "pairs": pairs, "num_train_epochs": cfg.num_train_epochs,
                       "learning_rate": cfg.learning_rate, "steps": metrics["train"]["steps"],
                       "accuracy": accuracy, "majority": majority, "held_out": metrics["validation_matched"]["n"],
                       "seconds": round(time.perf_counter() - start, 1), "precision": metrics["precision"],
                       "train_pairs": metrics["train"]["examples"],
                       "per_device_train_batch_size": cfg.per_device_train_batch_size,
                       "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as out:
                        out.write(json.dumps(row) + "\n")
                table.setdefault(f"{name} ({row['steps']} steps)", {})[seed] = f"{accuracy:.3f} ({accuracy - majority:+.3f})"
    print("| recipe | " + " | ".join(f"seed {s}" for s in args.seeds) + " |")
    print("| --- |" + " --- |" * len(args.seeds))
    for name, by_seed in table.items():
        print(f"| {name} | " + " | ".join(by_seed[s] for s in args.seeds) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
