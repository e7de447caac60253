"""One run: load the data and model a `TrainConfig` names, train, evaluate, save. What the
`nli_helpers.task` command, notebooks and papermill call.

    >>> result = run_training(make_config("smoke"))          # runs/train-<time>/
    >>> result.metrics["validation_matched"]["accuracy"]

The run folder (`cfg.output_dir`, else `runs/train-<time>`; local or gs://) is one
`from_pretrained` loads, with `metrics.json` copied last to mark a finished run. A SIGTERM while
it trains ends the run with a checkpoint (`result.stopped`); one during the final save lets the
save finish.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

import datasets
import filelock
import transformers
from transformers import set_seed

from . import distributed as dist
from . import files
from .checkpoint import RESUME_CRITICAL, checkpoints, latest_checkpoint, written_whole
from .checkpoint import remove as remove_checkpoint
from .config import QUIET_LOG_LEVELS, NLIError, TrainConfig, cache_dir
from .data import load_nli_splits
from .model import check_model_fits, load_model_and_tokenizer, tokenize_splits
from .tracking import TrainCallback, live_progress, summary_line
from .train import TrainResult, global_batch, train


def set_library_output(cfg: TrainConfig) -> None:
    """--log_level onto transformers' and datasets' loggers, as Trainer maps it (passive leaves
    their own level, warning), and their bars off where nobody watches them: both libraries'
    `utils.logging` take the same calls."""
    for library in (transformers.utils.logging, datasets.utils.logging):
        if cfg.log_level != "passive":
            library.set_verbosity(transformers.utils.logging.get_log_levels_dict()[cfg.log_level])
        if not live_progress():
            library.disable_progress_bar()


class RunFinished(NLIError):
    """--resume_from_checkpoint auto found the run finished: nothing to do (the command exits 0)."""


def run_training(cfg: TrainConfig, *, verbose: bool = True,
                 callbacks: Sequence[TrainCallback] = (),
                 exit_on_sigterm: Callable[[], bool] = lambda: False) -> TrainResult:
    """Load the data and model that `cfg` names, train, evaluate, save to `cfg.job_dir`. A SIGTERM
    while training returns the result with `stopped` set (`train.Stopped`: the step, the checkpoint
    and what to do next) once the checkpoint is saved; `exit_on_sigterm()` true (a launcher stopping
    the ranks after one failed) exits at once instead."""
    dist.check_accelerator(cfg)  # no GPU for a run that needs one: stop before loading anything
    set_library_output(cfg)
    info = dist.init_distributed()
    # Rank 0 names the default folder for every rank: their clocks may read different seconds.
    job_dir = cfg.output_dir or dist.broadcast_from_main(
        f"runs/train-{datetime.now():%Y%m%d-%H%M%S}", info)
    root = cfg.checkpoint_dir or files.join(job_dir, "checkpoints")
    try:
        # Fail now, not after an epoch, when the run or its checkpoints cannot be written. Rank 0
        # checks for all: a rank's probe would race another's clean-up of the folders it made.
        dist.on_main_process(lambda: [files.check_writable(path, flag) for path, flag in (
            (job_dir, "--output_dir"), (cfg.checkpoint_dir, "--checkpoint_dir")) if path], info)
        callbacks = [*callbacks, *default_callbacks(cfg, job_dir, given=callbacks)]
        with job_dir_lock(job_dir, root, info):  # before anything slow: a second run learns at once
            finished = dist.on_main_process(lambda: check_output_dir(cfg, job_dir, root), info)
            if dist.broadcast_from_main(finished, info):
                raise RunFinished(f"{job_dir} holds this run, finished: --resume_from_checkpoint "
                                  "auto has nothing to do (--overwrite_output_dir trains it again)")
            result = _train_and_save(cfg, job_dir, root, info, callbacks,
                                     verbose and info.is_main, exit_on_sigterm)
    finally:
        dist.shutdown_distributed()
    if verbose and info.is_main and not result.stopped:  # one summary for the job, not one per rank
        print(f"done in {result.metrics['train']['seconds']:.0f}s "
              f"({result.metrics['train']['examples_per_s']:.1f} examples/s); "
              + summary_line({k: v for k, v in result.metrics.items()
                              if k.startswith("validation")}))
        print(f"saved to {job_dir}")
    return result


def _train_and_save(cfg: TrainConfig, job_dir: str, root: str, info, callbacks,
                    verbose: bool, exit_on_sigterm: Callable[[], bool]) -> TrainResult:
    device = dist.device_for(info)
    precision = dist.resolve_precision(cfg.precision, device)  # fail fast, before loading anything
    start_up_lines = verbose and cfg.log_level not in QUIET_LOG_LEVELS
    splits = load_nli_splits(cfg.data or "sample", eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                             max_train_samples=cfg.max_train_samples,
                             max_eval_samples=cfg.max_eval_samples)
    set_seed(cfg.seed)  # once a run: the classifier head (next line), then the loop's dropout
    name = cfg.model_name_or_path or "minilm-l6"
    model, tokenizer = load_model_and_tokenizer(name)
    check_model_fits(model, tokenizer, cfg.max_seq_length, name)
    if start_up_lines:
        print(f"data: {splits.report}")
        print(f"model: {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              f"parameters) on {device}, {precision}")
        print(f"batch: {global_batch(cfg, info.world_size)} pairs per optimizer step = "
              f"{info.world_size} process(es) x {cfg.per_device_train_batch_size} x "
              f"{cfg.gradient_accumulation_steps} accumulation step(s)")
    tokenized = tokenize_splits(splits, tokenizer, cfg.max_seq_length)
    resume_from = cfg.resume_from_checkpoint
    if resume_from == "auto":  # rank 0 chooses for all: nodes' checkpoint folders could disagree
        newest = latest_checkpoint(root) if info.is_main else None
        resume_from = dist.broadcast_from_main(newest, info)
    if start_up_lines and cfg.resume_from_checkpoint:
        print(f"resuming from {resume_from}" if resume_from
              else f"no complete checkpoint in {root}: starting fresh")
    # A SIGTERM while training stops the loop at the ranks' next agreement, with a checkpoint; one
    # after the loop must not kill the final save half-way: the save is seconds long and finishes
    # within the platform's grace period, so the run ends whole.
    with sigterm_times(exit_on_sigterm) as signalled:
        result = train(cfg, model, tokenizer, tokenized, device=device, precision=precision,
                       info=info, callbacks=callbacks, checkpoint_root=root,
                       resume_from=resume_from, should_stop=lambda: bool(signalled))
        if result.stopped is None:  # every rank has the same weights: one writes them
            dist.on_main_process(lambda: save_run(result, job_dir, root), info)
    since = f" {time.monotonic() - signalled[0]:.1f} s after the signal" if signalled else ""
    stopped = result.stopped
    if stopped is not None and stopped.checkpoint:
        stopped.message = (f"stopped by SIGTERM after step {stopped.step}; checkpoint saved to "
                           f"{stopped.checkpoint}{since}. Rerun with --resume_from_checkpoint auto "
                           "to continue")
    elif stopped is not None:
        stopped.message = (f"stopped by SIGTERM after step {stopped.step}{since}, with no "
                           "checkpoint to resume from (--save_total_limit "
                           f"{cfg.save_total_limit}): a restart would start from step 0. Keep "
                           "checkpoints (the default, 2) to make a stopped run resumable")
    elif signalled and verbose:
        print(f"SIGTERM arrived during the final save{since}; the run was saved whole")
    return result


@contextlib.contextmanager
def sigterm_times(exit_now: Callable[[], bool] = lambda: False) -> Iterator[list[float]]:
    """While the block runs, a SIGTERM appends its time (`time.monotonic()`) to the list yielded:
    the loop stops at its ranks' next agreement once the list is not empty."""
    signalled: list[float] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach it only
        yield signalled
        return

    def request(signum, frame):
        if exit_now():  # no checkpoint can follow, and this rank may be blocked in a collective
            os._exit(128 + signum)
        signalled.append(time.monotonic())

    previous = signal.signal(signal.SIGTERM, request)
    try:
        yield signalled
    finally:
        signal.signal(signal.SIGTERM, previous)


