"""Checkpoints that survive preemption: written atomically, found again, resumed exactly.

A checkpoint is a folder `checkpoint-<step>` holding `model.safetensors`, `training_state.pt`
(optimizer, scheduler, grad scaler, every rank's RNG, the loop's position; tensors and plain values
only, read with `torch.load(weights_only=True)`) and `manifest.json` (each file's size and SHA-256).
Only a checkpoint with a manifest counts: locally the folder is written under a temporary name and
renamed; on gs:// the manifest is uploaded last. So a job killed mid-write leaves nothing that
`latest_checkpoint` picks up, and one damaged later is skipped for the newest intact one (why
`--keep_checkpoints` keeps more than one).

    >>> path = save_checkpoint("runs/x/checkpoints", step, model, state, keep=2)
    >>> latest_checkpoint("runs/x/checkpoints")          # the newest intact one, or None
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from . import storage
from .config import NLIError, TrainConfig
from .distributed import DistInfo, all_gather_objects, on_main_process

WEIGHTS, STATE, MANIFEST = "model.safetensors", "training_state.pt", "manifest.json"
# Fields that must match for a resumed run to continue the same trajectory.
RESUME_CRITICAL = ("model_name", "data", "epochs", "batch_size", "grad_accum_steps",
                   "learning_rate", "weight_decay", "warmup_ratio", "max_length", "seed",
                   "group_by_length", "fraction_of_train_data", "max_train_samples",
                   "eval_fraction")  # eval_fraction: the split
# The loop's position, saved and restored as plain values (train.LoopState's fields).
PROGRESS = ("step", "epoch", "batches_done", "skipped_steps", "history", "eval_history")
NAME = re.compile(r"checkpoint-(\d+)$")
REPLACED = ".replaced-"  # prefix of a checkpoint being swapped out for a new one of the same step
log = logging.getLogger(__name__)


class CheckpointError(NLIError):
    """A checkpoint could not be written or read."""


def checkpoint_root(checkpoint_dir: str | None, job_dir: str) -> str:
    return checkpoint_dir or f"{job_dir.rstrip('/')}/checkpoints"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_files(directory: Path, model: torch.nn.Module, state: dict, step: int) -> None:
    save_model(model, str(directory / WEIGHTS))
    torch.save(state, directory / STATE)
    files = {name: (directory / name).stat().st_size for name in (WEIGHTS, STATE)}
    sha256 = {name: _sha256(directory / name) for name in (WEIGHTS, STATE)}
    (directory / MANIFEST).write_text(json.dumps({"step": step, "files": files, "sha256": sha256}))
    for name in (WEIGHTS, STATE, MANIFEST):  # on disk before the rename makes it visible
        with open(directory / name, "rb") as f:
            os.fsync(f.fileno())


def save_checkpoint(root: str, step: int, model: torch.nn.Module, state: dict,
                    keep: int = 2) -> str:
    """Write checkpoint-<step> under `root` atomically and prune all but the newest `keep`."""
    name = f"checkpoint-{step:08d}"
    if storage.is_gcs_uri(root):
        return _save_gcs(root, name, step, model, state, keep)
    root_path = Path(root)
    tmp = None
    try:
        root_path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root_path))
        _write_files(tmp, model, state, step)
        final = root_path / name
        if final.exists():  # swap, never delete first: the old one counts until the new one is in
            aside = root_path / f"{REPLACED}{name}"
            _remove(aside)
            os.replace(final, aside)
            os.replace(tmp, final)
            _remove(aside)
        else:
            os.replace(tmp, final)
        _remove_leftovers(root_path)
    except (OSError, RuntimeError, SafetensorError) as e:  # a full disk surfaces as any of these
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = latest_checkpoint(root) if root_path.is_dir() else None
        raise CheckpointError(f"could not write checkpoint {name} to {root} "
                              f"({getattr(e, 'strerror', None) or e}); "
                              + (f"the previous checkpoint {Path(kept).name} is kept. " if kept else
                                 "there is no earlier checkpoint. ")
                              + write_hint(e, root_path, _state_bytes(state)
                                           + _state_bytes(model.state_dict()),
                                           "--checkpoint_dir")) from e
    for old in sorted(_local_checkpoints(root_path))[:-keep] if keep > 0 else []:
        _remove(old[1])
    return str(final)


def _remove_leftovers(root: Path) -> None:
    """What killed saves left: temporary folders, and checkpoints set aside whose step has a
    checkpoint again. (One run writes here at a time: the job dir's lock.)"""
    for p in root.iterdir():
        stale_aside = (p.name.startswith(REPLACED)
                       and (root / p.name.removeprefix(REPLACED)).is_dir())
        if p.name.startswith(".tmp-checkpoint-") or stale_aside:
            _remove(p)


def _remove(directory: Path) -> None:
    """Delete a checkpoint so that it stops counting first: the manifest, then the rest."""
    (directory / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _state_bytes(value) -> int:
    """Bytes of the tensors in a (nested) training state: what torch.save will write."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_state_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_state_bytes(v) for v in value)
    return 0


def free_bytes(path: Path) -> int | None:
    """Free space on the disk that holds `path` (or its nearest existing parent)."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def write_hint(err: BaseException, folder: Path, needed: int, flag: str) -> str:
    """What to do about a failed write of `needed` bytes into `folder`, for the user of `flag`.

    A full disk does not always say so: torch.save's zip writer reports ENOSPC as "unexpected pos",
    so the disk's free space is measured too."""
    code = getattr(err, "errno", None)
    full = ("No space left", "StorageFull", "File too large", "FileTooLarge", "Disk quota")
    free = free_bytes(folder)
    if free is not None and free < needed:
        return (f"The disk is full: {free / 2**20:.0f} MiB free where {folder} is, and this "
                f"needs about {needed / 2**20:.0f} MiB. Free space, or pass {flag} on another disk")
    if code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or any(text in str(err) for text in full):
        return ("The disk is full (or a file-size or quota limit was hit): free space or pass "
                f"{flag} elsewhere")
    if code in (errno.ENOTDIR, errno.EEXIST):
        return f"A part of that path is a file, not a folder: pass {flag} with a folder"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"That folder is not writable here: pass {flag} with one you can write"
    return f"Pass {flag} with a folder you can write"


def unsaved_model_message(model: torch.nn.Module, target: Path, checkpoint_root: str | None,
                          err: BaseException) -> str:
    """The one message for a trained model that could not be written: why, what to do, what is
    left (the newest checkpoint, which --resume auto continues from)."""
    kept = latest_checkpoint(checkpoint_root) if checkpoint_root else None
    return (f"could not write the trained model to {target} "
            f"({getattr(err, 'strerror', None) or err}). "
            + write_hint(err, target, _state_bytes(model.state_dict()) + 2**24, "--job-dir") + ". "
            + (f"The newest checkpoint, {kept}, is kept: run the same command again with "
               "--resume auto to train only the steps after it" if kept else
               "There is no checkpoint to resume from: the run must train again"))


def staging_dir() -> str | None:
    """Where a gs:// checkpoint is written before its upload: /dev/shm when it has room, so a
    preempted job spends its last seconds uploading, not writing a slow boot disk."""
    shm = Path("/dev/shm")
    try:
        return (str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 4e9
                and os.access(shm, os.W_OK) else None)
    except OSError:
        return None


def _save_gcs(root: str, name: str, step: int, model, state: dict, keep: int) -> str:
    uri = f"{root.rstrip('/')}/{name}"
    with tempfile.TemporaryDirectory(prefix="nli-ckpt-", dir=staging_dir()) as tmp:
        _write_files(Path(tmp), model, state, step)
        for file in (WEIGHTS, STATE, MANIFEST):  # the manifest last: it marks the checkpoint whole
            storage.upload(Path(tmp) / file, f"{uri}/{file}")
    complete = sorted(_gcs_checkpoints(root))
    for _, old_uri in complete[:-keep] if keep > 0 else []:
        storage.delete(f"{old_uri}/{MANIFEST}")  # first: from here on it no longer counts
        storage.delete(old_uri)
    return uri


def _local_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints: checkpoint-<step> with a manifest, or one set aside during a swap
    (a kill between the two renames) where no checkpoint-<step> replaced it."""
    if not root.is_dir():
        return []
    found = {}
    for p in sorted(root.iterdir(), key=lambda p: p.name.startswith(REPLACED)):  # real name first
        m = NAME.match(p.name.removeprefix(REPLACED))
        if m and (p / MANIFEST).is_file():
            found.setdefault(int(m.group(1)), p)
    return list(found.items())


def damage(directory: Path) -> str | None:
    """Why a complete-looking local checkpoint cannot be trusted, or None when it is intact."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files, sums = manifest["files"], manifest.get("sha256", {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MANIFEST} is unreadable ({e})"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return (f"{name} has {path.stat().st_size:,} bytes, the manifest says {size:,} "
                    "(truncated?)")
        if name in sums and _sha256(path) != sums[name]:
            return f"{name} does not match its SHA-256 in the manifest (corrupt)"
    return None


def _gcs_checkpoints(root: str) -> list[tuple[int, str]]:
    found = []
    for uri in storage.list_uris(root.rstrip("/") + "/"):
        parent, _, file = uri.rpartition("/")
        if file == MANIFEST and (m := NAME.match(parent.rpartition("/")[2])):
            found.append((int(m.group(1)), parent))
    return found


def latest_checkpoint(root: str) -> str | None:
    """The newest intact checkpoint under `root`, or None; skips a damaged one with a warning."""
    if storage.is_gcs_uri(root):
        found = _gcs_checkpoints(root) if storage.exists(root) else []
        return max(found)[1] if found else None  # Cloud Storage checksums uploads itself
    for _, path in sorted(_local_checkpoints(Path(root)), reverse=True):
        problem = damage(path)
        if problem is None:
            return str(path)
        log.warning("skipping damaged checkpoint %s: %s; trying the one before it", path, problem)
        print(f"warning: skipping damaged checkpoint {path}: {problem}; trying the one before it",
              flush=True)
    return None


def load_checkpoint(path: str, model: torch.nn.Module) -> dict:
    """Load weights into `model` and return the training state (never through pickle)."""
    with storage.local_copy(path, staging=staging_dir()) as local:
        directory = Path(local)
        if not (directory / MANIFEST).is_file():
            raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST}); pass "
                                  "--resume auto to pick the newest complete one")
        try:
            load_model(model, str(directory / WEIGHTS))
            return torch.load(directory / STATE, map_location="cpu", weights_only=True)
        except (SafetensorError, pickle.UnpicklingError, EOFError) as e:
            raise CheckpointError(f"checkpoint {path} is damaged ({e}); delete it, and --resume "
                                  "auto takes the newest intact one") from e
        except (OSError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path} could not be loaded ({e}); it does not "
                                  "match this model") from e


