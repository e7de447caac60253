"""What a run shows and reports: its log (a live bar where someone watches, plain lines where
output is collected), the observers a run calls (`TrainCallback`), and TensorBoard, the observer
`run.run_training` attaches with `--report_to tensorboard`.

    >>> train(cfg, model, tokenizer, tokenized, device=device, precision="bf16",
    ...       callbacks=[TensorBoardCallback("runs/x/tb")])
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from . import distributed as dist
from . import files
from .checkpoint import TrainState
from .config import NLIError, TrainConfig

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

TUNABLE_SCORES = ("accuracy", "macro_f1")  # train.classification_scores per split, to tune on


class TrainCallback:
    """Observers of a run (`tracking.TensorBoardCallback`, Vertex AI's tuning report), called on the
    main process with plain Python values. Override the hooks you need."""

    def on_log(self, rows: list[dict]) -> None:
        """Rows per step since the last log: step, epoch, loss, lr (the last: examples_per_s)."""

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        """Scores per validation split after an evaluation."""

    def on_train_end(self, metrics: dict) -> None:
        """The final metrics, before they are saved."""


def summary_line(split_scores: dict[str, dict]) -> str:
    """`validation_matched acc 0.812 F1 0.809 | ...` for logs."""
    return " | ".join(f"{name} acc {s['accuracy']:.3f} F1 {s['macro_f1']:.3f}"
                      for name, s in split_scores.items())


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


class TensorBoardCallback(TrainCallback):
    """Scalars: train/loss, train/learning_rate, throughput/*, <split>/accuracy and macro_f1.
    Nothing is created before the first log, so a run that fails early leaves no empty log dir. A
    gs:// log dir is written locally and copied there at each evaluation (`files.put`)."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = str(log_dir)
        self.remote = files.is_gcs_uri(self.log_dir)
        self.staging: tempfile.TemporaryDirectory | None = None  # a gs:// log dir's local copy
        self._writer: SummaryWriter | None = None

    @property
    def writer(self) -> SummaryWriter:
        if self._writer is None:
            # Lazy: torch's writer imports the tensorboard package, which task checks for first.
            from torch.utils.tensorboard import SummaryWriter

            if self.remote:
                self.staging = tempfile.TemporaryDirectory(prefix="nli-tensorboard-")
            self._writer = SummaryWriter(self.staging.name if self.remote else self.log_dir,
                                         flush_secs=30)
        return self._writer

    def on_log(self, rows: list[dict]) -> None:
        for row in rows:
            self.writer.add_scalar("train/loss", row["loss"], row["step"])
            self.writer.add_scalar("train/learning_rate", row["lr"], row["step"])
            for key in ("examples_per_s", "tokens_per_s"):
                if key in row:
                    self.writer.add_scalar(f"throughput/{key}", row[key], row["step"])

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        for split, s in scores.items():
            for key in TUNABLE_SCORES:
                self.writer.add_scalar(f"{split}/{key}", s[key], step)
        self.sync()

    def on_train_end(self, metrics: dict) -> None:
        self.sync()
        if self._writer is not None:
            self._writer.close()
        if self.staging is not None:
            self.staging.cleanup()

    def sync(self) -> None:
        if self._writer is None:
            return
        self._writer.flush()
        if self.remote:
            files.put(self.staging.name, self.log_dir)
