"""Tune hyperparameters: a papermill sweep on this machine, or a Vertex AI hyperparameter-tuning job.

Locally, one call runs a notebook once per point of a grid and gathers one row per run:

    >>> results = local_sweep("notebooks/02_finetune_local.ipynb", {"learning_rate": [1e-4, 3e-4]},
    ...                       base_params={"profile": "smoke"})          # -> runs/sweep-<time>/run-01, ...
    >>> plot_results(results, "validation_matched_accuracy")

On Vertex AI, a search space over `TrainConfig` fields becomes a `HyperparameterTuningJob` whose trials run
the trainer (`python -m nli_helpers.task`) on the same worker pools `nli_helpers.vertex` builds; each trial
reports the chosen validation metric after every evaluation (`nli_helpers.tracking.HypertuneCallback`):

    >>> space = {"learning_rate": Double(1e-5, 1e-4, scale="log"), "batch_size": Discrete([16, 32])}
    >>> job = build_tuning_job(cfg, machine, space, image_uri=..., base_output_dir="gs://BUCKET/hp/1",
    ...                        max_trial_count=8, parallel_trial_count=2)
    >>> job = submit_tuning_job(job)                  # returns at once; vertex.watch_job(job) waits
    >>> results = tuning_results(job); best_trial(results)

The metric is always a validation split's score (`validation_matched_accuracy` by default), never a test
split's: tuning on a test split would make its score an optimistic estimate.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .config import ConfigError, NLIError, TrainConfig
from .tracking import DEFAULT_HYPERTUNE_METRIC, parse_hypertune_metric

GOALS = ("maximize", "minimize")
# Fields a search may not vary: where the run writes, what it reports, how it is shown.
NOT_SEARCHABLE = ("profile", "job_dir", "checkpoint_dir", "resume", "hypertune_metric", "progress", "data",
                  "allow_cpu")


# -- the search space ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Double:
    """A float range; scale "log" samples evenly in log space (learning rates)."""

    min: float
    max: float
    scale: str = "linear"


@dataclass(frozen=True)
class Integer:
    min: int
    max: int
    scale: str = "linear"


@dataclass(frozen=True)
class Discrete:
    """A few numbers to choose from (batch sizes)."""

    values: Sequence[float]


@dataclass(frozen=True)
class Categorical:
    values: Sequence[str]


ParameterRange = Double | Integer | Discrete | Categorical
SCALES = {"linear": "linear", "log": "log"}
FIELD_NAMES = set(TrainConfig.field_names())


def range_values(spec: ParameterRange) -> list:
    """The values that bound a range (its extremes) or make up a list: each must give a valid config."""
    return [spec.min, spec.max] if isinstance(spec, (Double, Integer)) else list(spec.values)


def validate_search_space(space: Mapping[str, ParameterRange], base: TrainConfig | None = None) -> None:
    """Raise one ConfigError naming every problem: unknown or unsearchable fields, ranges of the wrong type,
    and values that would make an invalid TrainConfig (checked at each range's ends and every listed value)."""
    base = base or TrainConfig(profile="smoke")
    problems = []
    for name, spec in space.items():
        if name not in FIELD_NAMES:
            problems.append(f"{name!r} is not a TrainConfig field (known: {', '.join(TrainConfig.field_names())})")
            continue
        if name in NOT_SEARCHABLE:
            problems.append(f"{name!r} cannot be searched: it says where or how a run writes, not how it trains")
            continue
        problems += [f"{name}: {p}" for p in _range_problems(name, spec, base)]
    if not space:
        problems.append("the search space is empty: name at least one TrainConfig field")
    if problems:
        raise ConfigError("invalid search space:\n  - " + "\n  - ".join(problems))


def _range_problems(name: str, spec: ParameterRange, base: TrainConfig) -> list[str]:
    kind = TrainConfig.field_type(name)
    wants = {Double: (float,), Integer: (int, float), Discrete: (int, float), Categorical: (str,)}
    if not isinstance(spec, tuple(wants)) or kind not in wants[type(spec)]:
        return [f"a {type(spec).__name__} range does not fit a {kind.__name__} field"]
    if isinstance(spec, (Double, Integer)):
        if spec.scale not in SCALES:
            return [f"scale {spec.scale!r} is unknown; use 'linear' or 'log'"]
        if not spec.min < spec.max:
            return [f"min {spec.min} must be below max {spec.max}"]
        if spec.scale == "log" and spec.min <= 0:
            return [f"a log scale needs min > 0 (got {spec.min})"]
    elif not spec.values:
        return ["no values to choose from"]
    elif isinstance(spec, Discrete) and (repeated := _close_values(spec.values)):
        return [f"values {', '.join(map(repr, repeated))} repeat: Vertex AI wants distinct values, in increasing "
                "order and at least 1e-10 apart (StudySpec DiscreteValueSpec); list each value once"]
    elif isinstance(spec, Categorical) and len(set(spec.values)) < len(spec.values):
        return [f"values {sorted({v for v in spec.values if list(spec.values).count(v) > 1})} repeat: list each "
                "category once"]
    if kind is int and any(float(v) != int(v) for v in range_values(spec)):
        return [f"{kind.__name__} field: values must be whole numbers"]
    problems = []
    for value in range_values(spec):
        try:
            dataclasses.replace(base, **{name: kind(value)})
        except ConfigError as err:
            problems.append(f"value {value!r}: {str(err).splitlines()[-1].strip(' -')}")
    return problems


def _close_values(values: Sequence[float]) -> list[float]:
    """The values of a discrete range that repeat (closer than 1e-10 to a neighbour once sorted)."""
    ordered = sorted(float(v) for v in values)
    return sorted({b for a, b in zip(ordered, ordered[1:]) if b - a < 1e-10})


def vertex_parameter_specs(space: Mapping[str, ParameterRange]) -> dict:
    """The search space as aiplatform `hyperparameter_tuning` parameter specs."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt

    specs = {}
    for name, spec in space.items():
        if isinstance(spec, Double):
            specs[name] = hpt.DoubleParameterSpec(min=spec.min, max=spec.max, scale=spec.scale)
        elif isinstance(spec, Integer):
            specs[name] = hpt.IntegerParameterSpec(min=spec.min, max=spec.max, scale=spec.scale)
        elif isinstance(spec, Discrete):
            specs[name] = hpt.DiscreteParameterSpec(values=sorted(float(v) for v in spec.values), scale="linear")
        else:
            specs[name] = hpt.CategoricalParameterSpec(values=list(spec.values))
    return specs


def apply_parameters(cfg: TrainConfig, parameters: Mapping[str, Any]) -> TrainConfig:
    """`cfg` with the given field values, cast to the fields' types (Vertex reports 16 as 16.0)."""
    return dataclasses.replace(cfg, **{k: TrainConfig.field_type(k)(v) for k, v in parameters.items()})


# -- the local sweep (papermill) ----------------------------------------------------------------------------
def grid_points(grid: Mapping[str, Sequence]) -> list[dict]:
    """Every combination of the grid's values, in order: {"a": [1, 2], "b": [3]} -> [{a:1,b:3}, {a:2,b:3}]."""
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def local_sweep(notebook: str | Path, grid: Mapping[str, Sequence], base_params: Mapping[str, Any] | None = None,
                out_dir: str | Path | None = None, *, timeout: int | None = None, kernel_name: str | None = None,
                echo=print) -> pd.DataFrame:
    """Run `notebook` once per grid point (papermill) into `out_dir/run-NN/`; one row per run.

    Each run gets `base_params` plus its grid point; the notebook's `job_dir` (if it declares one) goes
    to `run-NN/<notebook>/`. The row holds the grid values, status, wall seconds, final accuracy per
    validation split (from the run's metrics.json, else the executed notebook) and where things are.
    The table is also written to `out_dir/sweep.csv`.
    """
    from . import notebook_runs

    path = Path(notebook).resolve()
    if not path.is_file():
        raise NLIError(f"notebook {path} does not exist")
    points = grid_points(grid)
    if not points:
        raise NLIError("the grid is empty: give each parameter at least one value")
    declared = notebook_runs.notebook_parameters(path)
    missing = sorted(set(grid) - set(declared))
    if missing:
        raise NLIError(f"{path.name} does not declare {', '.join(missing)}; its parameters: {', '.join(declared)}")
    base_params = dict(base_params or {})
    notebook_runs.check_params(base_params, [path])
    out_dir = Path(out_dir) if out_dir else notebook_runs.new_run_dir("sweep")
    rows = []
    for i, point in enumerate(points, 1):
        echo(f"[{i}/{len(points)}] {path.name} " + " ".join(f"{k}={v}" for k, v in point.items()), flush=True)
        run_dir = out_dir / f"run-{i:02d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        run = notebook_runs.run_notebook(path, run_dir, {**base_params, **point}, declared, timeout=timeout,
                                         kernel_name=kernel_name)
        echo(f"      {run.status} in {run.seconds:.0f}s" + (f": {run.error}" if run.error else ""), flush=True)
        rows.append({"run": f"run-{i:02d}", **point, "status": run.status, "seconds": run.seconds,
                     **{f"{split}_accuracy": acc for split, acc in (run.accuracy or {}).items()},
                     "error": run.error, "notebook": run.output, "job_dir": run.job_dir})
    results = pd.DataFrame(rows)
    results.attrs.update(metric=DEFAULT_HYPERTUNE_METRIC, goal="maximize", parameters=list(grid))
    out_dir.mkdir(parents=True, exist_ok=True)
    results.to_csv(out_dir / "sweep.csv", index=False)
    return results