def save_run(result: TrainResult, job_dir: str, checkpoint_root: str | None = None) -> str:
    """Write model + tokenizer (safetensors), train_config.json (which --config reads back),
    history.jsonl, then metrics.json, which marks a finished run, through the checkpoints' writer
    (`checkpoint.written_whole`). The old metrics.json goes first: a rerun never leaves one beside
    new weights, and a failed copy leaves no result."""
    fs, path = files.filesystem(job_dir)
    with written_whole(job_dir, "metrics.json", f"the trained model to {job_dir}",
                       "--output_dir", checkpoint_root) as tmp:
        if fs.exists(files.join(path, "metrics.json")):
            fs.rm_file(files.join(path, "metrics.json"))
        result.model.save_pretrained(tmp)
        result.tokenizer.save_pretrained(tmp)
        (tmp / "train_config.json").write_text(result.config.to_json() + "\n")
        with open(tmp / "history.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in result.history)
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    result.output_dir = job_dir
    return job_dir


def check_output_dir(cfg: TrainConfig, job_dir: str, root: str) -> bool:
    """Refuse a finished run (metrics.json) in `job_dir`, and an earlier run's checkpoints in
    `root` where this run would start afresh, unless --overwrite_output_dir, which removes both
    first: a failed run never takes an earlier result with it, nor resumes another run. True when
    `--resume_from_checkpoint auto` meets the finished run: nothing is left to do."""
    fs, path = files.filesystem(job_dir)
    metrics = files.join(path, "metrics.json")
    finished = fs.exists(metrics)
    saved = checkpoints(root)
    if cfg.overwrite_output_dir:
        if finished:
            fs.rm_file(metrics)
        for _, old in saved:
            remove_checkpoint(old)
        return False
    if finished and cfg.resume_from_checkpoint == "auto":  # done, unless the settings changed
        saved_config = json.loads(fs.cat_file(files.join(path, "train_config.json")))
        if all(saved_config.get(k) == getattr(cfg, k) for k in RESUME_CRITICAL):
            return True
    if finished:
        raise NLIError(f"{job_dir} holds a finished run (metrics.json); pass "
                       "--overwrite_output_dir to replace it, or another --output_dir")
    if saved and not cfg.resume_from_checkpoint:
        raise NLIError(f"{root} holds an earlier run's checkpoints (the newest at step "
                       f"{max(saved)[0]}); pass --resume_from_checkpoint auto to continue it, "
                       "--overwrite_output_dir to start over, or another --output_dir")
    return False


def run_lock(folder: str) -> filelock.FileLock:
    """The OS file lock (filelock: it dies with its process) of a local run folder. It lives in
    the cache, so taking it creates nothing in the folder: a run that stops before writing (a bad
    --data) leaves no folder behind."""
    key = hashlib.sha256(str(Path(folder).expanduser().resolve()).encode()).hexdigest()[:24]
    (cache_dir() / "locks").mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(cache_dir() / "locks" / f"{key}.lock"))


