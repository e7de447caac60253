"""A whole run: load the data and model a `TrainConfig` names, train, evaluate, save. What the trainer command
(`python -m nli_helpers.task`), the notebooks and every Vertex AI job call.

    >>> from nli_helpers import make_config, run_training
    >>> result = run_training(make_config("smoke"))          # load, train, evaluate, save
    >>> result.metrics["validation_matched"]["accuracy"]

A run writes a folder that `from_pretrained` loads: the model and tokenizer (safetensors), `train_config.json`,
`history.jsonl`, and `metrics.json` last, so that its presence marks a finished run. The folder is `cfg.job_dir`,
else `$AIP_MODEL_DIR` on Vertex AI, else `runs/train-<time>`; it may be gs://.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from transformers import set_seed

from . import storage
from .batching import tokenize_splits
from .callbacks import TrainCallback
from .checkpoint import checkpoint_root, latest_checkpoint
from .config import NLIError, TrainConfig, batch_line
from .data import load_nli_splits
from .distributed import broadcast_from_main, device_for, init_distributed, on_main_process, shutdown_distributed
from .hardware import check_accelerator, resolve_precision
from .metrics import summary_line
from .model import count_parameters, load_model_and_tokenizer
from .progress import quiet_library_bars
from .tracking import default_callbacks
from .train import TrainResult, train


def run_training(cfg: TrainConfig, *, verbose: bool = True, callbacks: Sequence[TrainCallback] = ()) -> TrainResult:
    """Load the data and model that `cfg` names, train, evaluate, save to `cfg.job_dir`."""
    check_accelerator(cfg)  # no GPU for a run that needs one: stop before loading anything
    job_dir = cfg.job_dir or default_job_dir()
    check_job_dir(job_dir)
    quiet_library_bars()
    callbacks = [*callbacks, *default_callbacks(cfg, job_dir, given=callbacks)]  # TensorBoard; hypertune in a trial
    info = init_distributed()
    verbose = verbose and info.is_main
    device = device_for(info)
    precision = resolve_precision(cfg.precision, device)  # fail fast, before loading anything
    splits = load_nli_splits(cfg.data or "sample", eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                             fraction_of_train_data=cfg.fraction_of_train_data,
                             max_train_samples=cfg.max_train_samples, max_eval_samples=cfg.max_eval_samples)
    set_seed(cfg.seed)  # the classifier head is initialised in the next line
    model, tokenizer = load_model_and_tokenizer(cfg.model_name or "minilm-l6")
    if verbose:
        print(f"data: {splits.report}")
        print(f"model: {cfg.model_name} ({count_parameters(model) / 1e6:.1f}M parameters) on {device}, {precision}")
        print(batch_line(cfg, info.world_size))
    tokenized = tokenize_splits(splits, tokenizer, cfg.max_length)
    root = checkpoint_root(cfg.checkpoint_dir, job_dir)
    resume = cfg.resume
    if resume is None and os.environ.get("AIP_CHECKPOINT_DIR"):
        # Vertex AI runs a restarted replica with the same command: it must continue, not start over.
        resume = "auto"
        if verbose:
            print(f"AIP_CHECKPOINT_DIR is set (Vertex AI): resuming from the newest complete checkpoint in {root}, if any")
    resume_from = resume
    if resume == "auto":  # rank 0 chooses and every rank follows: nodes' own checkpoint folders could disagree
        resume_from = broadcast_from_main(latest_checkpoint(root) if info.is_main else None, info)
    if verbose and resume:
        print(f"resuming from {resume_from}" if resume_from else f"no complete checkpoint in {root}: starting fresh")
    try:
        result = train(cfg, model, tokenizer, tokenized, device=device, info=info, callbacks=callbacks,
                       checkpoint_root=root, resume_from=resume_from)
        on_main_process(lambda: save_run(result, job_dir), info)  # one writer: every rank holds the same weights
    finally:
        shutdown_distributed()
    if verbose:
        print(f"done in {result.metrics['train']['seconds']:.0f}s "
              f"({result.metrics['train']['examples_per_s']:.1f} examples/s); "
              f"{summary_line({k: v for k, v in result.metrics.items() if k.startswith('validation')})}")
        print(f"saved to {job_dir}")
    return result


def default_job_dir() -> str:
    return os.environ.get("AIP_MODEL_DIR") or f"runs/train-{datetime.now():%Y%m%d-%H%M%S}"


def check_job_dir(job_dir: str) -> None:
    """Fail before training, not after, when the output dir cannot be written."""
    if storage.is_gcs_uri(job_dir):
        # A write and a delete: exactly what roles/storage.objectUser grants, nothing bucket-level.
        probe = f"{job_dir.rstrip('/')}/.nli-write-check-{socket.gethostname()}-{os.getpid()}"
        with tempfile.NamedTemporaryFile() as empty:
            storage.upload(empty.name, probe)
        storage.delete(probe)
        return
    path = Path(job_dir).expanduser().resolve()
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise NLIError(f"job dir {job_dir} is not writable ({parent} is not a writable directory); "
                       "pass --job-dir with a directory you can write")


def save_run(result: TrainResult, job_dir: str) -> str:
    """Write model + tokenizer (safetensors), train_config.json, history.jsonl, then metrics.json last (in a
    second step, so that on gs:// too it is the last object to appear)."""
    with storage.staged_output(job_dir) as local:
        (local / "metrics.json").unlink(missing_ok=True)
        result.model.save_pretrained(local, safe_serialization=True)
        result.tokenizer.save_pretrained(local)
        (local / "train_config.json").write_text(result.config.to_json() + "\n")
        with open(local / "history.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in result.history)
    with storage.staged_output(job_dir) as local:
        tmp = local / "metrics.json.tmp"
        tmp.write_text(json.dumps(result.metrics, indent=2) + "\n")
        os.replace(tmp, local / "metrics.json")
    result.output_dir = job_dir
    return job_dir
