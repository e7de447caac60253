"""The fake's Vertex AI rules (localcloud/rules.py), each against a job whose container is a line of Python.

Every job here runs `python -c SCRIPT` in an "image" backed by this interpreter, so a test takes a
second or two and checks one documented rule: how a Spot preemption, VM maintenance, a possibly
transient exit, a permanent exit and `scheduling.timeout` end or restart a job, and what a container
finds in CLOUD_ML_PROJECT_ID. The numbers (three Spot restarts, three job retries) and messages are
written out as Vertex documents them, not read back from the fake, so a wrong rule fails here.
Training jobs under the same rules: tests/test_vertex_resilience.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from google.api_core.exceptions import BadRequest
from google.cloud import aiplatform
from google.cloud.aiplatform import hyperparameter_tuning as hpt

from localcloud.tuning import tuning_jobs
from nli_helpers import vertex
from nli_helpers.config import make_config

pytest_plugins = ["tests.fake_vertex"]  # fixtures: make_fake_vertex

PROJECT, REGION = "test-project", "us-central1"
IMAGE = "us-central1-docker.pkg.dev/test-project/tiny/python:1"
SLEEP_FOREVER = "import time\nwhile True:\n    time.sleep(0.05)"
STOCKOUT = ("Resources are insufficient in region: us-central1. Try a different region or use a different "
            "accelerator.")
# The workers exit 134 at their first start; the chief succeeds at its second start (so only a restart of the
# WHOLE job, chief included, lets the job end); otherwise every replica sleeps until it is stopped.
WORKER_ABORTS_ONCE = """
import json, os, sys, time
pool = json.loads(os.environ["CLUSTER_SPEC"])["task"]["type"]
marks = os.path.join(os.environ["MARKS"], pool)
first = not os.path.exists(marks)
open(marks, "a").write("started\\n")
if pool == "workerpool1" and first:
    sys.exit(134)
if pool == "workerpool0" and not first:
    sys.exit(0)
