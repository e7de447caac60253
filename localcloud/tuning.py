"""Hyperparameter-tuning jobs for localcloud/vertex.py: create / get / list / cancel, and trials that really run.

`FakeVertex.handle` hands every `.../hyperparameterTuningJobs...` request here. A create body is parsed into
the SDK's own `aiplatform_v1.HyperparameterTuningJob` proto (an unknown field is a 400, as on Vertex) and
checked the way Vertex checks it on create. With `run_jobs` the fake then RUNS the trials, as Vertex does:
each trial is a child custom job (listed in `fake.jobs`, linked from `trial.custom_job`) built from the
trial job spec, its chief replica run by the fake exactly as for a custom job, with

* the trial's parameters appended to the worker pool's args as `--<parameter_id>=<value>`;
* `CLOUD_ML_TRIAL_ID=<trial id>`, and AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under
  `<base_output_dir>/<trial id>/`;
* `CLOUD_ML_HP_METRIC_FILE` pointing at a file of its own: on Vertex each trial has its own container and
  the default `/tmp/hypertune/output.metrics`; here trials share this machine's /tmp.

When the trial ends, the fake reads the metric file the trainer wrote (the cloudml-hypertune format) into the
trial's `measurements` and picks `final_measurement` by the study's measurement selection (best or last). A
trial that exits non-zero or reports no metric ends INFEASIBLE with the reason. The job SUCCEEDS when at
least one trial succeeded, else FAILS.

What is the fake's own, not Vertex's: the suggestions. Trial i of n takes the i-th of n evenly spaced points
of every DOUBLE / INTEGER range (log-spaced on a log scale) and cycles through DISCRETE and CATEGORICAL
values; Vertex's default algorithm (Bayesian optimisation) would choose differently. No metric is made up:
every value comes from a real training run. Trials run `parallel_trial_count` at a time.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from google.cloud.aiplatform_v1.types import (
    CustomJob,
    CustomJobSpec,
    EnvVar,
    HyperparameterTuningJob,
    JobState,
    Measurement,
    StudySpec,
    Trial,
)

from localcloud import rules

_COLLECTION = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/hyperparameterTuningJobs$")
_JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/hyperparameterTuningJobs/[^/:]+)(:cancel)?$")
_REPORT_KEYS = {"timestamp", "trial", "global_step", "checkpoint_path"}
Goal = StudySpec.MetricSpec.GoalType
Scale = StudySpec.ParameterSpec.ScaleType


@dataclass
class FakeTuningJob:
    proto: HyperparameterTuningJob
    request_body: dict
    children: dict[str, rules.FakeJob] = field(default_factory=dict)  # trial id -> its custom job
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)


def tuning_jobs(fake) -> dict[str, FakeTuningJob]:
    """The fake's tuning jobs by resource name (kept on the fake, created on first use)."""
    return fake.__dict__.setdefault("tuning_jobs", {})


def created_tuning_bodies(fake) -> list[dict]:
    """The bodies of every create-hyperparameter-tuning-job request, as the SDK sent them."""
    return [r.body for r in fake.requests if r.method == "POST" and _COLLECTION.match(r.path)]


def wait(fake, name: str, timeout: float = rules.JOB_TIMEOUT_S) -> HyperparameterTuningJob:
    job = tuning_jobs(fake)[name]
    if not job.done.wait(timeout):
        raise TimeoutError(f"{name} still running after {timeout} s")
    return job.proto


