"""The training loop, in one function you can read top to bottom: `train`.

    >>> result = train(cfg, model, tokenizer, tokenized, device=device, precision="bf16")

AdamW (no decay on biases and norms), linear warmup then decay, autocast (bf16, or fp16 with
loss scaling), gradient accumulation and clipping, evaluation on every validation split,
checkpoints, and a stop (`should_stop`, a SIGTERM in `run`) that ends in one. Under torchrun the
model is wrapped in DDP; each process takes `per_device_train_batch_size` pairs a micro-batch.
Below the loop: the scores and the log, which calls the run's observers (`TrainCallback`).
`run.run_training` loads, calls `train`, saves.
"""

from __future__ import annotations

import contextlib
import math
import sys
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
from .config import LABELS, ConfigError, NLIError, TrainConfig
from .data import content_hash


class TrainCallback:
    """Observers of a run (`tracking.TensorBoardCallback`, Vertex AI's tuning report), called on the
    main process with plain Python values. Override the hooks you need."""

    def on_log(self, rows: list[dict]) -> None:
        """Rows per step since the last log: step, epoch, loss, lr (the last: examples_per_s)."""

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
    if cfg.torch_compile:  # imported only here: dynamo and inductor load for a compiled run only
        from . import compiled
        before, net = compiled.counters(), compiled.compile_for_training(net, model, device, cfg)
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
    fingerprint = content_hash(tokenized["train"]) if checkpoint_root else None
    state = TrainState(model, optimizer, scheduler, scaler,
                       identity(cfg, info.world_size, precision, fingerprint))
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
            if accumulating:
                continue
            lr = step.optimizer_step(model, optimizer, scheduler, scaler, cfg.max_grad_norm,
                                     keep_grads=cfg.torch_compile)
            if lr is None:  # fp16: a skipped step moves neither the schedule nor the count
                state.skipped_steps += 1
                continue
            state.step += 1
            log.step(state.step, lr, loss.detach() * accum)
            last = state.step >= total_steps
            if state.step % cfg.logging_steps == 0 or last:
                log.flush(state, len(loader))
            if cfg.eval_steps and state.step % cfg.eval_steps == 0 and not last:
                evaluate_now()
            if cfg.save_steps and state.step % cfg.save_steps == 0 and not last:
                checkpoint_now()
            if last:
                break
            # One collective every sync_every steps: every rank stops at the same step, and
            # checkpoints when rank 0's clock says so (each rank's own would at another step).
            if info.enabled and state.step % cfg.sync_every:
                continue
            minutes = (clock() - saved_at) / 60
            due = minutes >= (cfg.checkpoint_every_minutes or math.inf)
            stopping, due = dist.agree_after_step(should_stop(), due, info)
            if stopping:
                stopped = Stopped(state.step, checkpoint_now())
                log.close()
                return TrainResult(model, tokenizer, cfg, {}, state.history, stopped=stopped)
            # Not at the epoch's last step: its epoch-end checkpoint follows the evaluation.
            if due and len(loader) - state.batches_done >= accum:
                if checkpoint_now():
                    log.message(f"checkpoint at step {state.step}: {minutes:.1f} min since "
                                "the last (--checkpoint_every_minutes "
                                f"{cfg.checkpoint_every_minutes:g})")
        state.epoch, state.batches_done = state.epoch + 1, 0
        evaluated = state.eval_history and state.eval_history[-1]["step"] == state.step
        if state.step < total_steps or not evaluated:
            evaluate_now()
        if state.step < total_steps:
            checkpoint_now()
    # A stop after the last agreement (the final steps, the final evaluation): the ranks decide
    # together, since each one's checkpoint_now() joins the others' collectives.
    if dist.agree_after_step(should_stop(), False, info)[0] and checkpoint_now():
        log.message(f"stop requested after the last stop check: checkpoint of step {state.step} "
                    "saved; finishing the run")
    log.close()
    metrics = training_metrics(cfg, info, state, tokenized["train"], evals,
                               time.perf_counter() - start, precision=precision, device=device,
                               model=model)
    if cfg.torch_compile:  # graphs bounded by kinds of shape; growing with the run: a bug
        metrics["train"]["compile"] = compiled.counters(before, loader, len(tokenized["train"]))
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


def summary_line(split_scores: dict[str, dict]) -> str:
    """`validation_matched acc 0.812 F1 0.809 | ...` for logs."""
    return " | ".join(f"{name} acc {s['accuracy']:.3f} F1 {s['macro_f1']:.3f}"
                      for name, s in split_scores.items())


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


