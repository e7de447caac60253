"""The trainer command: parse flags, load what the config names, train, save. What a notebook, a
shell and Vertex AI all run.

    python -m nli_helpers.task --profile smoke
    python -m nli_helpers.task --profile full --job-dir gs://BUCKET/runs/1      # on a GPU
    python -m nli_helpers.task --help                                             # every field
    >>> result = run_training(make_config("smoke"))                               # from Python

Every flag comes from a `TrainConfig` field, with underscores or hyphens (`--batch_size` /
`--batch-size`); flags you leave out take the profile's defaults. The run folder (`--job-dir`, else
`$AIP_MODEL_DIR`, else `runs/train-<time>`; local or gs://) is one `from_pretrained` loads, with
`metrics.json` written last to mark a finished run. torch and transformers load inside the
functions that need them, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .config import PROFILE_DEFAULTS, NLIError, TrainConfig, batch_line, make_config

if TYPE_CHECKING:
    from .train import TrainCallback, TrainResult

ALIASES = {"bf16": ("precision", "bf16")}  # the old recipe's switch, kept as a shorthand
# The environment of a Vertex AI (and AI Platform) tuning trial, and the TensorBoard Vertex reads.
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
METRIC_TAG_ENV = "CLOUD_ML_HP_METRIC_TAG"
TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"

log = logging.getLogger(__name__)


def whole_number(text: str) -> int:
    """An int flag's value; "16.0" is 16: Vertex AI tuning passes discrete values as doubles."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every other error; not the 60-line usage
        self.exit(2, f"error: {message} (python -m nli_helpers.task --help lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m nli_helpers.task", description=__doc__.split("\n\n")[0],
        argument_default=argparse.SUPPRESS)
    for f in dataclasses.fields(TrainConfig):
        names = sorted({f"--{f.name}", f"--{f.name.replace('_', '-')}"})
        kind = TrainConfig.field_type(f.name)
        help_text = f.metadata["help"] + default_help(f.name, f.default)
        if kind is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(*names, dest=f.name, type=whole_number if kind is int else kind,
                                choices=f.metadata.get("choices"), help=help_text,
                                metavar=f.name.upper())
    parser.add_argument("--bf16", dest="bf16", action="store_true",
                        help="shorthand for --precision bf16 (fails clearly where bf16 is "
                        "unsupported)")
    return parser


def default_help(name: str, default: object) -> str:
    """' (default: ...)' for --help: the profiles' values where they set the field, else its own.
    (A flag left out is absent, not defaulted: make_config fills it from the profile.)"""
    smoke, real, full = (PROFILE_DEFAULTS[k] for k in ("smoke", "smoke_real_data", "full"))
    if name == "data":  # its help says where smoke looks
        return ""
    parts = []
    if name in smoke:
        parts.append(f"smoke {real[name]} on MultiNLI, {smoke[name]} on the sample" if name in real
                     else f"smoke {smoke[name]}")
    if name in full:
        parts.append(f"full {full[name]}")
    if parts and (name not in smoke or name not in full) and default is not None:
        parts.append(f"else {default}")
    if not parts and (default is None or name == "profile"):
        return ""
    return f" (default: {', '.join(parts) or default})"


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    values = vars(build_parser().parse_args(argv))
    for flag, (name, value) in ALIASES.items():
        if values.pop(flag, False):
            values[name] = value
    return make_config(values.pop("profile", "smoke"), verbose=True, **values)


def main(argv: list[str] | None = None) -> int:
    """The command: 0 with a whole result, 2 with one error: line, or a signal's documented code."""
    try:
        code = _run_command(argv)
        if _AS_COMMAND:  # held until the interpreter can take it without a traceback (below)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        return code
    except KeyboardInterrupt:  # at any point, torch's import included: one line, not a traceback
        print("interrupted: the newest complete checkpoint (if any) is intact; rerun with "
              "--resume auto", file=sys.stderr)
        return 130


