"""The training loop: AdamW, linear warmup then decay, mixed precision, accumulation, clipping,
evaluation on every validation split, progress bars, a per-step history, and export.

    >>> from nli_helpers import make_config, run_training
    >>> result = run_training(make_config("smoke"))          # load, train, evaluate, save
    >>> result.metrics["validation_matched"]["accuracy"]

`run_training` is what `python -m nli_helpers.task` and the notebooks call; `train` is the loop
alone, for callers that bring their own model and tokenised splits.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup, set_seed

from .checkpoint import CheckpointError, checkpoint_root, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import NLIError, TrainConfig, batch_line, batch_split
from .data import LengthGroupedBatchSampler, load_nli_splits, tokenize_splits
from .distributed import (
    SINGLE_PROCESS,
    DistInfo,
    all_gather_objects,
    all_reduce_sum,
    any_rank,
    broadcast_from_main,
    device_for,
    init_distributed,
    on_main_process,
    shutdown_distributed,
)
from .hardware import autocast, check_accelerator, resolve_precision
from .metrics import classification_scores, majority_baseline, summary_line
from .model import count_parameters, load_model_and_tokenizer
from .progress import live_progress, log_line, quiet_library_bars

NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "LayerNorm.bias")


class TrainCallback:
    """Hooks the loop calls on the main process only (TensorBoard, hyperparameter-tuning reports, ...).

    Override what you need; each hook gets plain Python values, never device tensors.
    """

    def on_log(self, rows: list[dict]) -> None:
        """Per-step rows since the last log (step, epoch, loss, lr; the last adds examples_per_s)."""

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        """Scores per validation split after an evaluation."""

    def on_train_end(self, metrics: dict) -> None:
        """The final metrics, before they are saved."""


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: object
    config: TrainConfig
    metrics: dict
    history: list[dict] = field(default_factory=list)
    output_dir: str | None = None


# -- pieces of the loop ------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with no weight decay on biases and LayerNorm; fused kernels where torch has them."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if any(n in name for n in NO_DECAY) else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Fused: one pass over weights, gradients and both moments, on CUDA and (torch >= 2.4) the CPU;
    # on the CPU here the step of MiniLM-L6 takes 13 ms instead of 77 with foreach (benchmarks/README.md).
    try:
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=True)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, foreach=True)


def make_train_loader(dataset, cfg: TrainConfig, collator, device: torch.device, *,
                      num_replicas: int = 1, rank: int = 0) -> torch.utils.data.DataLoader:
    batch_split(cfg, num_replicas)  # refuse a batch that does not split evenly
    micro_batch = cfg.batch_size // cfg.grad_accum_steps  # global: each rank takes an equal share of each
    sampler = LengthGroupedBatchSampler(dataset["length"], micro_batch, seed=cfg.seed,
                                        group_by_length=cfg.group_by_length,
                                        num_replicas=num_replicas, rank=rank)
    return torch.utils.data.DataLoader(
        dataset.remove_columns([c for c in ("genre", "length") if c in dataset.column_names]),
        batch_sampler=sampler, collate_fn=collator, num_workers=cfg.num_workers,
        # Its own generator: a new epoch's iterator must not draw from the global RNG that dropout
        # uses, or a resumed run would see other dropout masks than an uninterrupted one.
        generator=torch.Generator().manual_seed(cfg.seed),
        pin_memory=device.type == "cuda", persistent_workers=cfg.num_workers > 0)


@torch.inference_mode()
def evaluate(model, dataset, collator, device: torch.device, precision: str = "fp32",
             batch_size: int = 128, info: DistInfo = SINGLE_PROCESS) -> tuple[dict, np.ndarray]:
    """Scores on a tokenised split and the predicted label ids in the split's order.

    Batches are formed in length order (far less padding), then predictions are put back in place,
    so every example counts exactly once. Under DDP each rank predicts an interleaved share and the
    shares are gathered: no example is padded in or counted twice.
    """
    model.eval()
    lengths = np.asarray(dataset["length"])
    order = np.argsort(lengths, kind="stable")[info.rank::info.world_size]
    inputs = dataset.remove_columns([c for c in ("genre", "length", "label") if c in dataset.column_names])
    preds = np.full(len(dataset), -1, dtype=np.int64)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = {k: v.to(device, non_blocking=True) for k, v in collator(inputs[idx.tolist()]).items()}
        with autocast(precision, device):
            logits = model(**batch).logits
        preds[idx] = logits.argmax(-1).cpu().numpy()
    if info.enabled:
        for rank_order, rank_preds in all_gather_objects((order, preds[order]), info):
            preds[rank_order] = rank_preds
    assert (preds >= 0).all(), "every example is predicted exactly once"
    labels = np.asarray(dataset["label"])
    genres = dataset["genre"] if "genre" in dataset.column_names else None
    model.train()
    return classification_scores(labels, preds, genres), preds


def evaluate_all(model, splits: dict, collator, device, precision, batch_size,
                 info: DistInfo = SINGLE_PROCESS) -> dict[str, dict]:
    return {name: evaluate(model, ds, collator, device, precision, batch_size, info)[0]
            for name, ds in splits.items() if name != "train"}


# -- the loop ------------------------------------------------------------------------------------
# The exit code after a SIGTERM (Spot preemption, VM maintenance) once the checkpoint is saved. Vertex AI shuts a job
# down for good when a replica exits with a "user code exception", except for the exit codes it calls possibly
# transient, which it retries: SIGABRT's 134 and SIGSEGV's 139 in a custom container ("Handle common errors",
# https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service). A preempted replica is
# restarted anyway; this code makes sure that the replicas which stop with it (every rank stops at the same step)
# are retried too, instead of failing the job. `python -m nli_helpers.launch` exits with it as well.
RESTARTABLE_EXIT_CODE = 134


class Preempted(NLIError):
    """SIGTERM arrived (Spot preemption, VM maintenance): a checkpoint was saved, rerun with --resume auto."""

    exit_code = RESTARTABLE_EXIT_CODE


# Fields that must match for a resumed run to continue the same trajectory.
RESUME_CRITICAL = ("model_name", "data", "epochs", "batch_size", "grad_accum_steps", "learning_rate",
                   "weight_decay", "warmup_ratio", "max_length", "seed", "group_by_length",
                   "fraction_of_train_data", "max_train_samples")


class TrainingLoop:
    """One run's moving parts: optimizer, schedule, data position, history, checkpoints.

    `train()` is the convenient entry; use this class directly to resume (`resume_from`).
    """

    def __init__(self, cfg: TrainConfig, model, tokenizer, tokenized, *, device: torch.device | None = None,
                 info: DistInfo = SINGLE_PROCESS, callbacks: Sequence[TrainCallback] = (),
                 checkpoint_root: str | None = None):
        self.cfg, self.model, self.tokenizer, self.info = cfg, model, tokenizer, info
        self.device = device or device_for(info)
        self.precision = resolve_precision(cfg.precision, self.device)
        set_seed(cfg.seed)
        model.to(self.device).train()
        self.net = model
        if info.enabled:
            self.net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[info.local_rank] if self.device.type == "cuda" else None)
        self.collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if self.device.type == "cuda" else None)
        self.tokenized = tokenized
        self.loader = make_train_loader(tokenized["train"], cfg, self.collator, self.device,
                                        num_replicas=info.world_size, rank=info.rank)
        self.total_steps = max(1, math.ceil(cfg.epochs * max(1, len(self.loader) // cfg.grad_accum_steps)))
        self.optimizer = build_optimizer(model, cfg, self.device)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, int(cfg.warmup_ratio * self.total_steps),
                                                         self.total_steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.evals = {k: v for k, v in tokenized.items() if k != "train"}
        self.callbacks = list(callbacks) if info.is_main else []
        self.checkpoint_root = checkpoint_root if cfg.keep_checkpoints > 0 else None
        self.step = self.epoch = self.batches_done = self.skipped_steps = 0
        self.history: list[dict] = []
        self.eval_history: list[dict] = []
        self.pending: list[tuple[int, float, torch.Tensor]] = []  # (step, lr, loss on device)
        self.window = {"t": time.perf_counter(), "examples": 0, "tokens": 0}
        self.stop_requested, self.stop_requested_at = False, None
        self.bar = None
        # A live bar in a terminal or notebook; plain lines where output is collected (a file, Cloud Logging).
        self.log_lines = cfg.progress and info.is_main and not live_progress()

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg = self.cfg
        self.bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                        disable=not (cfg.progress and self.info.is_main) or self.log_lines, dynamic_ncols=True)
        start = time.perf_counter()
        with self._stop_on_sigterm():
            while self.step < self.total_steps:
                self.loader.batch_sampler.set_epoch(self.epoch, skip_batches=self.batches_done)
                self.optimizer.zero_grad(set_to_none=True)  # no leftover micro-batch gradients across epochs
                for batch in self.loader:
                    if self._micro_step(batch) and self._after_step():
                        break
                self.epoch, self.batches_done = self.epoch + 1, 0
                if self.step < self.total_steps or not self.eval_history or self.eval_history[-1]["step"] != self.step:
                    self._evaluate()
                if self.step < self.total_steps:
                    self.save_checkpoint()
        self.bar.close()
        return self._result(time.perf_counter() - start)

    def _micro_step(self, batch) -> bool:
        """Forward and backward one micro-batch; True when it completed an optimizer step."""
        cfg, info = self.cfg, self.info
        self.window["examples"] += len(batch["labels"]) * info.world_size
        self.window["tokens"] += int(batch["attention_mask"].sum()) * info.world_size  # CPU tensor: no sync
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        self.batches_done += 1
        accumulating = self.batches_done % cfg.grad_accum_steps != 0
        # DDP all-reduces gradients on every backward unless told not to: only on the last micro-batch.
        with (self.net.no_sync() if info.enabled and accumulating else contextlib.nullcontext()):
            with autocast(self.precision, self.device):
                loss = self.net(**batch).loss / cfg.grad_accum_steps
            self.scaler.scale(loss).backward()
        if accumulating:
            return False
        if cfg.max_grad_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if scale is not None and self.scaler.get_scale() < scale:
            # fp16: the scaler found inf/NaN gradients, skipped the update and lowered its scale. No optimizer
            # step happened, so neither the schedule nor the step count moves (as Trainer and accelerate do).
            self.skipped_steps += 1
            return False
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step += 1
        self.pending.append((self.step, lr, loss.detach() * cfg.grad_accum_steps))
        self.bar.update(1)
        return True

    def _after_step(self) -> bool:
        """Log, evaluate, checkpoint and honour SIGTERM as due; True when training is over."""
        cfg, step, last = self.cfg, self.step, self.step >= self.total_steps
        if step % cfg.log_every == 0 or last:
            self._flush()
        if cfg.eval_every and step % cfg.eval_every == 0 and not last:
            self._evaluate()
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and not last:
            self.save_checkpoint()
        if not last and self._should_stop():
            path = self.save_checkpoint()
            took = f" {time.monotonic() - self.stop_requested_at:.1f} s after the signal" if self.stop_requested_at else ""
            raise Preempted(f"stopped by SIGTERM after step {step}; checkpoint saved to {path}{took}. "
                            "Rerun with --resume auto to continue")
        return last

    def _flush(self) -> None:
        rows = _flush(self.history, self.pending, self.window, self.epoch + self.batches_done / len(self.loader),
                      self.bar, self.info)
        if rows and self.log_lines:
            log_line(progress_line(rows, self.total_steps))
        for cb in self.callbacks:
            cb.on_log(rows)

    def _evaluate(self) -> dict:
        scores = evaluate_all(self.model, self.evals, self.collator, self.device, self.precision,
                              self.cfg.eval_batch_size, self.info)
        self.eval_history.append(_eval_row(self.step, self.epoch, scores))
        self._log(f"eval step {self.step}/{self.total_steps} (epoch {self.epoch + self.batches_done / len(self.loader):.2f}): "
                  f"{summary_line(scores)}")
        for cb in self.callbacks:
            cb.on_evaluate(self.step, self.epoch, scores)
        return scores

    def _log(self, message: str) -> None:
        if self.info.is_main:
            log_line(message) if self.log_lines or self.bar is None else self.bar.write(message)

    # -- preemption -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _stop_on_sigterm(self):
        """SIGTERM sets a flag; the loop finishes its step, checkpoints and raises Preempted."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum, frame):
            if stopped_by_torchrun_after_a_failure():
                # Another rank failed and torchrun is stopping the rest: no checkpoint can follow (that rank is
                # gone), and this one may be blocked in a collective where a flag is never read. Exit now.
                os._exit(128 + signum)
            if not self.stop_requested:
                self.stop_requested, self.stop_requested_at = True, time.monotonic()

        previous = signal.signal(signal.SIGTERM, request_stop)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _should_stop(self) -> bool:
        # Every rank must stop at the same step, and a SIGTERM may reach only some of them (one preempted node):
        # agree after every optimizer step, on the CPU (gloo), so the GPU stream is never synchronised for it.
        return any_rank(self.stop_requested, self.info)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self) -> str | None:
        """Checkpoint the current step (all ranks call this; rank 0 writes)."""
        if not self.checkpoint_root:
            return None
        self._flush()  # the history is complete and a non-finite loss stops us before we save
        rng = all_gather_objects(_rng_state(self.device), self.info)

        def write() -> str:
            state = {"step": self.step, "epoch": self.epoch, "batches_done": self.batches_done,
                     "skipped_steps": self.skipped_steps, "world_size": self.info.world_size,
                     "precision": self.precision, "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "rng": rng,
                     "history": self.history, "eval_history": self.eval_history, "config": self.cfg.to_dict()}
            return save_checkpoint(self.checkpoint_root, self.step, self.model, state, self.cfg.keep_checkpoints)

        return on_main_process(write, self.info)  # a failure on rank 0 stops every rank, not only rank 0

    def resume_from(self, path: str) -> None:
        """Load a checkpoint: weights, optimizer, schedule, scaler, RNG, data position, history."""
        state = load_checkpoint(path, self.model)
        self._check_resumable(path, state)
        self.model.to(self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"][self.info.rank], self.device)
        self.step, self.epoch, self.batches_done = state["step"], state["epoch"], state["batches_done"]
        self.skipped_steps = state.get("skipped_steps", 0)
        self.history, self.eval_history = state["history"], state["eval_history"]
        self._log(f"resumed from {path} at step {self.step}")

    def _check_resumable(self, path: str, state: dict) -> None:
        """Refuse a resume that would silently train another run: changed settings, process count or precision."""
        saved = state["config"]
        changed = [f"{k} ({saved.get(k)!r} -> {getattr(self.cfg, k)!r})" for k in RESUME_CRITICAL
                   if saved.get(k) != getattr(self.cfg, k)]
        if changed:
            raise CheckpointError(f"cannot resume from {path}: {', '.join(changed)} changed since it was written; "
                                  "resume with the same settings or start a new job dir")
        world = state.get("world_size", len(state["rng"]))
        if world != self.info.world_size:
            raise CheckpointError(f"cannot resume from {path}: it was written by {world} process(es) and this run has "
                                  f"{self.info.world_size}; each process's share of the data and its random state "
                                  f"would change. Resume with {world} process(es) (torchrun --nproc-per-node, the "
                                  "same machines), or start a new job dir")
        precision = state.get("precision", self.precision)
        if precision != self.precision:
            raise CheckpointError(f"cannot resume from {path}: it trained in {precision} and this run would train "
                                  f"in {self.precision} (another GPU, or --precision); pass --precision {precision} "
                                  "where the hardware has it, or start a new job dir")

    def _result(self, train_seconds: float) -> TrainResult:
        cfg, info, tokenized = self.cfg, self.info, self.tokenized
        final = {k: v for k, v in self.eval_history[-1].items() if k not in ("step", "epoch")}
        train_tokens = sum(tokenized["train"]["length"])
        metrics = {
            **final,
            "train": {"steps": self.step, "epochs": cfg.epochs, "seconds": train_seconds,
                      "examples_per_s": self.step * cfg.batch_size / train_seconds,
                      "processes": info.world_size, "global_batch": cfg.batch_size,
                      "per_process_batch": batch_split(cfg, info.world_size), "grad_accum_steps": cfg.grad_accum_steps,
                      "skipped_steps": self.skipped_steps,
                      "examples": len(tokenized["train"]), "mean_tokens": train_tokens / len(tokenized["train"]),
                      "final_loss": self.history[-1]["loss"] if self.history else None},
            "majority_baseline": {k: majority_baseline(v["label"]) for k, v in self.evals.items()},
            "precision": self.precision, "device": str(self.device), "parameters": count_parameters(self.model),
            "eval_history": self.eval_history,
        }
        for cb in self.callbacks:
            cb.on_train_end(metrics)
        return TrainResult(self.model, self.tokenizer, cfg, metrics, self.history)


def _rng_state(device: torch.device) -> dict:
    """This process's RNG: the CPU generator and, on a GPU, its own device's (not every visible GPU's)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # checkpoints before 2026-11 kept every visible GPU's state
        cuda = cuda[device.index or 0] if device.type == "cuda" and len(cuda) > (device.index or 0) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)


def stopped_by_torchrun_after_a_failure() -> bool:
    """Under `nli_helpers.launch`, a SIGTERM the launcher did not pass on comes from torchrun stopping the
    surviving ranks after one failed (the launcher marks a preemption before it forwards the signal)."""
    markers = os.environ.get("NLI_PREEMPTED_MARKERS")
    return bool(markers) and not os.path.exists(os.path.join(markers, "launcher-sigterm"))


def train(cfg: TrainConfig, model, tokenizer, tokenized, *, device: torch.device | None = None,
          info: DistInfo = SINGLE_PROCESS, callbacks: Sequence[TrainCallback] = (),
          checkpoint_root: str | None = None, resume_from: str | None = None) -> TrainResult:
    """Fine-tune `model` on `tokenized["train"]`, evaluating on every other split.

    Under torchrun (`info.world_size > 1`) the model is wrapped in DDP; `cfg.batch_size` is the global
    batch, split over the processes, so N processes train on exactly the batches one process would.
    With `checkpoint_root`, checkpoints are written at each epoch end (and every
    `cfg.checkpoint_every` steps); `resume_from` continues a checkpoint exactly.
    """
    loop = TrainingLoop(cfg, model, tokenizer, tokenized, device=device, info=info, callbacks=callbacks,
                        checkpoint_root=checkpoint_root)
    if resume_from:
        loop.resume_from(resume_from)
    return loop.run()


def _flush(history: list[dict], pending: list, window: dict, epoch: float, bar,
           info: DistInfo = SINGLE_PROCESS) -> list[dict]:
    """Turn the losses kept on the device into numbers: one host sync per log interval.

    Under DDP the per-step losses are averaged over ranks (equal shares of one global batch), so the
    logged loss is the global batch's mean loss, never a sum.
    """
    if not pending:
        return []
    losses = all_reduce_sum(torch.stack([p[2] for p in pending]).float(), info) / info.world_size
    losses = losses.cpu().tolist()
    now = time.perf_counter()
    seconds = max(now - window["t"], 1e-9)
    ex_s, tok_s = window["examples"] / seconds, window["tokens"] / seconds
    rows = [{"step": step, "epoch": round(epoch, 4), "loss": loss, "lr": lr}
            for (step, lr, _), loss in zip(pending, losses)]
    rows[-1].update(examples_per_s=ex_s, tokens_per_s=tok_s)
    history.extend(rows)
    if not all(math.isfinite(x) for x in losses):
        bad = next(s for (s, _, _), x in zip(pending, losses) if not math.isfinite(x))
        raise NLIError(f"the training loss became {losses[-1]} at step {bad}; lower --learning_rate "
                       "or use --precision fp32")
    bar.set_postfix(loss=f"{np.mean(losses):.4f}", lr=f"{pending[-1][1]:.2e}", ex_s=f"{ex_s:.1f}")
    pending.clear()
    window.update(t=now, examples=0, tokens=0)
    return rows


def progress_line(rows: list[dict], total_steps: int) -> str:
    """One plain log line for the newest interval: step, epoch, mean loss, lr, throughput."""
    last = rows[-1]
    return (f"step {last['step']}/{total_steps} epoch {last['epoch']:.2f} loss {np.mean([r['loss'] for r in rows]):.4f} "
            f"lr {last['lr']:.2e} {last.get('examples_per_s', 0):.1f} examples/s {last.get('tokens_per_s', 0):.0f} tokens/s")


def _eval_row(step: int, epoch: int, scores: dict) -> dict:
    return {"step": step, "epoch": epoch, **scores}


# -- the whole run: load, train, save ------------------------------------------------------------
def default_job_dir() -> str:
    return os.environ.get("AIP_MODEL_DIR") or f"runs/train-{datetime.now():%Y%m%d-%H%M%S}"


def check_job_dir(job_dir: str) -> None:
    """Fail before training, not after, when the output dir cannot be written."""
    if job_dir.startswith("gs://"):
        # A write and a delete: exactly what roles/storage.objectUser grants, nothing bucket-level.
        from . import storage

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
    """Write model + tokenizer (safetensors), train_config.json, history.jsonl, then metrics.json last.

    metrics.json is written last on purpose: its presence marks a finished run. A gs:// job dir is
    written to a temporary folder first, uploaded, and the folder removed.
    """
    if job_dir.startswith("gs://"):
        from . import storage

        with tempfile.TemporaryDirectory(prefix="nli-run-") as local:
            _write_run(result, Path(local))
            storage.upload(local, job_dir)
    else:
        _write_run(result, Path(job_dir))
    result.output_dir = job_dir
    return job_dir


def _write_run(result: TrainResult, local: Path) -> None:
    local.mkdir(parents=True, exist_ok=True)
    (local / "metrics.json").unlink(missing_ok=True)
    result.model.save_pretrained(local, safe_serialization=True)
    result.tokenizer.save_pretrained(local)
    (local / "train_config.json").write_text(result.config.to_json() + "\n")
    with open(local / "history.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in result.history)
    tmp = local / "metrics.json.tmp"
    tmp.write_text(json.dumps(result.metrics, indent=2) + "\n")
    os.replace(tmp, local / "metrics.json")


def run_training(cfg: TrainConfig, *, verbose: bool = True, callbacks: Sequence[TrainCallback] = ()) -> TrainResult:
    """Load the data and model that `cfg` names, train, evaluate, save to `cfg.job_dir`."""
    check_accelerator(cfg)  # no GPU for a run that needs one: stop before loading anything
    job_dir = cfg.job_dir or default_job_dir()
    check_job_dir(job_dir)
    quiet_library_bars()
    from .tracking import default_callbacks  # TensorBoard; the hypertune report in a tuning trial (imports this module)
    callbacks = [*callbacks, *default_callbacks(cfg, job_dir, given=callbacks)]
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
    # Rank 0 chooses and every rank follows: nodes with their own local checkpoint folders could disagree.
    resume_from = broadcast_from_main(latest_checkpoint(root) if resume == "auto" and info.is_main else None,
                                      info) if resume == "auto" else resume
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