# -- logging: losses stay on the device until a log step. A live bar where someone watches (a
# terminal, a Jupyter kernel); plain lines where output is collected (a file, Cloud Logging, which
# stores each line as an entry: a redrawn bar there is noise).
def live_progress(stream=None) -> bool:
    """Whether a redrawn bar can be seen: a terminal, or a Jupyter kernel (tqdm's widget)."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        tty = False
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return tty or (bool(shell) and "IPKernelApp" in getattr(shell, "config", {}))


class TrainLog:
    def __init__(self, cfg: TrainConfig, info: dist.DistInfo, total_steps: int, state: TrainState,
                 callbacks: Sequence[TrainCallback]):
        self.cfg, self.info, self.total_steps = cfg, info, total_steps
        self.callbacks = list(callbacks) if info.is_main else []
        self.pending: list[tuple[int, float, torch.Tensor]] = []  # (step, lr, loss on the device)
        self.window = {"t": time.perf_counter(), "examples": 0, "tokens": 0}
        self.lines = cfg.progress and info.is_main and not live_progress()
        hidden = not (cfg.progress and info.is_main) or self.lines
        self.bar = tqdm(total=total_steps, initial=state.step, desc="train", unit="step",
                        dynamic_ncols=True, disable=hidden)

    def count(self, batch) -> None:
        self.window["examples"] += len(batch["labels"]) * self.info.world_size
        tokens = int(batch["attention_mask"].numpy().sum())  # the collated CPU copy: no sync
        self.window["tokens"] += tokens * self.info.world_size

    def step(self, step: int, lr: float, loss: torch.Tensor) -> None:
        self.pending.append((step, lr, loss))
        self.bar.update(1)

    def flush(self, state: TrainState, batches_per_epoch: int) -> None:
        """The losses kept on the device become numbers: one host sync per log interval. Under DDP
        each step's loss is the mean over ranks (equal shares of one global batch), never a sum."""
        if not self.pending:
            return
        stacked = torch.stack([p[2] for p in self.pending]).float()
        losses = (dist.all_reduce_sum(stacked, self.info) / self.info.world_size).cpu().tolist()
        now = time.perf_counter()
        seconds = max(now - self.window["t"], 1e-9)
        epoch = round(state.epoch + state.batches_done / batches_per_epoch, 4)
        rows = [{"step": step, "epoch": epoch, "loss": loss, "lr": lr}
                for (step, lr, _), loss in zip(self.pending, losses)]
        rows[-1].update(examples_per_s=self.window["examples"] / seconds,
                        tokens_per_s=self.window["tokens"] / seconds)
        state.history.extend(rows)
        self.pending.clear()
        self.window.update(t=now, examples=0, tokens=0)
        bad = next((row["step"] for row in rows if not math.isfinite(row["loss"])), None)
        if bad is not None:
            raise NLIError(f"the training loss became {rows[-1]['loss']} at step {bad}; lower "
                           "--learning_rate or use --precision fp32")
        self.bar.set_postfix(loss=f"{np.mean(losses):.4f}", lr=f"{rows[-1]['lr']:.2e}",
                             ex_s=f"{rows[-1]['examples_per_s']:.1f}")
        if self.lines:
            print(progress_line(rows, self.total_steps, seconds), flush=True)  # flushed
        for callback in self.callbacks:
            callback.on_log(rows)

    def evaluated(self, state: TrainState, batches_per_epoch: int, scores: dict) -> None:
        epoch = state.epoch + state.batches_done / batches_per_epoch
        self.message(f"eval step {state.step}/{self.total_steps} (epoch {epoch:.2f}): "
                     f"{summary_line(scores)}")
        for callback in self.callbacks:
            callback.on_evaluate(state.step, state.epoch, scores)

    def message(self, text: str) -> None:
        if self.info.is_main:
            print(text, flush=True) if self.lines or self.bar.disable else self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


def progress_line(rows: list[dict], total_steps: int, seconds: float = 0.0) -> str:
    """One plain log line for the newest interval (`seconds` long): step, epoch, mean loss, lr,
    throughput, and the time left at this interval's pace."""
    last, loss = rows[-1], np.mean([r["loss"] for r in rows])
    left = seconds / len(rows) * (total_steps - last["step"]) / 60
    return (f"step {last['step']}/{total_steps} epoch {last['epoch']:.2f} loss {loss:.4f} "
            f"lr {last['lr']:.2e} {last.get('examples_per_s', 0):.1f} examples/s "
            f"{last.get('tokens_per_s', 0):.0f} tokens/s {left:.1f} min to go")