time.sleep(60)
"""


@pytest.fixture
def cloud(make_fake_vertex, gcs_bucket):
    fake = make_fake_vertex(run_jobs=True, grace_s=5)
    fake.register_image(IMAGE, Path(sys.executable))
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake.endpoint)
    return fake, gcs_bucket


def submit(cloud, script: str, name: str, *, replicas: int = 1, env: dict[str, str] | None = None, **kwargs):
    """A job whose every replica runs `python -c script`; kwargs go to vertex.submit_custom_job."""
    _, bucket = cloud
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": IMAGE, "command": ["python", "-c", script],
                               "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}}
    pools = [pool] + ([{**pool, "replica_count": replicas - 1}] if replicas > 1 else [])
    return vertex.submit_custom_job(pools, base_output_dir=f"gs://{bucket}/{name}", display_name=name,
                                    **kwargs)


def wait_for_attempt(fake, name: str, attempt: int, replica: str = "workerpool0-0",
                     timeout: float = 30) -> None:
    """Until `replica` runs its `attempt`-th start (the job still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = fake.jobs[name].replicas.get(replica)
        if found is not None and found.attempt == attempt and found.running():
            return
        assert not fake.jobs[name].done.is_set(), f"{name} ended: {fake.jobs[name].log[-2000:]}"
        time.sleep(0.02)
    raise TimeoutError(f"{replica} of {name} never started attempt {attempt}")


def attempts(fake, name: str) -> dict[str, int]:
    return {r.name: r.attempt for r in fake.jobs[name].replicas.values()}


def test_a_spot_job_preempted_a_fourth_time_fails_with_vertex_stockout_message(cloud):
    """"Handle common errors", the stockout row: "When this happens, [Vertex AI] attempts to restart the job up to
    three times" (the Spot page says six: localcloud/rules.py rule 6 says why the fake takes the table's three)."""
    fake, _ = cloud
    job = submit(cloud, SLEEP_FOREVER, "spot-4", spot=True)
    for n in range(1, 4):  # three preemptions: each restarts the job
        wait_for_attempt(fake, job.resource_name, n)
        fake.preempt(job.resource_name, kind="spot")
    wait_for_attempt(fake, job.resource_name, 4)  # still running after three restarts
    fake.preempt(job.resource_name, kind="spot", hard=True)  # the fourth
    fake.wait(job.resource_name, timeout=30)
    assert job.state.name == "JOB_STATE_FAILED"
    assert job.error.message == STOCKOUT
    assert attempts(fake, job.resource_name) == {"workerpool0-0": 4}  # no fifth start
    assert fake.jobs[job.resource_name].log.count("STOCKOUT error; restarting the job") == 3


def test_spot_preemption_restarts_every_replica_and_vm_maintenance_only_its_own(cloud):
    fake, _ = cloud
    spot = submit(cloud, SLEEP_FOREVER, "spot-two", replicas=2, spot=True,
                  restart_job_on_worker_restart=False)
    wait_for_attempt(fake, spot.resource_name, 1, "workerpool1-0")
    fake.preempt(spot.resource_name, "workerpool1-0", kind="spot")
    wait_for_attempt(fake, spot.resource_name, 2, "workerpool0-0")  # the chief too: the whole job restarts
    wait_for_attempt(fake, spot.resource_name, 2, "workerpool1-0")

    other = submit(cloud, SLEEP_FOREVER, "maintenance-two", replicas=2, restart_job_on_worker_restart=False)
    wait_for_attempt(fake, other.resource_name, 1, "workerpool1-0")
    with pytest.raises(ValueError, match="does not run on Spot VMs"):  # only a Spot job can be preempted so
        fake.preempt(other.resource_name, "workerpool1-0", kind="spot")
    fake.preempt(other.resource_name, "workerpool1-0", kind="maintenance")
    wait_for_attempt(fake, other.resource_name, 2, "workerpool1-0")  # "restarts the worker on another VM"
    assert attempts(fake, other.resource_name)["workerpool0-0"] == 1  # and only the worker
    assert "workerpool1-0 VM maintenance: restarted on another VM" in fake.jobs[other.resource_name].log
    for job in (spot, other):
        job.cancel()
        assert fake.wait(job.resource_name, timeout=30).state.name == "JOB_STATE_CANCELLED"


def test_a_transient_exit_restarts_the_whole_job_at_most_three_times(cloud, tmp_path):
    """"If the job encountered exit codes that could be transient, [Vertex AI] tries to restart the job up to
    three times": 134 (SIGABRT in a custom container) restarts every replica; a fourth 134 fails the job."""
    fake, _ = cloud
    once = submit(cloud, WORKER_ABORTS_ONCE, "aborts-once", replicas=2, env={"MARKS": str(tmp_path)},
                  restart_job_on_worker_restart=False)
    fake.wait(once.resource_name, timeout=30)
    assert once.state.name == "JOB_STATE_SUCCEEDED"
    assert attempts(fake, once.resource_name) == {"workerpool0-0": 2, "workerpool1-0": 2}

    always = submit(cloud, "import sys; sys.exit(134)", "aborts-always")
    fake.wait(always.resource_name, timeout=30)
    assert always.state.name == "JOB_STATE_FAILED"
    assert always.error.message == ("The replica workerpool0-0 exited with a non-zero status of 134. "
                                    "Termination reason: Error.")
    assert attempts(fake, always.resource_name) == {"workerpool0-0": 4}  # the first run and three restarts
    log = fake.jobs[always.resource_name].log
    assert [f"restarting the job ({n} of 3)" in log for n in (1, 2, 3)] == [True] * 3


def test_a_permanent_exit_fails_the_job_at_once_with_the_documented_message_only(cloud):
    fake, _ = cloud
    job = submit(cloud, "import sys\nprint('ValueError: no such column')\nsys.exit(1)", "exits-1")
    fake.wait(job.resource_name, timeout=30)
    assert job.state.name == "JOB_STATE_FAILED"
    assert job.error.message == ("The replica workerpool0-0 exited with a non-zero status of 1. "
                                 "Termination reason: Error.")  # the template, no log tail
    assert attempts(fake, job.resource_name) == {"workerpool0-0": 1}  # not restarted
    # What the replica printed is in its log, not in the job's error.
    assert "[workerpool0-0] ValueError: no such column" in fake.jobs[job.resource_name].log


def test_the_job_scheduling_timeout_is_honoured(cloud):
    fake, _ = cloud
    job = submit(cloud, SLEEP_FOREVER, "timeout", timeout_s=2)
    fake.wait(job.resource_name, timeout=30)
    assert job.state.name == "JOB_STATE_CANCELLED"
    assert "scheduling.timeout (2 s)" in job.error.message
    ran = (job.gca_resource.end_time - job.gca_resource.start_time).total_seconds()
    assert 2 <= ran < 10  # its own 2 s, not the fake's 900 s safety limit


def test_cloud_ml_project_id_is_the_project_number(cloud):
    fake, _ = cloud
    job = submit(cloud, "import os; print('project=' + os.environ['CLOUD_ML_PROJECT_ID'])", "project")
    fake.wait(job.resource_name, timeout=30)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    (line,) = [x for x in fake.jobs[job.resource_name].log.splitlines() if "project=" in x]
    number = line.rsplit("=", 1)[1]
    assert number.isdigit() and number != PROJECT, line



@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU here, practice mode can train full")
def test_practice_mode_refuses_the_full_recipe_on_a_cpu_and_names_the_scaled_alternatives(cloud):
    """Not a Vertex rule: the stand-in trains each job on this machine's CPU, where full takes days. A job or a
    tuning job of it is refused at creation, in one message; a capped full run (the rehearsal) goes through."""
    fake, bucket = cloud

    def job(name: str, cfg) -> aiplatform.CustomJob:  # the SDK's own calls, as notebooks 04 and 05 make them
        pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
                "container_spec": {"image_uri": IMAGE, "command": ["python", "-c", "pass"],
                                   "args": vertex.job_args(cfg)}}
        return aiplatform.CustomJob(display_name=name, worker_pool_specs=[pool],
                                    base_output_dir=f"gs://{bucket}/{name}")

    with pytest.raises(BadRequest) as refused:
        job("full", make_config("full")).submit()
    message = refused.value.message
    assert "profile full (roberta-base on 393k pairs) takes days" in message and "\n" not in message
    assert "notebooks/params/smoke.yaml" in message and "notebooks/params/rehearsal.yaml" in message
    tuning = aiplatform.HyperparameterTuningJob(
        display_name="full-hp", custom_job=job("trial", make_config("full")),
        metric_spec={"validation_matched_accuracy": "maximize"}, max_trial_count=1, parallel_trial_count=1,
        parameter_spec={"learning_rate": hpt.DoubleParameterSpec(min=1e-5, max=5e-5, scale="log")})
    with pytest.raises(BadRequest, match="profile full .* takes days"):
        tuning.run()
    assert not fake.jobs and not tuning_jobs(fake)

    rehearsal = job("rehearsal", make_config("full", max_train_samples=64))
    rehearsal.submit()
    fake.wait(rehearsal.resource_name, timeout=30)
    assert rehearsal.state.name == "JOB_STATE_SUCCEEDED"
