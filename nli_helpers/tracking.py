"""Watch a run while it trains: TensorBoard scalars and the metric a Vertex AI tuning trial reports.

Two `TrainCallback`s, which `run_training` attaches through `default_callbacks(cfg, job_dir)`:

* `TensorBoardCallback(log_dir)`: loss, learning rate and throughput per log interval, accuracy and
  macro-F1 per validation split per evaluation. The log dir is `$AIP_TENSORBOARD_LOG_DIR` on
  Vertex AI, else `<job_dir>/tensorboard`; a gs:// one is written locally and uploaded.
* `HypertuneCallback(metric)`: in a tuning trial (`$CLOUD_ML_TRIAL_ID` set) or when
  `cfg.hypertune_metric` asks, reports a validation metric through Google's `cloudml-hypertune`,
  which writes it to `$CLOUD_ML_HP_METRIC_FILE` (default /tmp/hypertune/output.metrics) for
  Vertex AI to read. The metric id is the tuning job's `metric_spec` key; the legacy AI Platform's
  `$CLOUD_ML_HP_METRIC_TAG` is used when no `hypertune_metric` is given.

A callback of the same kind that you pass yourself replaces the default one:

    >>> run_training(cfg, callbacks=[TensorBoardCallback("gs://my-bucket/tb/run-1")])
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import storage
from .config import ConfigError, TrainConfig
from .train import TrainCallback

log = logging.getLogger(__name__)

# The environment of a Vertex AI (and AI Platform) tuning trial.
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
METRIC_TAG_ENV = "CLOUD_ML_HP_METRIC_TAG"
TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"
# Scores the loop computes per split (metrics.classification_scores) that tuning may optimise.
TUNABLE_SCORES = ("accuracy", "macro_f1")
DEFAULT_HYPERTUNE_METRIC = "validation_matched_accuracy"


# -- the metric a tuning trial reports -------------------------------------------------------------
def parse_hypertune_metric(metric: str) -> tuple[str, str]:
    """`validation_matched_accuracy` -> ("validation_matched", "accuracy"). A test split is refused:
    a score it chose hyperparameters on would no longer estimate new data."""
    score = next((s for s in TUNABLE_SCORES if metric.endswith("_" + s)), None)
    if score is None:
        raise ConfigError(f"hypertune metric {metric!r} must be <split>_<score> with score one "
                          f"of {', '.join(TUNABLE_SCORES)}, e.g. {DEFAULT_HYPERTUNE_METRIC}")
    split = metric[: -len(score) - 1]
    if not split.startswith("validation"):
        raise ConfigError(f"hypertune metric {metric!r} is measured on split {split!r}: tuning "
                          "must choose on a validation split (validation_matched or "
                          "validation_mismatched), never on a test split, whose score would then "
                          "no longer estimate new data")
    return split, score


def in_tuning_trial(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(TRIAL_ID_ENV))


class HypertuneCallback(TrainCallback):
    """Report one validation metric to Vertex AI hyperparameter tuning after every evaluation."""

    def __init__(self, metric: str = DEFAULT_HYPERTUNE_METRIC):
        import hypertune

        self.metric = metric
        self.split, self.score = parse_hypertune_metric(metric)  # fails before training, not after
        self.reporter = hypertune.HyperTune()
        self.path = Path(self.reporter.metric_path)

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        if self.split not in scores:
            raise ConfigError(f"hypertune metric {self.metric!r} needs split {self.split!r}, but "
                              f"this run evaluates only {', '.join(scores)}; pick one of those")
        self.report(scores[self.split][self.score], step)

    def report(self, value: float, step: int) -> None:
        self.reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric, metric_value=value, global_step=step)


def read_metric_file(path: str | Path, metric: str | None = None) -> list[dict]:
    """The reports in a hypertune metric file: [{"step", "value", "metric", "trial"}], oldest
    first."""
    rows = []
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        tags = [k for k in entry
                if k not in ("timestamp", "trial", "global_step", "checkpoint_path")]
        for tag in tags if metric is None else [t for t in tags if t == metric]:
            rows.append({"metric": tag, "value": float(entry[tag]),
                         "step": int(entry["global_step"]), "trial": entry["trial"],
                         "timestamp": entry["timestamp"]})
    return rows


# -- TensorBoard -----------------------------------------------------------------------------------
def tensorboard_available() -> bool:
    """torch.utils.tensorboard needs the `tensorboard` package."""
    return importlib.util.find_spec("tensorboard") is not None


def tensorboard_log_dir(job_dir: str, env: Mapping[str, str] | None = None) -> str:
    """`$AIP_TENSORBOARD_LOG_DIR` on Vertex AI (a Vertex TensorBoard reads it), else
    `<job_dir>/tensorboard`."""
    env = os.environ if env is None else env
    return env.get(TENSORBOARD_ENV) or f"{str(job_dir).rstrip('/')}/tensorboard"


class TensorBoardCallback(TrainCallback):
    """Scalars: train/loss, train/learning_rate, throughput/*, <split>/accuracy and macro_f1.
    Nothing is created until the first log, so a run that fails early leaves no empty log dir."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = str(log_dir)
        self.remote = storage.is_gcs_uri(self.log_dir)
        self.staging: tempfile.TemporaryDirectory | None = None  # a gs:// log dir's local copy
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
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
        self.close()

    def sync(self) -> None:
        """Flush to disk and, for a gs:// log dir, upload what is there."""
        if self._writer is None:
            return
        self._writer.flush()
        if self.remote:
            storage.upload(self.staging.name, self.log_dir)

    def close(self) -> None:
        self.sync()
        if self._writer is not None:
            self._writer.close()
        if self.staging is not None:
            self.staging.cleanup()


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a local TensorBoard log dir: {tag: [(step, value), ...]}, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# -- what the trainer command attaches -------------------------------------------------------------
def default_callbacks(cfg: TrainConfig, job_dir: str, *, given: Sequence[TrainCallback] = (),
                      env: Mapping[str, str] | None = None) -> list[TrainCallback]:
    """TensorBoard (when installed) and, in a tuning trial or when asked, the hypertune report;
    not a kind already in `given`."""
    env = os.environ if env is None else env
    out: list[TrainCallback] = []
    if not any(isinstance(c, TensorBoardCallback) for c in given):
        if tensorboard_available():
            out.append(TensorBoardCallback(tensorboard_log_dir(job_dir, env)))
        else:
            log.warning("tensorboard is not installed: no TensorBoard logs "
                        "(pip install tensorboard)")
    metric = cfg.hypertune_metric
    if ((metric or in_tuning_trial(env))
            and not any(isinstance(c, HypertuneCallback) for c in given)):
        out.append(HypertuneCallback(metric or env.get(METRIC_TAG_ENV) or DEFAULT_HYPERTUNE_METRIC))
    return out
