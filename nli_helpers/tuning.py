"""Tune hyperparameters with a Vertex AI hyperparameter-tuning job whose trials run the trainer image.

The search space is a dict of `TrainConfig` fields to the SDK's own parameter specs
(`google.cloud.aiplatform.hyperparameter_tuning`); each trial runs the pools `nli_helpers.vertex` builds and
reports the chosen validation metric after every evaluation (`nli_helpers.tracking.HypertuneCallback`):

    >>> from google.cloud.aiplatform import hyperparameter_tuning as hpt
    >>> space = {"learning_rate": hpt.DoubleParameterSpec(min=1e-5, max=1e-4, scale="log"),
    ...          "batch_size": hpt.DiscreteParameterSpec(values=[16, 32], scale="linear")}
    >>> job = build_tuning_job(cfg, machine, space, image_uri=..., base_output_dir="gs://BUCKET/hp/1")
    >>> job = submit_tuning_job(job)                  # returns at once; vertex.watch_job(job) waits
    >>> results = tuning_results(job); sweep.best_trial(results); plots.tuning_results(results)

The metric is always a validation split's score (`validation_matched_accuracy` by default), never a test
split's: tuning on a test split would make its score an optimistic estimate. A sweep on this machine instead
of on Vertex AI: `nli_helpers.sweep.local_sweep`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from google.cloud.aiplatform import hyperparameter_tuning as hpt

from . import vertex
from .config import ConfigError, TrainConfig
from .tracking import DEFAULT_HYPERTUNE_METRIC, parse_hypertune_metric

GOALS = ("maximize", "minimize")
# Fields a search may not vary: where the run writes, what it reports, how it is shown.
NOT_SEARCHABLE = ("profile", "job_dir", "checkpoint_dir", "resume", "hypertune_metric", "progress", "data",
                  "allow_cpu")
FIELD_NAMES = set(TrainConfig.field_names())
SCALES = ("linear", "log", "reverse_log")
RANGES = (hpt.DoubleParameterSpec, hpt.IntegerParameterSpec)
# Which field types each spec fits.
FITS = {hpt.DoubleParameterSpec: (float,), hpt.IntegerParameterSpec: (int, float),
        hpt.DiscreteParameterSpec: (int, float), hpt.CategoricalParameterSpec: (str,)}


# -- the search space ---------------------------------------------------------------------------------------
def validate_search_space(space: Mapping[str, Any], base: TrainConfig | None = None) -> None:
    """Raise one ConfigError naming every problem: unknown or unsearchable fields, specs of the wrong type, and
    values that would make an invalid TrainConfig (checked at each range's ends and every listed value)."""
    base = base or TrainConfig(profile="smoke")
    problems = []
    for name, spec in space.items():
        if name not in FIELD_NAMES:
            problems.append(f"{name!r} is not a TrainConfig field (known: {', '.join(TrainConfig.field_names())})")
        elif name in NOT_SEARCHABLE:
            problems.append(f"{name!r} cannot be searched: it says where or how a run writes, not how it trains")
        else:
            problems += [f"{name}: {p}" for p in _spec_problems(name, spec, base)]
    if not space:
        problems.append("the search space is empty: name at least one TrainConfig field")
    if problems:
        raise ConfigError("invalid search space:\n  - " + "\n  - ".join(problems))


def _spec_problems(name: str, spec, base: TrainConfig) -> list[str]:
    kind = TrainConfig.field_type(name)
    if type(spec) not in FITS or kind not in FITS[type(spec)]:
        return [f"a {type(spec).__name__} does not fit a {kind.__name__} field"]
    if isinstance(spec, RANGES):
        if spec.scale not in SCALES:
            return [f"scale {spec.scale!r} is unknown; use one of {', '.join(SCALES)}"]
        if not spec.min < spec.max:
            return [f"min {spec.min} must be below max {spec.max}"]
        if spec.scale != "linear" and spec.min <= 0:
            return [f"a {spec.scale} scale needs min > 0 (got {spec.min})"]
    elif not spec.values:
        return ["no values to choose from"]
    elif isinstance(spec, hpt.DiscreteParameterSpec) and (repeated := _close_values(spec.values)):
        return [f"values {', '.join(map(repr, repeated))} repeat: Vertex AI wants distinct values, in increasing "
                "order and at least 1e-10 apart (StudySpec DiscreteValueSpec); list each value once"]
    elif isinstance(spec, hpt.CategoricalParameterSpec) and len(set(spec.values)) < len(spec.values):
        return [f"values {sorted({v for v in spec.values if list(spec.values).count(v) > 1})} repeat: list each "
                "category once"]
    values = [spec.min, spec.max] if isinstance(spec, RANGES) else list(spec.values)
    if kind is int and any(float(v) != int(v) for v in values):
        return [f"{kind.__name__} field: values must be whole numbers"]
    problems = []
    for value in values:
        try:
            dataclasses.replace(base, **{name: kind(value)})
        except ConfigError as err:
            problems.append(f"value {value!r}: {str(err).splitlines()[-1].strip(' -')}")
    return problems


def space_table(space: Mapping[str, Any]) -> pd.DataFrame:
    """One row per searched field: the spec's kind, its range or values, and its scale."""
    return pd.DataFrame([{"field": name, "kind": type(spec).__name__.removesuffix("ParameterSpec"),
                          "min": getattr(spec, "min", None), "max": getattr(spec, "max", None),
                          "values": getattr(spec, "values", None), "scale": getattr(spec, "scale", None)}
                         for name, spec in space.items()])


def _close_values(values: Sequence[float]) -> list[float]:
    """The values of a discrete spec that repeat (closer than 1e-10 to a neighbour once sorted)."""
    ordered = sorted(float(v) for v in values)
    return sorted({b for a, b in zip(ordered, ordered[1:]) if b - a < 1e-10})


def _in_vertex_order(spec):
    """A discrete spec's values in the increasing order the API wants; every other spec as it is."""
    if isinstance(spec, hpt.DiscreteParameterSpec):
        return hpt.DiscreteParameterSpec(values=sorted(float(v) for v in spec.values), scale=spec.scale)
    return spec


def apply_parameters(cfg: TrainConfig, parameters: Mapping[str, Any]) -> TrainConfig:
    """`cfg` with the given field values, cast to the fields' types (Vertex reports 16 as 16.0)."""
    return dataclasses.replace(cfg, **{k: TrainConfig.field_type(k)(v) for k, v in parameters.items()})


# -- the tuning job -------------------------------------------------------------------------------------------------
def trial_worker_pools(cfg: TrainConfig, machine: vertex.Machine, space: Mapping[str, Any], metric: str, *,
                       image_uri: str) -> list[dict]:
    """The worker pools of each trial: `vertex.container_worker_pools` for `cfg` reporting `metric`, without the
    searched fields' flags (Vertex AI appends `--<field>=<value>` for each trial)."""
    pools = vertex.container_worker_pools(dataclasses.replace(cfg, hypertune_metric=metric), machine, image_uri)
    searched = tuple(f"--{name}=" for name in space)
    for pool in pools:
        pool["container_spec"]["args"] = [a for a in pool["container_spec"]["args"] if not a.startswith(searched)]
    return pools


def build_tuning_job(cfg: TrainConfig, machine: vertex.Machine, space: Mapping[str, Any], *, image_uri: str,
                     base_output_dir: str, metric: str = DEFAULT_HYPERTUNE_METRIC, goal: str = "maximize",
                     max_trial_count: int = 8, parallel_trial_count: int = 2, max_failed_trial_count: int = 0,
                     search_algorithm: str | None = None, measurement_selection: str = "best",
                     display_name: str | None = None, labels: dict[str, str] | None = None):
    """An `aiplatform.HyperparameterTuningJob` (not yet submitted) searching `space` over TrainConfig fields.

    `search_algorithm`: None (Vertex's default, Bayesian optimisation), "grid" or "random".
    `measurement_selection`: "best" (the best report of a trial counts) or "last".
    """
    validate_search_space(space, cfg)
    parse_hypertune_metric(metric)
    if goal not in GOALS:
        raise ConfigError(f"goal={goal!r} must be one of {', '.join(GOALS)}")
    if not 1 <= parallel_trial_count <= max_trial_count:
        raise ConfigError(f"need 1 <= parallel_trial_count ({parallel_trial_count}) <= max_trial_count "
                          f"({max_trial_count})")
    aiplatform = vertex.aiplatform_sdk()
    name = display_name or f"nli-hp-{pd.Timestamp.now():%Y%m%d-%H%M%S}"
    trial_job = aiplatform.CustomJob(display_name=f"{name}-trial", base_output_dir=base_output_dir, labels=labels,
                                     worker_pool_specs=trial_worker_pools(cfg, machine, space, metric,
                                                                          image_uri=image_uri))
    return aiplatform.HyperparameterTuningJob(
        display_name=name, custom_job=trial_job, metric_spec={metric: goal},
        parameter_spec={k: _in_vertex_order(v) for k, v in space.items()}, max_trial_count=max_trial_count,
        parallel_trial_count=parallel_trial_count, max_failed_trial_count=max_failed_trial_count,
        search_algorithm=search_algorithm, measurement_selection=measurement_selection, labels=labels)


def submit_tuning_job(job, *, service_account: str | None = None, tensorboard: str | None = None,
                      spot: bool = False, restart_job_on_worker_restart: bool | None = None,
                      timeout_s: int | None = None):
    """Create the tuning job on Vertex AI and return it at once; watch it with `vertex.watch_job(job)`.

    The SDK's `run()` blocks until every trial ends, and `run(sync=False)` leaves a thread that polls the job and
    keeps the Python process (a papermill kernel) alive until the last trial. So the job, as the SDK built it
    (`job.to_dict()`), is created through the public GAPIC client (`vertex.create_hyperparameter_tuning_job`).
    `tensorboard`: see `vertex.check_vertex_tensorboard`. `timeout_s`, `spot` and `restart_job_on_worker_restart`
    apply to each trial; the last defaults to on for trials of several training replicas, as for custom jobs.
    With `spot` each trial also checkpoints every few minutes, as in `vertex.submit_custom_job`.
    """
    body = job.to_dict()
    spec = body["trialJobSpec"]
    if spot:  # each trial checkpoints every few minutes too, as a Spot custom job does
        spec["workerPoolSpecs"] = vertex.spot_worker_pools(spec["workerPoolSpecs"])
    if restart_job_on_worker_restart is None:
        restart_job_on_worker_restart = sum(int(p.get("replicaCount", 0)) for p in spec["workerPoolSpecs"][:2]) > 1
    if tensorboard:
        vertex.check_vertex_tensorboard(tensorboard, service_account)
        spec["tensorboard"] = tensorboard
    if service_account:
        spec["serviceAccount"] = service_account
    scheduling = {"restartJobOnWorkerRestart": restart_job_on_worker_restart, "strategy": "SPOT" if spot else None,
                  "timeout": f"{timeout_s}s" if timeout_s else None}
    if any(scheduling.values()):
        spec["scheduling"] = {k: v for k, v in scheduling.items() if v}
    submitted = vertex.create_hyperparameter_tuning_job(json.dumps(body), service_account=service_account)
    print(f"submitted {submitted.resource_name}\nlogs: {vertex.logs_url(submitted)}")
    return submitted


def tuning_results(job) -> pd.DataFrame:
    """One row per trial of a tuning job (object or resource name): its parameters, final metric, state.

    `attrs` carries the metric id, its goal and the parameter names, for `sweep.best_trial` and
    `plots.tuning_results`.
    """
    name = job if isinstance(job, str) else job.resource_name
    proto = vertex.aiplatform_sdk().HyperparameterTuningJob.get(name).gca_resource
    spec = proto.study_spec.metrics[0]
    metric, names = spec.metric_id, [p.parameter_id for p in proto.study_spec.parameters]
    rows = []
    for t in proto.trials:
        values = {p.parameter_id: p.value for p in t.parameters}
        final = {m.metric_id: m.value for m in t.final_measurement.metrics}
        timed = "start_time" in t and "end_time" in t
        rows.append({"trial": int(t.id), **{n: _as_field(n, values.get(n)) for n in names},
                     metric: final.get(metric, math.nan), "state": t.state.name, "reports": len(t.measurements),
                     "seconds": (t.end_time - t.start_time).total_seconds() if timed else math.nan,
                     "reason": t.infeasible_reason, "custom_job": t.custom_job})
    results = pd.DataFrame(rows, columns=["trial", *names, metric, "state", "reports", "seconds", "reason",
                                          "custom_job"])
    goal = "minimize" if spec.goal.name == "MINIMIZE" else "maximize"
    results.attrs.update(metric=metric, goal=goal, parameters=names, job=name, job_state=proto.state.name)
    return results


def _as_field(name: str, value):
    if value is None or name not in FIELD_NAMES:
        return value
    return TrainConfig.field_type(name)(value)
