"""TensorBoard for a run: the observer `run.run_training` attaches by default.

    >>> train(cfg, model, tokenizer, tokenized, callbacks=[TensorBoardCallback("runs/x/tb")])
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import files
from .train import TrainCallback

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

TUNABLE_SCORES = ("accuracy", "macro_f1")  # per-split scores (classification_scores) to tune on


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