class CheckpointTimer:
    """Says when `minutes` (None or 0: never) have passed since the start or the last checkpoint."""

    def __init__(self, minutes: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = (minutes or 0) * 60, clock
        self.restart()

    def restart(self) -> None:
        self.since = self.clock()

    def minutes(self) -> float:
        return (self.clock() - self.since) / 60

    def due(self) -> bool:
        return self.seconds > 0 and self.clock() - self.since >= self.seconds


# -- the training loop's state --------------------------------------------------------------------
def save_training(root: str, keep: int, step: int, model, optimizer, scheduler, scaler,
                  progress: dict, cfg: TrainConfig, info: DistInfo, device: torch.device,
                  precision: str, fingerprint: str | None = None) -> str:
    """Checkpoint the loop: every rank calls this, rank 0 writes; its failure raises on all."""
    rng = all_gather_objects(rng_state(device), info)
    state = {**{k: progress[k] for k in PROGRESS}, "world_size": info.world_size,
             "precision": precision, "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng,
             "config": cfg.to_dict(), "data_fingerprint": fingerprint}
    return on_main_process(lambda: save_checkpoint(root, step, model, state, keep), info)


def resume_training(path: str, model, optimizer, scheduler, scaler, cfg: TrainConfig,
                    info: DistInfo, device: torch.device, precision: str,
                    fingerprint: str | None = None) -> dict:
    """Restore model, optimizer, schedule, scaler and this rank's RNG; return the loop position."""
    state = load_checkpoint(path, model)
    check_resumable(path, state, cfg, info.world_size, precision, fingerprint)
    model.to(device)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"][info.rank], device)
    return {k: state.get(k, 0) for k in PROGRESS}


def check_resumable(path: str, state: dict, cfg: TrainConfig, world_size: int, precision: str,
                    fingerprint: str | None = None) -> None:
    """Refuse a resume that would silently train another run: changed settings, data, process
    count or precision."""
    saved = state["config"]
    changed = [f"{k} ({saved.get(k)!r} -> {getattr(cfg, k)!r})" for k in RESUME_CRITICAL
               if k in saved and saved.get(k) != getattr(cfg, k)]
    if fingerprint and state.get("data_fingerprint") and state["data_fingerprint"] != fingerprint:
        changed.append(f"the training pairs under data={cfg.data!r} (their content or order "
                       "differs)")
    if changed:
        raise CheckpointError(f"cannot resume from {path}: {', '.join(changed)} changed since it "
                              "was written; resume with the same settings or start a new job dir")
    world = state.get("world_size", len(state["rng"]))
    if world != world_size:
        raise CheckpointError(f"cannot resume from {path}: it was written by {world} process(es) "
                              f"and this run has {world_size}; each process's share of the data "
                              f"and its random state would change. Resume with {world} "
                              "process(es) (torchrun --nproc-per-node, the same machines), or "
                              "start a new job dir")
    saved_precision = state.get("precision", precision)
    if saved_precision != precision:
        raise CheckpointError(f"cannot resume from {path}: it trained in {saved_precision} and "
                              f"this run would train in {precision} (another GPU, or --precision); "
                              f"pass --precision {saved_precision} where the hardware has it, or "
                              "start a new job dir")


def rng_state(device: torch.device) -> dict:
    """This process's RNG: the CPU generator and, on a GPU, its own device's (not every GPU's)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # the older format: every visible GPU's state
        cuda = cuda[device.index or 0] if len(cuda) > (device.index or 0) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)
