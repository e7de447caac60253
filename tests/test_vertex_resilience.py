"""What Vertex AI does to a running training job, against the fake: preemption and restarts, quota queues.

Each job runs the trainer image's stand-in (localcloud/image.py) on the default path, the custom container,
and trains the smoke model the image carries (MiniLM, with dropout: an exact resume needs every RNG state
back). The fake applies Vertex's documented rules (localcloud/rules.py): a preempted replica gets SIGTERM,
then SIGKILL after the grace period; a Spot preemption restarts the whole job (the single-replica job here
runs on Spot VMs); VM maintenance restarts the replica, and with it every replica of a multi-replica job
(`restart_job_on_worker_restart`, on by default for it). The restarted trainer finds AIP_CHECKPOINT_DIR and
resumes from the newest complete checkpoint there, so the job must end with exactly the metrics of an
uninterrupted job of the same seed. One job per topology is interrupted twice: gracefully (SIGTERM, the
trainer checkpoints where it stands) and then, after it resumed, hard (SIGKILL: the newest periodic
checkpoint). The same rules on one-line jobs, with their limits and messages: tests/test_vertex_rules.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from localcloud.image import TRAINER_IMAGE
from nli_helpers import vertex
from nli_helpers.config import make_config
from nli_helpers.vertex import Machine

pytest_plugins = ["tests.fake_vertex"]  # fixtures: make_fake_vertex, trainer_image_python

PROJECT, REGION = "test-project", "us-central1"
# MiniLM on 64 pairs, a global batch of 8 (per_device_train_batch_size is per process: 8 // processes): 16
# optimizer steps, a checkpoint every 4 (and at the epoch end).
JOB = {"data": "sample", "model_name_or_path": "minilm-l6", "max_train_samples": 64, "max_eval_samples": 32,
       "num_train_epochs": 2, "learning_rate": 1e-4, "logging_steps": 2, "save_steps": 4, "precision": "fp32"}
ONE = Machine("n1-standard-4", None, 0)
TWO = Machine("n1-standard-4", None, 0, replica_count=2)


@pytest.fixture
def cloud(make_fake_vertex, trainer_image_python, gcs_bucket):
    fake = make_fake_vertex(run_jobs=True, grace_s=60)
    fake.register_image(TRAINER_IMAGE, trainer_image_python)
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake.endpoint)
    return fake, gcs_bucket, TRAINER_IMAGE


def run_job(cloud, machine: Machine, name: str, out: Path, interrupt: str | None = None,
            kind: str | None = None):
    """Submit the job (on Spot VMs for `kind="spot"`); with `interrupt=replica`, take that replica's VM
    away (`kind`: "spot" or "maintenance") gracefully once the chief has logged step 6, then hard once the
    restarted chief has logged step 12."""
    fake, bucket, image = cloud
    cfg = make_config("smoke", **JOB, per_device_train_batch_size=8 // machine.processes)
    pools = vertex.container_worker_pools(cfg, machine, image)
    job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{bucket}/jobs/{name}", display_name=name,
                                   spot=kind == "spot")
    if interrupt:
        for step, hard in ((6, False), (12, True)):
            wait_for_step(fake, job.resource_name, step)  # in the chief's current attempt
            fake.preempt(job.resource_name, interrupt, kind=kind, hard=hard)
    assert vertex.watch_job(job, poll_s=0.5, timeout_s=600) == "JOB_STATE_SUCCEEDED"
    metrics = vertex.fetch_outputs(job, out / name)
    history = [json.loads(line) for line in (out / name / "history.jsonl").read_text().splitlines()]
    return metrics, history, fake.jobs[job.resource_name]


def wait_for_step(fake, name: str, step: int, timeout: float = 300) -> None:
    """Until the chief (rank 0 prints the progress lines) has logged `step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(s) for s in re.findall(r"^step (\d+)/", fake.replica_log(name, "workerpool0-0"), re.M)]
        if steps and max(steps) >= step:
            return
        assert not fake.jobs[name].done.is_set(), fake.jobs[name].log[-3000:]
        time.sleep(0.05)
    raise TimeoutError(f"{name} never logged step {step}:\n{fake.replica_log(name)[-2000:]}")


def assert_same_run(got, want) -> None:
    (metrics, history, _), (want_metrics, want_history, _) = got, want
    assert [r["step"] for r in history] == [r["step"] for r in want_history]
    assert [r["loss"] for r in history] == [r["loss"] for r in want_history]  # exactly, across the restart
    for split in ("validation_matched", "validation_mismatched"):
        assert metrics[split]["confusion_matrix"] == want_metrics[split]["confusion_matrix"]
        assert metrics[split]["accuracy"] == want_metrics[split]["accuracy"]


@pytest.mark.slow
def test_a_preempted_single_replica_job_resumes_to_the_same_metrics(cloud, tmp_path):
    uninterrupted = run_job(cloud, ONE, "one", tmp_path)
    assert uninterrupted[0]["train"]["steps"] == 16 and uninterrupted[0]["parameters"] > 20e6

    preempted = run_job(cloud, ONE, "one-preempted", tmp_path, interrupt="workerpool0-0", kind="spot")
    log = preempted[2].log
    assert log.count("[fake] workerpool0-0's Spot VM was preempted: the job fails with a STOCKOUT error") == 2
    assert f"exiting {134}" in log  # the trainer's restartable code, after its checkpoint
    graceful = re.search(r"\[workerpool0-0 attempt 2\] resuming from \S+checkpoint-(\d+)", log)
    assert graceful and int(graceful.group(1)) >= 6, log[-3000:]  # the step it stopped at, not a periodic one
    hard = re.search(r"\[workerpool0-0 attempt 3\] resuming from \S+checkpoint-(\d+)", log)
    assert hard and int(hard.group(1)) % 4 == 0, log[-3000:]  # the newest periodic checkpoint
    assert_same_run(preempted, uninterrupted)


@pytest.mark.slow
def test_a_preempted_worker_restarts_the_two_replica_torchrun_job_to_the_same_metrics(cloud, tmp_path):
    uninterrupted = run_job(cloud, TWO, "two", tmp_path)
    assert (uninterrupted[0]["train"]["processes"], uninterrupted[0]["train"]["global_batch"]) == (2, 8)
    body = cloud[0].created_bodies[0]
    assert body["jobSpec"]["scheduling"]["restartJobOnWorkerRestart"] is True  # the default for several replicas

    preempted = run_job(cloud, TWO, "two-preempted", tmp_path, interrupt="workerpool1-0", kind="maintenance")
    log = preempted[2].log
    assert log.count("workerpool1-0 VM maintenance: restarted on another VM") == 2
    assert log.count("restart_job_on_worker_restart: restarting every replica") == 2
    # The launcher's code, not torchrun's 1: the stand-in's metadata server says the VM is stopping for maintenance.
    assert f"[launch] stopped by a signal: exiting {134}" in log
    for attempt in (2, 3):  # after SIGTERM, and after SIGKILL (which may land after the final save: nothing to do)
        assert re.search(rf"\[workerpool0-0 attempt {attempt}\] (resuming from \S+checkpoint-\d+|\S+ holds this run, "
                         "finished: --resume_from_checkpoint auto has nothing to do)", log), log[-3000:]
    assert_same_run(preempted, uninterrupted)


def test_a_job_short_of_gpu_quota_waits_queued_and_says_why(make_fake_vertex, gcs_bucket, capsys):
    fake = make_fake_vertex(run_jobs=True, gpu_quota={"NVIDIA_L4": 0})
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake.endpoint)
    pools = vertex.container_worker_pools(make_config("smoke", **JOB), Machine("g2-standard-8", "NVIDIA_L4", 1),
                                          "us-central1-docker.pkg.dev/p/nli/trainer:1")
    job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/queued", display_name="queued")
    with pytest.raises(vertex.VertexError) as err:
        vertex.watch_job(job, poll_s=0.1, timeout_s=2, queued_notice_s=0.5)
    shown = capsys.readouterr()
    notice = shown.out + shown.err
    assert "queued: JOB_STATE_QUEUED" in notice
    assert "queued is still queued after" in notice and "Custom model training NVIDIA L4 GPUs per region" in notice
    assert f"https://console.cloud.google.com/iam-admin/quotas?project={PROJECT}" in notice
    message = str(err.value)
    assert "is still JOB_STATE_QUEUED after 2 s" in message and "lacks custom-training quota" in message
    assert "watch_job(" in message and "job.cancel()" in message
    job.cancel()
    assert fake.wait(job.resource_name, timeout=30).state.name == "JOB_STATE_CANCELLED"


def test_a_queued_job_starts_when_quota_frees_up(make_fake_vertex, gcs_bucket):
    fake = make_fake_vertex(run_jobs=True, gpu_quota={"NVIDIA_TESLA_T4": 1})
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake.endpoint)
    pools = vertex.container_worker_pools(make_config("smoke", **JOB), Machine("n1-standard-8", "NVIDIA_TESLA_T4", 2),
                                          "us-central1-docker.pkg.dev/p/nli/unpushed:1")
    job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/two-t4")
    deadline = time.monotonic() + 10
    while job.state.name != "JOB_STATE_QUEUED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.state.name == "JOB_STATE_QUEUED"  # two T4s asked, one allowed
    fake.set_quota("NVIDIA_TESLA_T4", 2)
    fake.wait(job.resource_name, timeout=30)
    assert job.state.name == "JOB_STATE_FAILED" and "cannot pull image" in job.error.message  # it ran: no image