# -- Vertex AI hyperparameter tuning ----------------------------------------------------------------------
def trial_worker_pools(cfg: TrainConfig, machine, space: Mapping[str, ParameterRange], metric: str, *,
                       image_uri: str | None = None, package_uri: str | None = None,
                       executor_image_uri: str | None = None, region: str = "us-central1") -> list[dict]:
    """The worker pools of each trial: vertex.py's pools for `cfg`, reporting `metric`, without the searched
    fields' flags (Vertex AI appends `--<field>=<value>` for each trial)."""
    from . import vertex

    trial_cfg = dataclasses.replace(cfg, hypertune_metric=metric)
    if (image_uri is None) == (package_uri is None):
        raise ConfigError("pass exactly one of image_uri (custom container) or package_uri (python package)")
    if image_uri:
        pools = vertex.container_worker_pools(trial_cfg, machine, image_uri)
    else:
        pools = vertex.python_package_worker_pools(trial_cfg, machine, package_uri,
                                                   executor_image_uri=executor_image_uri, region=region)
    searched = tuple(f"--{name}=" for name in space)
    for pool in pools:
        code = pool.get("container_spec") or pool["python_package_spec"]
        code["args"] = [a for a in code["args"] if not a.startswith(searched)]
    return pools


def build_tuning_job(cfg: TrainConfig, machine, space: Mapping[str, ParameterRange], *, base_output_dir: str,
                     metric: str = DEFAULT_HYPERTUNE_METRIC, goal: str = "maximize", max_trial_count: int = 8,
                     parallel_trial_count: int = 2, max_failed_trial_count: int = 0,
                     search_algorithm: str | None = None, measurement_selection: str = "best",
                     image_uri: str | None = None, package_uri: str | None = None,
                     executor_image_uri: str | None = None, region: str = "us-central1",
                     display_name: str | None = None, labels: dict[str, str] | None = None):
    """An `aiplatform.HyperparameterTuningJob` (not yet submitted) searching `space` over TrainConfig fields.

    `search_algorithm`: None (Vertex's default, Bayesian optimisation), "grid" or "random".
    `measurement_selection`: "best" (the best report of a trial counts) or "last".
    """
    from . import vertex

    validate_search_space(space, cfg)
    parse_hypertune_metric(metric)
    if goal not in GOALS:
        raise ConfigError(f"goal={goal!r} must be one of {', '.join(GOALS)}")
    if not 1 <= parallel_trial_count <= max_trial_count:
        raise ConfigError(f"need 1 <= parallel_trial_count ({parallel_trial_count}) <= max_trial_count "
                          f"({max_trial_count})")
    pools = trial_worker_pools(cfg, machine, space, metric, image_uri=image_uri, package_uri=package_uri,
                               executor_image_uri=executor_image_uri, region=region)
    aiplatform = vertex.aiplatform_sdk()
    name = display_name or f"nli-hp-{pd.Timestamp.now():%Y%m%d-%H%M%S}"
    trial_job = aiplatform.CustomJob(display_name=f"{name}-trial", worker_pool_specs=pools,
                                     base_output_dir=base_output_dir, labels=labels)
    return aiplatform.HyperparameterTuningJob(
        display_name=name, custom_job=trial_job, metric_spec={metric: goal},
        parameter_spec=vertex_parameter_specs(space), max_trial_count=max_trial_count,
        parallel_trial_count=parallel_trial_count, max_failed_trial_count=max_failed_trial_count,
        search_algorithm=search_algorithm, measurement_selection=measurement_selection, labels=labels)


