"""The training loop, in one function you can read top to bottom: `train`.

    >>> result = train(cfg, model, tokenizer, tokenized, device=device, precision="bf16")

AdamW (no decay on biases and norms), linear warmup then decay, autocast (bf16, or fp16 with
loss scaling), gradient accumulation and clipping, evaluation on every validation split,
checkpoints, and a stop (`should_stop`, a SIGTERM in `run`) that ends in one. Under torchrun the
model is wrapped in DDP; each process takes `per_device_train_batch_size` pairs a micro-batch.
Below the loop: the scores and what metrics.json holds; the log and the run's observers are in
`tracking`. `run.run_training` loads, calls `train`, saves.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from . import distributed as dist
from . import step
from .checkpoint import TrainState, identity, resume_training, save_training
from .config import LABELS, ConfigError, TrainConfig
from .tracking import TrainCallback, TrainLog, live_progress


@dataclass
class TrainResult:
    model: torch.nn.Module
    tokenizer: object
    config: TrainConfig
    metrics: dict
    history: list[dict] = field(default_factory=list)
    output_dir: str | None = None
    stopped: Stopped | None = None  # set when should_stop() ended the run early


@dataclass
class Stopped:
    """A run that `should_stop` ended: after which step, and its checkpoint (None: none kept).
    The one shape of a stopped run: `train` returns it in `TrainResult.stopped`, `run` says why in
    `message`, and the command maps it to its exit code (`task.Platform.stopped`)."""

    step: int
    checkpoint: str | None
    message: str = ""


def train(cfg: TrainConfig, model, tokenizer, tokenized, *, device: torch.device, precision: str,
          info: dist.DistInfo = dist.SINGLE_PROCESS, callbacks: Sequence[TrainCallback] = (),
          checkpoint_root: str | None = None, resume_from: str | None = None,
          clock: Callable[[], float] = time.monotonic,
          should_stop: Callable[[], bool] = lambda: False) -> TrainResult:
    """Fine-tune `model` on `device` in `precision` (`dist.resolve_precision`'s), evaluating on
    every other split; the caller seeded the RNG before loading the model (`run._train_and_save`).
    Checkpoints go under `checkpoint_root`: at each epoch end, every `cfg.save_steps` steps, and
    once `cfg.checkpoint_every_minutes` have passed on `clock`. When `should_stop()` (a SIGTERM, in
    `run`) turns true, the loop checkpoints and returns with `result.stopped` set, no metrics.
    `resume_from` continues a checkpoint."""
    model.to(device).train()
    net = dist.wrap_ddp(model, device, info, cfg) if info.enabled else model
    if cfg.torch_compile:  # dynamo and inductor load for a compiled run only
        before = step.counters()
        net = step.compile_for_training(net, model, device, cfg)
    loader = step.make_train_loader(tokenized["train"], cfg, tokenizer, device,
                                    num_replicas=info.world_size, rank=info.rank)
    accum = cfg.gradient_accumulation_steps
    if len(loader) < accum:  # no optimizer step would ever be taken
        raise ConfigError(f"gradient_accumulation_steps={accum} is more than the {len(loader)} "
                          f"micro-batch(es) of an epoch here ({len(tokenized['train'])} training "
                          f"pairs, per_device_train_batch_size={cfg.per_device_train_batch_size}):"
                          " lower gradient_accumulation_steps, or use more data")
    total_steps = max(1, math.ceil(cfg.num_train_epochs * (len(loader) // accum)))
    optimizer = step.build_optimizer(model, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps),
                                                total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    evals = {name: split for name, split in tokenized.items() if name != "train"}
    state = TrainState(model, optimizer, scheduler, scaler,
                       identity(cfg, info.world_size, precision,
                                tokenized["train"] if checkpoint_root else None))
    if resume_from:
        resume_training(state, resume_from, info, device)
    log = TrainLog(cfg, info, total_steps, state, callbacks)
    saved_at = clock()  # the last checkpoint (or the start), for checkpoint_every_minutes
    if resume_from:
        log.message(f"resumed from {resume_from} at step {state.step}")

    def evaluate_now() -> None:
        scores = {name: score_split(model, split, tokenizer, device, precision,
                                    cfg.per_device_eval_batch_size, info)
                  for name, split in evals.items()}
        state.eval_history.append({"step": state.step, "epoch": state.epoch, **scores})
        log.evaluated(state, len(loader), scores)

    def checkpoint_now() -> str | None:
        nonlocal saved_at
        if not checkpoint_root or cfg.save_total_limit < 1:
            return None
        saved_at = clock()
        # A step is saved once (save_steps at an epoch's end would write it twice): replacing a
        # complete checkpoint would leave none while the copy runs.
        if state.checkpoint and state.checkpoint[0] == state.step:
            return state.checkpoint[1]
        log.flush(state, len(loader))  # a complete history; a non-finite loss stops before a save
        return save_training(state, checkpoint_root, cfg.save_total_limit, tokenizer, info, device)

    start = time.perf_counter()
    while state.step < total_steps:
        loader.batch_sampler.set_epoch(state.epoch, skip_batches=state.batches_done)
        # No leftover micro-batch gradients across epochs (a compiled step's buffers stay in place).
        optimizer.zero_grad(set_to_none=not cfg.torch_compile)
        for batch in loader:
            state.batches_done += 1
            log.count(batch)
            accumulating = state.batches_done % accum != 0
            # DDP all-reduces gradients on every backward unless told not to: only on the last.
            with net.no_sync() if info.enabled and accumulating else contextlib.nullcontext():
                with dist.autocast(precision, device):
                    inputs = step.model_inputs(batch, device, model, keep_mask=cfg.torch_compile)
                    loss = net(**inputs).loss / accum
                scaler.scale(loss).backward()
            stepped = False
            if not accumulating:
                lr = step.optimizer_step(model, optimizer, scheduler, scaler, cfg.max_grad_norm,
                                         keep_grads=cfg.torch_compile)
                stepped = lr is not None
                if not stepped:  # fp16: a skipped step moves neither the schedule nor the count
                    state.skipped_steps += 1
            if stepped:
                state.step += 1
                log.step(state.step, lr, loss.detach() * accum)
            last = state.step >= total_steps
            epoch_done = state.batches_done == len(loader)  # leftover micro-batches included
            if not (stepped or epoch_done):
                continue
            if epoch_done:
                state.epoch, state.batches_done = state.epoch + 1, 0
            if stepped and (state.step % cfg.logging_steps == 0 or last):
                log.flush(state, len(loader))
            if epoch_done or last or (cfg.eval_steps and state.step % cfg.eval_steps == 0):
                evaluate_now()
            # The ranks agree every sync_every steps, at each epoch's end and at the last step:
            # whether any was told to stop (a SIGTERM may reach one first), and whether rank 0's
            # clock says a checkpoint is due (each rank's own would say so at another step).
            stopping = due = False
            if not info.enabled or state.step % cfg.sync_every == 0 or epoch_done or last:
                minutes = (clock() - saved_at) / 60
                due = minutes >= (cfg.checkpoint_every_minutes or math.inf)
                stopping, due = dist.agree_after_step(should_stop(), due, info)
            # The one decision to checkpoint: to stop, at an epoch's end, every save_steps steps,
            # or when due; after the last step only to stop (then the run still finishes: its
            # final save follows).
            saving = cfg.save_steps and state.step % cfg.save_steps == 0
            if stopping or (not last and (epoch_done or saving or due)):
                path = checkpoint_now()
                if stopping and not last:
                    log.close()
                    return TrainResult(model, tokenizer, cfg, {}, state.history,
                                       stopped=Stopped(state.step, path))
                if stopping and path:
                    log.message(f"stop requested at the last step: checkpoint of step "
                                f"{state.step} saved; finishing the run")
                elif due and path and not (epoch_done or saving):
                    log.message(f"checkpoint at step {state.step}: {minutes:.1f} min since "
                                "the last (--checkpoint_every_minutes "
                                f"{cfg.checkpoint_every_minutes:g})")
            if last:
                break
    log.close()
    metrics = training_metrics(cfg, info, state, tokenized["train"], evals,
                               time.perf_counter() - start, precision=precision, device=device,
                               model=model)
    if cfg.torch_compile:  # graphs bounded by kinds of shape; growing with the run: a bug
        metrics["train"]["compile"] = step.counters(before, loader, len(tokenized["train"]))
    for callback in log.callbacks:
        callback.on_train_end(metrics)
    return TrainResult(model, tokenizer, cfg, metrics, state.history)


# -- evaluation and scores ------------------------------------------------------------------------
@torch.inference_mode()
def score_split(model, dataset, tokenizer, device: torch.device, precision: str = "fp32",
                batch_size: int = 128, info: dist.DistInfo = dist.SINGLE_PROCESS) -> dict:
    """Scores on a tokenised split. Batches go in length order (less padding) and predictions back
    in place; under DDP each rank predicts an interleaved share and the shares are gathered, so
    every example counts exactly once."""
    was_training = model.training
    model.eval()
    order = np.argsort(np.asarray(dataset["length"]), kind="stable")[info.rank::info.world_size]
    batches = [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    loader = torch.utils.data.DataLoader(
        step.model_columns(dataset, tokenizer).remove_columns("label"), batch_sampler=batches,
        collate_fn=step.collator(tokenizer))
    preds = np.full(len(dataset), -1, dtype=np.int64)
    for idx, inputs in zip(batches, tqdm(loader, desc="evaluate", leave=False,
                                         disable=not live_progress() or len(batches) < 2)):
        with dist.autocast(precision, device):
            logits = model(**step.model_inputs(inputs, device, model)).logits
        preds[idx] = logits.argmax(-1).cpu().numpy()
    if info.enabled:
        for rank_order, rank_preds in dist.all_gather_objects((order, preds[order]), info):
            preds[rank_order] = rank_preds
    assert (preds >= 0).all(), "every example is predicted exactly once"
    genres = dataset["genre"] if "genre" in dataset.column_names else None
    model.train(was_training)
    return classification_scores(np.asarray(dataset["label"]), preds, genres)


def classification_scores(labels: Sequence[int], preds: Sequence[int],
                          genres: Sequence[str] | None = None) -> dict:
    """Accuracy, macro-F1, per-class scores, confusion matrix (and per-genre accuracy), as JSON:
    scikit-learn's, with a class never predicted or absent scoring 0."""
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    labels, preds, ids = np.asarray(labels), np.asarray(preds), list(range(len(LABELS)))
    if labels.shape != preds.shape:
        raise ValueError(f"labels {labels.shape} and predictions {preds.shape} differ in length")
    precision, recall, f1, support = precision_recall_fscore_support(labels, preds, labels=ids,
                                                                     zero_division=0)
    scores = {
        "n": int(labels.size),
        "accuracy": float((labels == preds).mean()) if labels.size else 0.0,
        "macro_f1": float(f1.mean()),
        "per_class": {name: {"precision": float(precision[i]), "recall": float(recall[i]),
                             "f1": float(f1[i]), "support": int(support[i])}
                      for i, name in enumerate(LABELS)},
        "confusion_matrix": confusion_matrix(labels, preds, labels=ids).tolist(),  # rows: gold
    }
    if genres is not None:
        scores["per_genre"] = per_genre_accuracy(labels, preds, genres)
    return scores


def per_genre_accuracy(labels: Sequence[int], preds: Sequence[int], genres: Sequence[str]) -> dict:
    hits = pd.Series(np.asarray(labels) == np.asarray(preds)).groupby(np.asarray(genres))
    return {g: {"accuracy": float(h.mean()), "n": int(h.size)} for g, h in hits}


def majority_baseline(labels: Sequence[int]) -> float:
    """Accuracy of always predicting the most frequent label: the floor a model must beat."""
    counts = np.bincount(np.asarray(labels), minlength=len(LABELS))
    return float(counts.max() / counts.sum()) if counts.sum() else 0.0


def global_batch(cfg: TrainConfig, world_size: int) -> int:
    """Pairs per optimizer step over all processes."""
    return cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * world_size


def training_metrics(cfg: TrainConfig, info: dist.DistInfo, state: TrainState, train_split,
                     evals: dict, seconds: float, *, precision: str, device: torch.device,
                     model) -> dict:
    """What metrics.json holds: the final scores per split, how training went, the baselines."""
    final = {k: v for k, v in state.eval_history[-1].items() if k not in ("step", "epoch")}
    batch = global_batch(cfg, info.world_size)
    run = {"steps": state.step, "epochs": cfg.num_train_epochs, "seconds": seconds,
           "examples_per_s": state.step * batch / seconds, "processes": info.world_size,
           "global_batch": batch, "per_process_batch": cfg.per_device_train_batch_size,
           "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
           "skipped_steps": state.skipped_steps,
           "examples": len(train_split),
           "mean_tokens": sum(train_split["length"]) / len(train_split),
           "final_loss": state.history[-1]["loss"] if state.history else None}
    return {**final, "train": run,
            "majority_baseline": {name: majority_baseline(s["label"]) for name, s in evals.items()},
            "precision": precision, "device": str(device),
            "parameters": sum(p.numel() for p in model.parameters()),
            "eval_history": state.eval_history}