@contextlib.contextmanager
def job_dir_lock(job_dir: str, root: str, info) -> Iterator[None]:
    """One live run per local job dir and checkpoint dir: a second would prune the first's
    checkpoints."""
    folders = [d for d in dict.fromkeys((job_dir, root)) if not files.is_gcs_uri(d)]
    with contextlib.ExitStack() as held:
        for folder in folders if info.is_main else []:
            try:
                held.enter_context(run_lock(folder).acquire(timeout=0))
            except filelock.Timeout:
                raise NLIError(f"another run is writing to {folder}; wait for it to finish, or "
                               "pass another --output_dir / --checkpoint_dir") from None
        yield


# -- the hooks the command attaches ----------------------------------------------------------------
def default_callbacks(cfg: TrainConfig, job_dir: str, *,
                      given: Sequence[TrainCallback] = ()) -> list[TrainCallback]:
    """TensorBoard into `<output_dir>/tensorboard` with `--report_to tensorboard` (Trainer's flag;
    off by default, as in transformers 5), unless `given` has one already (Vertex AI's log dir)."""
    if cfg.report_to != "tensorboard":
        return []
    from .tracking import TensorBoardCallback  # only a run that reports loads TensorBoard

    if any(isinstance(c, TensorBoardCallback) for c in given):
        return []
    return [TensorBoardCallback(files.join(job_dir, "tensorboard"))]