def submit_tuning_job(job, *, service_account: str | None = None, tensorboard: str | None = None,
                      spot: bool = False, restart_job_on_worker_restart: bool | None = None,
                      timeout_s: int | None = None):
    """Create the tuning job on Vertex AI and return it at once; watch it with `vertex.watch_job(job)`.

    The SDK's `run()` blocks until every trial ends, and `run(sync=False)` leaves a thread that polls the job,
    keeps the Python process alive and logs into whatever notebook cell runs next. So this creates the job as
    `CustomJob.submit` does, through the SDK's own client, and returns the SDK's job object. `tensorboard`:
    see `vertex.check_vertex_tensorboard`. `timeout_s`, `spot` and `restart_job_on_worker_restart` apply to each trial; the last defaults to on
    for trials of several training replicas, as in `vertex.submit_custom_job`.
    """
    from google.api_core import exceptions as api_exceptions
    from google.auth.exceptions import GoogleAuthError
    from google.cloud.aiplatform.compat.types import custom_job as custom_job_types
    from google.protobuf import duration_pb2

    from . import vertex

    # Not yet created, so the SDK's public `gca_resource` refuses; its `run()` edits the same proto.
    proto = job._gca_resource
    spec = proto.trial_job_spec
    if restart_job_on_worker_restart is None:
        restart_job_on_worker_restart = sum(p.replica_count for p in spec.worker_pool_specs[:2]) > 1
    if tensorboard:
        vertex.check_vertex_tensorboard(tensorboard, service_account)
        spec.tensorboard = tensorboard
    if service_account:
        spec.service_account = service_account
    if spot or restart_job_on_worker_restart or timeout_s:
        spec.scheduling = custom_job_types.Scheduling(
            timeout=duration_pb2.Duration(seconds=timeout_s) if timeout_s else None,
            restart_job_on_worker_restart=restart_job_on_worker_restart,
            strategy=custom_job_types.Scheduling.Strategy.SPOT if spot else None)
    try:
        created = job.api_client.create_hyperparameter_tuning_job(
            parent=f"projects/{job.project}/locations/{job.location}", hyperparameter_tuning_job=proto)
    except GoogleAuthError as err:
        raise vertex.VertexError(f"{vertex.CREDENTIALS_HELP} ({err})") from err
    except api_exceptions.PermissionDenied as err:
        raise vertex.VertexError(f"permission denied creating the tuning job: grant your account roles/aiplatform.user "
                                 f"(and iam.serviceAccountUser on {service_account or 'the job service account'}): "
                                 f"{err.message}") from err
    except api_exceptions.GoogleAPICallError as err:
        raise vertex.VertexError(f"Vertex AI refused the tuning job ({err.code}): {err.message}") from err
    submitted = vertex.aiplatform_sdk().HyperparameterTuningJob.get(created.name)
    print(f"submitted {submitted.resource_name}\nlogs: {vertex.logs_url(submitted)}")
    return submitted


def tuning_results(job) -> pd.DataFrame:
    """One row per trial of a tuning job (object or resource name): its parameters, final metric, state.

    `attrs` carries the metric id, its goal and the parameter names, for `best_trial` and `plot_results`.
    """
    from . import vertex

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


def best_trial(results: pd.DataFrame, metric: str | None = None, goal: str | None = None) -> pd.Series:
    """The finished row with the best metric (a local sweep's or a tuning job's results)."""
    metric = metric or results.attrs.get("metric", DEFAULT_HYPERTUNE_METRIC)
    goal = goal or results.attrs.get("goal", "maximize")
    done = results[results.get("state", results.get("status")).isin(["SUCCEEDED", "ok"])]
    done = done[done[metric].notna()] if metric in done else done.iloc[0:0]
    if done.empty:
        raise NLIError(f"no finished run reported {metric}: look at the state/status and error columns")
    return done.loc[done[metric].idxmax() if goal == "maximize" else done[metric].idxmin()]
