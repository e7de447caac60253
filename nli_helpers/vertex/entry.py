"""What the trainer image runs on Vertex AI: the trainer command (`nli_helpers.task`) with Vertex
AI's side of a job wired in. It is the image's ENTRYPOINT, and what `vertex.launch` starts on
every process under torchrun.

    python -m nli_helpers.vertex.entry --profile full        # the flags of nli_helpers.task

What Vertex AI adds (each name spelled once, in `environment`):
- the run folder from AIP_MODEL_DIR and checkpoints in AIP_CHECKPOINT_DIR; with that set, a run
  resumes (`--resume_from_checkpoint auto`): Vertex AI restarts a replica with the same command;
- in a tuning trial, an --output_dir or --checkpoint_dir the args name gets `trial-<id>` appended:
  parallel trials never share a folder, nor resume one another's checkpoints;
- TensorBoard into AIP_TENSORBOARD_LOG_DIR; in a tuning trial (CLOUD_ML_TRIAL_ID or CLUSTER_SPEC's
  task.trial), or with `--tuning_metric`, the metric reported through cloudml-hypertune after
  every evaluation;
- a replica whose pool asked for GPUs (CLUSTER_SPEC) and sees none stops before loading anything;
- a SIGTERM that left a checkpoint exits 134, a code Vertex AI retries, when Compute Engine says
  the VM is being preempted or maintained, else 143 (a cancel, a timeout: never retried); under
  `vertex.launch`, a SIGTERM that torchrun sends after another rank failed exits at once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

from .environment import (
    CHECKPOINT_DIR_ENV,
    CLUSTER_SPEC_ENV,
    METRIC_TAG_ENV,
    MODEL_DIR_ENV,
    PERMANENT_STOP_EXIT_CODE,
    RESTARTABLE_EXIT_CODE,
    TENSORBOARD_ENV,
    TRIAL_ID_ENV,
    ClusterSpec,
    exit_before_training,
    stopped_by_torchrun_after_a_failure,
    stopped_code,
)

if __name__ == "__main__":  # first thing: the imports below take seconds
    signal.signal(signal.SIGTERM, exit_before_training)

import dataclasses  # the trainer's imports, after the handler (pyproject.toml: E402 here)
import functools
import sys

import hypertune

from nli_helpers import files
from nli_helpers.config import QUIET_LOG_LEVELS, ConfigError, TrainConfig
from nli_helpers.distributed import check_accelerator
from nli_helpers.task import Platform, command
from nli_helpers.tracking import TUNABLE_SCORES, TensorBoardCallback, TrainCallback
from nli_helpers.train import Stopped

DEFAULT_HYPERTUNE_METRIC = "validation_matched_accuracy"


# -- before the run: defaults from the environment, and the replica's GPUs ---------------
def configure(cfg: TrainConfig, env: Mapping[str, str] = os.environ) -> TrainConfig:
    """The flags, with what Vertex AI's environment gives where they left a field unset; stops a
    replica without the GPUs its pool asked for (`distributed.check_accelerator`)."""
    spec = ClusterSpec.parse(env.get(CLUSTER_SPEC_ENV))
    check_accelerator(cfg, asked=replica_gpus(spec))
    checkpoints = env.get(CHECKPOINT_DIR_ENV)
    quiet = cfg.log_level in QUIET_LOG_LEVELS
    # A tuning trial: CLOUD_ML_TRIAL_ID (cloudml-hypertune reads it), or CLUSTER_SPEC's task.trial.
    trial = env.get(TRIAL_ID_ENV) or (spec and spec.trial)
    if trial:  # Vertex AI gives each trial its own AIP_* folders; a folder the args name is shared
        own = {name: files.join(folder, f"trial-{trial}")
               for name in ("output_dir", "checkpoint_dir") if (folder := getattr(cfg, name))}
        # It reports the metric the flags name, else the legacy tag's, else the default.
        cfg = dataclasses.replace(cfg, **own, tuning_metric=cfg.tuning_metric or env.get(
            METRIC_TAG_ENV) or DEFAULT_HYPERTUNE_METRIC)
        if own and env.get("RANK", "0") == "0" and not quiet:
            print(f"tuning trial {trial}: " + ", ".join(f"--{k} {v}" for k, v in own.items())
                  + " (parallel trials never share a folder)")
    # With AIP_CHECKPOINT_DIR set, a replica Vertex AI restarts continues instead of starting over.
    resume = cfg.resume_from_checkpoint or ("auto" if checkpoints else None)
    cfg = dataclasses.replace(cfg, output_dir=cfg.output_dir or env.get(MODEL_DIR_ENV),
                              checkpoint_dir=cfg.checkpoint_dir or checkpoints,
                              resume_from_checkpoint=resume)
    if checkpoints and resume == "auto" and env.get("RANK", "0") == "0" and not quiet:
        print(f"{CHECKPOINT_DIR_ENV} is set (Vertex AI): resuming from the newest complete "
              f"checkpoint in {cfg.checkpoint_dir}, if any")
    return cfg


def replica_gpus(spec: ClusterSpec | None) -> str | None:
    """The GPUs ("1 x NVIDIA_L4") this replica's worker pool asked for in CLUSTER_SPEC's job, None
    off Vertex AI or without GPUs. A job it cannot read turns the guard off, and says so."""
    if spec is None:
        return None
    try:
        pool = spec.job["worker_pool_specs"][int(spec.pool.removeprefix("workerpool"))]
        machine = pool["machine_spec"]
        count = int(machine.get("accelerator_count") or 0)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        print(f"warning: cannot read this replica's GPUs from CLUSTER_SPEC's job "
              f"({type(e).__name__}: {e}), so a replica that sees no GPU is not stopped",
              file=sys.stderr)
        return None
    return f"{count} x {machine.get('accelerator_type', 'GPU')}" if count else None


# -- during the run: Vertex AI's observers ---------------------------------------------------------
def callbacks(cfg: TrainConfig, env: Mapping[str, str] = os.environ) -> list[TrainCallback]:
    """TensorBoard where Vertex AI reads it, and the tuning metric's report (`configure` sets it
    in a trial)."""
    out: list[TrainCallback] = []
    if env.get(TENSORBOARD_ENV):
        out.append(TensorBoardCallback(env[TENSORBOARD_ENV]))
    if cfg.tuning_metric:
        out.append(HypertuneCallback(cfg.tuning_metric))
    return out


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


class HypertuneCallback(TrainCallback):
    """After every evaluation, report one validation metric through Google's `cloudml-hypertune`,
    which writes it to $CLOUD_ML_HP_METRIC_FILE for Vertex AI tuning to read."""

    def __init__(self, metric: str = DEFAULT_HYPERTUNE_METRIC):
        self.metric = metric
        self.split, self.score = parse_hypertune_metric(metric)  # fails before training, not after

    @functools.cached_property
    def reporter(self) -> hypertune.HyperTune:
        """Made at the first report, so on the main process only: `HyperTune()` creates the metric
        file's folder with `os.makedirs` and no `exist_ok`, and every rank of a multi-GPU trial
        builds this callback, so ranks making it at once could crash the trial's start."""
        return hypertune.HyperTune()

    @property
    def path(self) -> Path:
        return Path(self.reporter.metric_path)

    def on_evaluate(self, step: int, epoch: int, scores: dict[str, dict]) -> None:
        if self.split not in scores:
            raise ConfigError(f"hypertune metric {self.metric!r} needs split {self.split!r}, but "
                              f"this run evaluates only {', '.join(scores)}; pick one of those")
        self.reporter.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric, metric_value=scores[self.split][self.score],
            global_step=step)


# -- after a SIGTERM: the exit code Vertex AI reads ----------------------------------------------
def stopped_exit(stopped: Stopped, env: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """`stopped_code`'s, once a checkpoint is saved; 143 (not retried) without one."""
    if stopped.checkpoint is None:
        return PERMANENT_STOP_EXIT_CODE, ", an exit Vertex AI does not retry"
    code, why = stopped_code(env)
    return code, why + ("; the restarted job resumes" if code == RESTARTABLE_EXIT_CODE else
                        "; rerun with --resume_from_checkpoint auto to continue")


VERTEX_AI = Platform(configure=configure, callbacks=callbacks, stopped=stopped_exit,
                     exit_on_sigterm=stopped_by_torchrun_after_a_failure)

if __name__ == "__main__":
    command(VERTEX_AI)