def _run_command(argv: list[str] | None) -> int:
    try:
        cfg = config_from_args(argv)  # --help and a bad flag stop here, before torch loads
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from .train import Preempted, StoppedWithoutCheckpoint

    try:
        run_training(cfg)
    except Preempted as e:  # an exit code Vertex AI retries; the restarted job resumes
        mark_preempted()
        print(f"preempted: {e}; exiting {e.exit_code}, an exit code Vertex AI retries",
              file=sys.stderr)
        return e.exit_code
    except StoppedWithoutCheckpoint as e:
        print(f"stopped: {e}; exiting {e.exit_code}", file=sys.stderr)
        return e.exit_code
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def mark_preempted() -> None:
    """Tell `nli_helpers.launch` that this process stopped for a SIGTERM, not for an error."""
    folder = os.environ.get("NLI_PREEMPTED_MARKERS")
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank-{os.environ.get('RANK', '0')}"), "w") as marker:
            marker.write("preempted\n")


# -- one run: load, train, save --------------------------------------------------------------------
def run_training(cfg: TrainConfig, *, verbose: bool = True,
                 callbacks: Sequence[TrainCallback] = ()) -> TrainResult:
    """Load the data and model that `cfg` names, train, evaluate, save to `cfg.job_dir`."""
    from .checkpoint import checkpoint_root
    from .distributed import check_accelerator, init_distributed, shutdown_distributed
    from .train import quiet_library_bars, summary_line

    check_accelerator(cfg)  # no GPU for a run that needs one: stop before loading anything
    job_dir = cfg.job_dir or default_job_dir()
    check_job_dir(job_dir)
    if cfg.checkpoint_dir:  # fail now, not after an epoch, when the checkpoints cannot be written
        check_job_dir(cfg.checkpoint_dir, what="checkpoint dir", flag="--checkpoint_dir")
    quiet_library_bars()
    callbacks = [*callbacks, *default_callbacks(cfg, job_dir, given=callbacks)]
    info = init_distributed()
    root = checkpoint_root(cfg.checkpoint_dir, job_dir)
    try:
        with job_dir_lock(job_dir, root, info):  # before anything slow: a second run learns at once
            result = _train_and_save(cfg, job_dir, root, info, callbacks,
                                     verbose and info.is_main)
    finally:
        shutdown_distributed()
    if verbose:
        print(f"done in {result.metrics['train']['seconds']:.0f}s "
              f"({result.metrics['train']['examples_per_s']:.1f} examples/s); "
              + summary_line({k: v for k, v in result.metrics.items()
                              if k.startswith("validation")}))
        print(f"saved to {job_dir}")
    return result


