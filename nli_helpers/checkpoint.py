"""Checkpoints that survive preemption: written whole or not at all, found again, resumed exactly.

A checkpoint is a folder `checkpoint-<step>` that `from_pretrained` opens as Trainer's does
(`config.json`, `model.safetensors`, the tokenizer's files), plus `training_state.pt` (optimizer,
scheduler, grad scaler, every rank's RNG, the loop's position; tensors and plain values only, read
with `torch.load(weights_only=True)`) and `manifest.json` (each file's size and SHA-256), copied
last. Only a checkpoint with a manifest counts, so a job killed mid-copy leaves nothing that
`latest_checkpoint` picks up, and one damaged later is skipped for the newest intact one (why
`--save_total_limit` keeps more than one). Local paths and gs:// take the same calls (`files`).

    >>> path = save_checkpoint("runs/x/checkpoints", step, model, tokenizer, state, keep=2)
    >>> latest_checkpoint("runs/x/checkpoints")          # the newest intact one, or None
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from . import files
from .config import NLIError, TrainConfig
from .data import content_hash
from .distributed import DistInfo, all_gather_objects, on_main_process

STATE, MANIFEST = "training_state.pt", "manifest.json"
# Fields that must match for a resumed run to continue the same trajectory.
RESUME_CRITICAL = ("model_name_or_path", "data", "num_train_epochs",
                   "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
                   "weight_decay", "warmup_ratio", "max_seq_length", "seed", "group_by_length",
                   "max_train_samples", "eval_fraction")
NAME = re.compile(r"checkpoint-(\d+)$")
log = logging.getLogger(__name__)


class CheckpointError(NLIError):
    """A checkpoint (or a finished run's folder) could not be written or read."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(root: str, step: int, model, tokenizer, state: dict, keep: int = 2) -> str:
    """Write checkpoint-<step> under `root` (manifest last) and prune all but the newest `keep`."""
    target = files.join(root, f"checkpoint-{step:08d}")
    with written_whole(target, MANIFEST, f"checkpoint {target}", "--checkpoint_dir", root) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # Through memory: on a full disk torch's own writer fails with "unexpected pos"; a plain
        # write names the OS's reason (No space left on device).
        buffer = io.BytesIO()
        torch.save(state, buffer)
        (tmp / STATE).write_bytes(buffer.getvalue())
        sums = {f.name: _sha256(f.read_bytes()) for f in tmp.iterdir() if f.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "sha256": sums}))
        remove(target)  # a killed save's leftovers of this step (a step is saved once)
    for _, old in sorted(checkpoints(root))[:-keep] if keep > 0 else []:
        remove(old)
    return target


@contextlib.contextmanager
def written_whole(target: str, last: str, what: str, flag: str,
                  checkpoint_root: str | None) -> Iterator[Path]:
    """The one writer of a run's folders (a checkpoint, the finished run): the block fills a
    local folder, which is then copied to `target` (local or gs://) with the file `last` after all
    others, so a reader that waits for `last` sees whole results only. A full disk or a lost
    bucket ends in one CheckpointError: `what` failed, what is kept, and `flag` to pass."""
    try:
        with tempfile.TemporaryDirectory(prefix="nli-save-") as tmp:
            yield Path(tmp)
            files.put(tmp, target, last=last)
    except (OSError, SafetensorError, files.StorageError) as e:
        kept = files.what_is_kept(checkpoint_root, latest_checkpoint) if checkpoint_root else \
            "there is no checkpoint to resume from"
        raise CheckpointError(f"could not write {what} ({files.reason(e)}); {kept}. Free space, "
                              f"or pass {flag} with a folder you can write") from e


def remove(path: str) -> None:
    """Delete a checkpoint so that it stops counting first: the manifest, then the rest."""
    fs, p = files.filesystem(path)
    if fs.exists(files.join(p, MANIFEST)):
        fs.rm_file(files.join(p, MANIFEST))
    if fs.exists(p):
        fs.rm(p, recursive=True)


def checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint-<step> under `root` with a manifest."""
    fs, p = files.filesystem(root)
    found = fs.glob(files.join(p, "checkpoint-*", MANIFEST)) if fs.exists(p) else []
    prefix = "gs://" if files.is_gcs_uri(root) else ""
    return [(int(m.group(1)), prefix + folder) for folder in (f.rsplit("/", 1)[0] for f in found)
            if (m := NAME.search(folder))]


def damage(path: str) -> str | None:
    """Why a checkpoint with a manifest cannot be trusted, or None when every file is intact."""
    fs, p = files.filesystem(path)
    try:
        sums = json.loads(fs.cat_file(files.join(p, MANIFEST)))["sha256"]
        for name, digest in sums.items():
            if _sha256(fs.cat_file(files.join(p, name))) != digest:
                return f"{name} does not match its SHA-256 in the manifest (truncated or corrupt)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"it cannot be read ({type(e).__name__}: {e})"
    return None


def latest_checkpoint(root: str) -> str | None:
    """The newest intact checkpoint under `root`, or None; skips a damaged one with a warning."""
    for _, path in sorted(checkpoints(root), reverse=True):
        problem = damage(path)
        if problem is None:
            return path
        print(f"warning: skipping damaged checkpoint {path}: {problem}; trying the one before it",
              flush=True)
    return None


def load_checkpoint(path: str, model: torch.nn.Module, check=lambda state: None) -> dict:
    """Return the training state and load the weights into `model` (never through pickle);
    `check(state)` runs in between, so a resume with other settings is refused before the weights
    of another model fail to load."""
    fs, p = files.filesystem(path)
    if not fs.exists(files.join(p, MANIFEST)):
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST}); pass "
                              "--resume_from_checkpoint auto for the newest complete one")
    try:
        state = torch.load(io.BytesIO(fs.cat_file(files.join(p, STATE))), map_location="cpu",
                           weights_only=True)
        check(state)
        model.load_state_dict(load(fs.cat_file(files.join(p, "model.safetensors"))))
        return state
    except CheckpointError:
        raise
    except Exception as e:  # safetensors, pickle and torch raise many types for one bad file
        why = " ".join(str(e).split())[:300]  # one line: torch's own messages span several
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(e).__name__}: "
                              f"{why}); it is damaged or from another model. Delete it, "
                              "and --resume_from_checkpoint auto takes the newest intact "
                              "one") from e


# -- the training loop's state --------------------------------------------------------------------
@dataclass
class TrainState:
    """A run's whole state, saved and loaded whole: the model, optimizer, schedule and loss scaler,
    where the loop is, and `identity`, what a resumed run must share with it (its settings, process
    count, precision, and its training pairs' fingerprint). `checkpoint` is the newest complete
    checkpoint it saved or resumed from, with its step."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    identity: dict
    step: int = 0  # optimizer steps applied
    epoch: int = 0
    batches_done: int = 0  # micro-batches of the current epoch
    skipped_steps: int = 0  # fp16 steps the grad scaler skipped
    history: list[dict] = field(default_factory=list)  # per step: step, epoch, loss, lr
    eval_history: list[dict] = field(default_factory=list)
    checkpoint: tuple[int, str] | None = None

    POSITION = ("step", "epoch", "batches_done", "skipped_steps", "history", "eval_history")

    def state_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.POSITION}, **self.identity,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for key in self.POSITION:
            setattr(self, key, state[key])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])


def identity(cfg: TrainConfig, world_size: int, precision: str, train_split=None) -> dict:
    """What a resumed run must share with the run that saved: its settings, process count,
    precision, and its training pairs' fingerprint (`data.content_hash`; None: not checked)."""
    return {"config": cfg.to_dict(), "world_size": world_size, "precision": precision,
            "data_fingerprint": None if train_split is None else content_hash(train_split)}


def save_training(state: TrainState, root: str, keep: int, tokenizer, info: DistInfo,
                  device: torch.device) -> str:
    """Checkpoint the loop: every rank calls this (each adds its RNG), rank 0 writes; its failure
    raises on all."""
    saved = {**state.state_dict(), "rng": all_gather_objects(rng_state(device), info)}
    path = on_main_process(lambda: save_checkpoint(root, state.step, state.model, tokenizer, saved,
                                                   keep), info)
    state.checkpoint = (state.step, path)
    return path


def resume_training(state: TrainState, path: str, info: DistInfo, device: torch.device) -> None:
    """Restore the whole state and this rank's RNG from checkpoint `path`, once its identity
    matches."""
    saved = load_checkpoint(path, state.model, lambda saved: check_resumable(path, saved,
                                                                             state.identity))
    state.model.to(device)
    state.load_state_dict(saved)
    set_rng_state(saved["rng"][info.rank], device)
    state.checkpoint = (state.step, path)


def check_resumable(path: str, saved: dict, identity: dict) -> None:
    """Refuse a resume that would silently train another run: changed settings, data, process
    count or precision."""
    config, now = saved["config"], identity["config"]
    changed = [f"{k} ({config.get(k)!r} -> {now[k]!r})" for k in RESUME_CRITICAL
               if k in config and config.get(k) != now[k]]
    if identity["data_fingerprint"] and saved.get("data_fingerprint") not in (
            None, identity["data_fingerprint"]):
        changed.append(f"the training pairs under data={now['data']!r} (their content or order "
                       "differs)")
    if saved.get("world_size", identity["world_size"]) != identity["world_size"]:
        changed.append(f"the number of processes ({saved['world_size']} -> "
                       f"{identity['world_size']}: each one's share of the data and random state "
                       "would change)")
    if saved.get("precision", identity["precision"]) != identity["precision"]:
        changed.append(f"precision ({saved['precision']} -> {identity['precision']}: another GPU, "
                       "or --precision)")
    if changed:
        raise CheckpointError(f"cannot resume from {path}: {', '.join(changed)} changed since it "
                              "was written; resume with the same settings or start a new "
                              "--output_dir")


def rng_state(device: torch.device) -> dict:
    """This process's RNG: the CPU generator and, on a GPU, its own device's (not every GPU's)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