def handle_tuning(fake, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
    jobs = tuning_jobs(fake)
    collection, job = _COLLECTION.match(path), _JOB.match(path)
    if collection and method == "POST":
        return _create(fake, collection.group(1), body or {})
    if collection and method == "GET":
        prefix = collection.group(1) + "/"
        return 200, {"hyperparameterTuningJobs": [_json(j.proto, query) for n, j in jobs.items() if n.startswith(prefix)]}
    if job and job.group(1) in jobs:
        if method == "GET" and not job.group(2):
            with fake._lock:
                return 200, _json(jobs[job.group(1)].proto, query)
        if method == "POST" and job.group(2):
            return _cancel(fake, jobs[job.group(1)])
    if job:
        return rules.api_error(404, "NOT_FOUND", f"{job.group(1)} not found")
    fake.unknown_requests.append(fake.requests[-1])
    return rules.api_error(404, "NOT_FOUND", f"the fake does not serve {method} {path}")


def _json(proto: HyperparameterTuningJob, query: dict) -> dict:
    ints = "enum-encoding=int" in ";".join(query.get("$alt", []))
    return json.loads(HyperparameterTuningJob.to_json(proto, use_integers_for_enums=ints))


# -- create: the checks Vertex makes -------------------------------------------------------------------
def _create(fake, parent: str, body: dict) -> tuple[int, dict]:
    try:
        proto = HyperparameterTuningJob.from_json(json.dumps(body))  # unknown fields raise, as on Vertex
    except Exception as err:  # noqa: BLE001 - the parser's message is the 400's message
        return rules.api_error(400, "INVALID_ARGUMENT", f"invalid HyperparameterTuningJob: {err}")
    problem = _server_side_problem(proto)
    if problem:
        return rules.api_error(400, "INVALID_ARGUMENT", problem)
    if problem := fake.practice_problem(proto.trial_job_spec):
        return rules.api_error(400, "FAILED_PRECONDITION", problem)
    now = dt.datetime.now(dt.UTC)
    proto.name = f"{parent}/hyperparameterTuningJobs/{next(fake._ids)}"
    proto.state, proto.create_time, proto.update_time = JobState.JOB_STATE_PENDING, now, now
    job = tuning_jobs(fake)[proto.name] = FakeTuningJob(proto, body)
    if fake.run_jobs:
        threading.Thread(target=_run, args=(fake, job), daemon=True).start()
    return 200, _json(proto, {})


def _server_side_problem(proto: HyperparameterTuningJob) -> str | None:
    study = proto.study_spec
    if not study.metrics or any(m.goal == Goal.GOAL_TYPE_UNSPECIFIED for m in study.metrics):
        return "study_spec.metrics must name at least one metric, each with goal MAXIMIZE or MINIMIZE"
    if not study.parameters:
        return "study_spec.parameters must not be empty"
    for p in study.parameters:
        problem = _parameter_problem(p, study.algorithm)
        if problem:
            return f"parameter {p.parameter_id}: {problem}"
    if proto.max_trial_count < 1 or proto.parallel_trial_count < 1:
        return "max_trial_count and parallel_trial_count must be positive"
    return rules.server_side_problem(CustomJob(display_name="trial", job_spec=proto.trial_job_spec))


def _parameter_problem(p: StudySpec.ParameterSpec, algorithm) -> str | None:
    if "double_value_spec" in p:
        lo, hi = p.double_value_spec.min_value, p.double_value_spec.max_value
        if algorithm == StudySpec.Algorithm.GRID_SEARCH:
            return "grid search needs INTEGER, DISCRETE or CATEGORICAL parameters, not DOUBLE"
        if not lo < hi:
            return f"min_value {lo} must be below max_value {hi}"
        if p.scale_type in (Scale.UNIT_LOG_SCALE, Scale.UNIT_REVERSE_LOG_SCALE) and lo <= 0:
            return "a log scale needs min_value > 0"
    elif "discrete_value_spec" in p:
        values = list(p.discrete_value_spec.values)
        if not values or values != sorted(set(values)):
            return "discrete values must be given in increasing order, without repeats"
    elif "integer_value_spec" not in p and "categorical_value_spec" not in p:
        return "no value spec"
    return None


# -- running the trials ----------------------------------------------------------------------------------
def suggest(p: StudySpec.ParameterSpec, i: int, n: int):
    """The fake's suggestion for trial i of n (see the module docstring): not Vizier's."""
    frac = 0.5 if n == 1 else i / (n - 1)
    if "double_value_spec" in p or "integer_value_spec" in p:
        spec = p.double_value_spec if "double_value_spec" in p else p.integer_value_spec
        lo, hi = float(spec.min_value), float(spec.max_value)
        if p.scale_type == Scale.UNIT_LOG_SCALE:
            value = lo ** (1 - frac) * hi ** frac  # lo and hi themselves at the ends, not exp(log(x))
        else:
            value = lo + frac * (hi - lo)
        value = min(max(value, lo), hi)  # a power may land a rounding error outside the range
        return float(round(value)) if "integer_value_spec" in p else value
    if "discrete_value_spec" in p:
        return p.discrete_value_spec.values[i % len(p.discrete_value_spec.values)]
    return p.categorical_value_spec.values[i % len(p.categorical_value_spec.values)]


def _arg_value(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _run(fake, job: FakeTuningJob) -> None:
    with fake._lock:
        if job.proto.state != JobState.JOB_STATE_PENDING:
            return
        job.proto.state, job.proto.start_time = JobState.JOB_STATE_RUNNING, dt.datetime.now(dt.UTC)
    metrics_dir = Path(tempfile.mkdtemp(prefix="fake-vertex-hp-"))
    n = job.proto.max_trial_count
    with ThreadPoolExecutor(max_workers=job.proto.parallel_trial_count) as pool:
        for future in [pool.submit(_run_trial, fake, job, i, n, metrics_dir) for i in range(n)]:
            future.result()
    with fake._lock:
        trials = list(job.proto.trials)
        ok = [t for t in trials if t.state == Trial.State.SUCCEEDED]
        if job.cancelled:
            _finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
        elif ok:
            _finish(job, JobState.JOB_STATE_SUCCEEDED)
        else:
            reason = trials[0].infeasible_reason if trials else "no trial ran"
            _finish(job, JobState.JOB_STATE_FAILED, f"all {len(trials)} trials failed; trial 1: {reason}")


def _run_trial(fake, job: FakeTuningJob, i: int, n: int, metrics_dir: Path) -> None:
    trial_id = str(i + 1)
    metric_file = metrics_dir / trial_id / "output.metrics"
    with fake._lock:
        if job.cancelled:
            return
        params = [Trial.Parameter(parameter_id=p.parameter_id, value=suggest(p, i, n))
                  for p in job.proto.study_spec.parameters]
        child = _child_job(fake, job, trial_id, params, metric_file)
        job.proto.trials.append(Trial(id=trial_id, state=Trial.State.ACTIVE, parameters=params,
                                      start_time=dt.datetime.now(dt.UTC), custom_job=child.proto.name))
    fake._run(child)  # the chief replica, exactly as for a custom job; ends SUCCEEDED, FAILED or CANCELLED
    measurements = _read_measurements(metric_file, job.proto.study_spec.metrics[0].metric_id)
    with fake._lock:
        trial = next(t for t in job.proto.trials if t.id == trial_id)
        trial.end_time = dt.datetime.now(dt.UTC)
        trial.measurements.extend(measurements)
        if child.proto.state == JobState.JOB_STATE_SUCCEEDED and measurements:
            trial.state, trial.final_measurement = Trial.State.SUCCEEDED, _final(job.proto.study_spec, measurements)
        else:
            trial.state = Trial.State.INFEASIBLE
            trial.infeasible_reason = child.proto.error.message or (
                f"the trial reported no metric {job.proto.study_spec.metrics[0].metric_id!r} "
                "(cloudml-hypertune file empty or missing)")


def _child_job(fake, job: FakeTuningJob, trial_id: str, params: list, metric_file: Path) -> rules.FakeJob:
    """The custom job behind one trial: the trial job spec, the trial's args, env and output dir."""
    spec = CustomJobSpec.deserialize(CustomJobSpec.serialize(job.proto.trial_job_spec))
    spec.base_output_directory.output_uri_prefix = f"{spec.base_output_directory.output_uri_prefix.rstrip('/')}/{trial_id}"
    args = [f"--{p.parameter_id}={_arg_value(p.value)}" for p in params]
    env = [EnvVar(name="CLOUD_ML_TRIAL_ID", value=trial_id), EnvVar(name="CLOUD_ML_HP_METRIC_FILE", value=str(metric_file))]
    for pool in spec.worker_pool_specs:
        code = pool.python_package_spec if "python_package_spec" in pool else pool.container_spec
        code.args.extend(args)
        code.env.extend(env)
    now = dt.datetime.now(dt.UTC)
    proto = CustomJob(display_name=f"{job.proto.display_name}-trial-{trial_id}", job_spec=spec,
                      name=f"{job.proto.name.split('/hyperparameterTuningJobs/')[0]}/customJobs/{next(fake._ids)}",
                      state=JobState.JOB_STATE_PENDING, create_time=now, update_time=now)
    side_by_side = min(job.proto.parallel_trial_count, job.proto.max_trial_count)  # trials that share the cores
    child = fake.jobs[proto.name] = rules.FakeJob(proto, {}, side_by_side=side_by_side)
    job.children[trial_id] = child
    return child


def _read_measurements(path: Path, metric_id: str) -> list[Measurement]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if metric_id in entry:
            out.append(Measurement(step_count=int(entry["global_step"]),
                                   metrics=[Measurement.Metric(metric_id=metric_id, value=float(entry[metric_id]))]))
    return out


def _final(study: StudySpec, measurements: list[Measurement]) -> Measurement:
    if study.measurement_selection_type == StudySpec.MeasurementSelectionType.LAST_MEASUREMENT:
        return measurements[-1]
    sign = 1 if study.metrics[0].goal == Goal.MAXIMIZE else -1
    return max(measurements, key=lambda m: sign * m.metrics[0].value)  # BEST (Vertex's default)


def _cancel(fake, job: FakeTuningJob) -> tuple[int, dict]:
    with fake._lock:
        if job.proto.state in rules.TERMINAL:
            return rules.api_error(400, "FAILED_PRECONDITION", f"{job.proto.name} has already ended")
        job.cancelled = True
        if job.proto.state == JobState.JOB_STATE_PENDING:  # never started (a queue-only fake)
            _finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            return 200, {}
        job.proto.state = JobState.JOB_STATE_CANCELLING
        running = [c for c in job.children.values() if c.proto.state not in rules.TERMINAL]
    for child in running:
        fake._cancel(child)
    return 200, {}


def _finish(job: FakeTuningJob, state: JobState, message: str = "") -> None:
    now = dt.datetime.now(dt.UTC)
    job.proto.state, job.proto.end_time, job.proto.update_time = state, now, now
    if message and state != JobState.JOB_STATE_SUCCEEDED:
        job.proto.error = {"code": 1 if state == JobState.JOB_STATE_CANCELLED else 3, "message": message}
    job.done.set()