def _train_and_save(cfg: TrainConfig, job_dir: str, root: str, info, callbacks,
                    verbose: bool) -> TrainResult:
    from transformers import set_seed

    from .checkpoint import latest_checkpoint
    from .data import load_nli_splits, tokenize_splits
    from .distributed import broadcast_from_main, device_for, on_main_process, resolve_precision
    from .model import check_model_fits, load_model_and_tokenizer
    from .train import sigterm_requests, train

    device = device_for(info)
    precision = resolve_precision(cfg.precision, device)  # fail fast, before loading anything
    splits = load_nli_splits(cfg.data or "sample", eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                             fraction_of_train_data=cfg.fraction_of_train_data,
                             max_train_samples=cfg.max_train_samples,
                             max_eval_samples=cfg.max_eval_samples)
    set_seed(cfg.seed)  # the classifier head is initialised in the next line
    model, tokenizer = load_model_and_tokenizer(cfg.model_name or "minilm-l6")
    check_model_fits(model, tokenizer, cfg.max_length, cfg.model_name or "minilm-l6")
    if verbose:
        print(f"data: {splits.report}")
        print(f"model: {cfg.model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              f"parameters) on {device}, {precision}")
        print(batch_line(cfg, info.world_size))
    tokenized = tokenize_splits(splits, tokenizer, cfg.max_length)
    resume = cfg.resume
    if resume is None and os.environ.get("AIP_CHECKPOINT_DIR"):
        # Vertex AI restarts a replica with the same command: it must continue, not start over.
        resume = "auto"
        if verbose:
            print("AIP_CHECKPOINT_DIR is set (Vertex AI): resuming from the newest complete "
                  f"checkpoint in {root}, if any")
    resume_from = resume
    if resume == "auto":  # rank 0 chooses for all: nodes' own checkpoint folders could disagree
        resume_from = broadcast_from_main(latest_checkpoint(root) if info.is_main else None, info)
    if verbose and resume:
        print(f"resuming from {resume_from}" if resume_from
              else f"no complete checkpoint in {root}: starting fresh")
    # A SIGTERM after the loop must not kill the final save half-way: the save is seconds long and
    # finishes within the platform's grace period, so the run ends whole.
    with sigterm_requests() as late:
        result = train(cfg, model, tokenizer, tokenized, device=device, info=info,
                       callbacks=callbacks, checkpoint_root=root, resume_from=resume_from)
        # Every rank has the same weights: one writes them.
        on_main_process(lambda: save_run(result, job_dir, root), info)
    if late.requested and verbose:
        print(f"SIGTERM arrived during the final save{late.since()}; the run was saved whole")
    return result


def default_job_dir() -> str:
    return os.environ.get("AIP_MODEL_DIR") or f"runs/train-{datetime.now():%Y%m%d-%H%M%S}"


def check_job_dir(job_dir: str, *, what: str = "job dir", flag: str = "--job-dir") -> None:
    """Fail before training, not after, when the output dir cannot be written."""
    from . import storage

    if storage.is_gcs_uri(job_dir):
        # A write and a delete: what roles/storage.objectUser grants, nothing bucket-level.
        probe = f"{job_dir.rstrip('/')}/.nli-write-check-{socket.gethostname()}-{os.getpid()}"
        with tempfile.NamedTemporaryFile() as empty:
            storage.upload(empty.name, probe)
        storage.delete(probe)
        return
    path, created = Path(job_dir).expanduser(), []
    try:  # what the run will do: make the folder, write a file; then undo it
        path = path.resolve()
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".nli-write-check-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        parent, a_file = next((p for p in path.parents if p not in created), path), False
        with contextlib.suppress(OSError):  # a name too long even to look up
            a_file = parent.is_file()
        why = (f"{parent} is a file, not a folder" if a_file else
               f"{e.strerror or e}" if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) else
               f"{parent} is not a writable folder")
        raise NLIError(f"{what} {job_dir} cannot be written ({why}); pass {flag} with a folder "
                       "you can write") from None
    finally:
        for folder in created:  # deepest first; the run makes them again when it writes
            with contextlib.suppress(OSError):
                folder.rmdir()


def save_run(result: TrainResult, job_dir: str, checkpoint_root: str | None = None) -> str:
    """Write model + tokenizer (safetensors), train_config.json, history.jsonl, then metrics.json,
    which marks a finished run. A rerun never leaves an old metrics.json beside new weights: the
    files are written aside first (a full disk leaves the earlier run whole), the old metrics.json
    removed, the files moved in, metrics.json written last; on gs:// the old one goes first."""
    from safetensors import SafetensorError

    from . import storage

    if storage.is_gcs_uri(job_dir):
        storage.delete(f"{job_dir.rstrip('/')}/metrics.json")
        with storage.staged_output(job_dir) as local:
            _write_run_files(result, local)
        with storage.staged_output(job_dir) as local:
            _write_metrics(result, local)
    else:
        target = Path(job_dir)
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".tmp-run-", dir=target) as tmp:
                _write_run_files(result, Path(tmp))
                (target / "metrics.json").unlink(missing_ok=True)
                for file in Path(tmp).iterdir():
                    os.replace(file, target / file.name)
            _write_metrics(result, target)
        except (OSError, RuntimeError, SafetensorError) as e:  # a full disk is any of these
            from .checkpoint import unsaved_model_message

            raise NLIError(unsaved_model_message(result.model, target, checkpoint_root, e)) from e
    result.output_dir = job_dir
    return job_dir


def _write_run_files(result: TrainResult, folder: Path) -> None:
    result.model.save_pretrained(folder, safe_serialization=True)
    result.tokenizer.save_pretrained(folder)
    (folder / "train_config.json").write_text(result.config.to_json() + "\n")
    with open(folder / "history.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in result.history)


def _write_metrics(result: TrainResult, folder: Path) -> None:
    tmp = folder / "metrics.json.tmp"
    tmp.write_text(json.dumps(result.metrics, indent=2) + "\n")
    os.replace(tmp, folder / "metrics.json")


@contextlib.contextmanager
def job_dir_lock(job_dir: str, root: str, info) -> Iterator[None]:
    """One live run per local job dir and checkpoint dir: a second would prune the first's
    checkpoints. An OS file lock (filelock), so it dies with the process that held it."""
    import filelock

    from . import storage

    folders = [] if not info.is_main else [d for d in dict.fromkeys((job_dir, root))
                                           if not storage.is_gcs_uri(d)]
    locks, created = [], [Path(d) for d in folders if not Path(d).exists()]
    try:
        for folder in folders:
            Path(folder).mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(str(Path(folder) / ".nli-run.lock"))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                raise NLIError(f"another run is writing to {folder} (it holds {lock.lock_file}); "
                               "wait for it to finish, or pass another --job-dir / "
                               "--checkpoint_dir") from None
            locks.append(lock)
        yield
    finally:
        for lock in locks:
            lock.release()
        # A run that stopped before writing anything (a bad --data) leaves no folder behind.
        for folder in sorted(created, key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir() and {p.name for p in folder.iterdir()} <= {".nli-run.lock"}:
                (folder / ".nli-run.lock").unlink(missing_ok=True)
                folder.rmdir()



# -- the hooks the command attaches ----------------------------------------------------------------
def default_callbacks(cfg: TrainConfig, job_dir: str, *, given: Sequence[TrainCallback] = (),
                      env: Mapping[str, str] | None = None) -> list[TrainCallback]:
    """TensorBoard (when installed) into `$AIP_TENSORBOARD_LOG_DIR`, else `<job_dir>/tensorboard`;
    the hypertune report in a tuning trial or when `cfg.hypertune_metric` asks. A kind already in
    `given` is not added twice: a callback you pass replaces the default one."""
    from . import storage
    from .train import DEFAULT_HYPERTUNE_METRIC, HypertuneCallback, TensorBoardCallback

    env = os.environ if env is None else env
    out: list[TrainCallback] = []
    if not any(isinstance(c, TensorBoardCallback) for c in given):
        if importlib.util.find_spec("tensorboard") is not None:  # torch's writer needs it
            log_dir = env.get(TENSORBOARD_ENV) or f"{str(job_dir).rstrip('/')}/tensorboard"
            out.append(TensorBoardCallback(log_dir, upload=storage.upload))
        else:
            log.warning("tensorboard is not installed: no TensorBoard logs "
                        "(pip install tensorboard)")
    metric = cfg.hypertune_metric  # else the legacy AI Platform tag, else the default
    if ((metric or env.get(TRIAL_ID_ENV))
            and not any(isinstance(c, HypertuneCallback) for c in given)):
        out.append(HypertuneCallback(metric or env.get(METRIC_TAG_ENV) or DEFAULT_HYPERTUNE_METRIC))
    return out


_AS_COMMAND = False
if __name__ == "__main__":
    _AS_COMMAND = True
    code = main()
    # The files are written: a Ctrl-C from here on, held since main returned, or while the
    # interpreter joins its threads, ends the process at once, not in KeyboardInterrupt's traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.exit(code)
