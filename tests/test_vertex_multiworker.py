"""Multi-worker Vertex AI jobs: chief + workers + Reduction Server pools, what each replica learns from CLUSTER_SPEC,
and a two-node job that the fake runs through `python -m nli_helpers.vertex.launch` (torchrun, gloo on the CPU).

Request bodies are asserted as the fake received them from the real aiplatform SDK (enums as integers, int64 as
strings); the CLUSTER_SPEC of each replica is built from the job the fake stored, as Vertex builds it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from google.cloud.aiplatform_v1.types import AcceleratorType

from localcloud.image import TRAINER_IMAGE
from localcloud.vertex import cluster_spec, replica_names, vertex_env
from nli_helpers import vertex
from nli_helpers.config import make_config
from nli_helpers.vertex import Machine, ReductionServer, launch, pricing
from nli_helpers.vertex.entry import replica_gpus
from nli_helpers.vertex.environment import ClusterSpec
from nli_helpers.vertex.launch import cluster_layout, torchrun_command
from tests.tiny_model import tiny_model

# Fixtures: fake_vertex, fake_vertex_runner (tests/fake_vertex.py over localcloud/).
pytest_plugins = ["tests.fake_vertex"]

PROJECT, REGION = "test-project", "us-central1"
IMAGE = "us-central1-docker.pkg.dev/test-project/nli/trainer:1"
TINY_JOB = {"data": "sample", "model_name_or_path": tiny_model(), "max_train_samples": 64, "max_eval_samples": 64,
            "num_train_epochs": 1}
TWO_L4 = Machine("g2-standard-24", "NVIDIA_L4", 2, replica_count=4)  # 4 nodes x 2 GPUs = 8 processes


def _init(fake, bucket: str) -> None:
    vertex.init_vertex(PROJECT, REGION, f"gs://{bucket}", api_endpoint=fake.endpoint)  # plain HTTP: anonymous


def _submit(fake, bucket, pools, name="nli-multi"):
    _init(fake, bucket)
    job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{bucket}/nli-jobs/{name}", display_name=name)
    (body,) = fake.created_bodies
    return job, body["jobSpec"]["workerPoolSpecs"]


# -- the three pools, as the fake receives them ---------------------------------------------------------------
def test_a_job_sends_chief_workers_and_reduction_server(fake_vertex, gcs_bucket):
    cfg = make_config("smoke", **TINY_JOB)
    pools = vertex.container_worker_pools(cfg, TWO_L4, IMAGE, reduction_server=ReductionServer(replica_count=3))
    _, sent = _submit(fake_vertex, gcs_bucket, pools)

    assert [p["replicaCount"] for p in sent] == ["1", "3", "3"]  # chief, 3 workers, 3 reducers (int64 as strings)
    for pool in sent[:2]:
        assert pool["machineSpec"] == {"machineType": "g2-standard-24", "acceleratorCount": 2,
                                       "acceleratorType": AcceleratorType.NVIDIA_L4.value}
        # Beside reducers DDP's buckets are 64 MB, as Google's Reduction Server page recommends.
        assert pool["containerSpec"] == {"imageUri": IMAGE, "command": ["python", "-m", "nli_helpers.vertex.launch"],
                                         "args": ["--", *vertex.job_args(dataclasses.replace(cfg, ddp_bucket_cap_mb=64))]}
    assert sent[2] == {"machineSpec": {"machineType": "n1-highcpu-16"}, "replicaCount": "3",
                       "containerSpec": {"imageUri": "us-docker.pkg.dev/vertex-ai-restricted/training/"
                                                     "reductionserver:latest"}}
    assert "--max_train_samples=64" in sent[0]["containerSpec"]["args"]
    assert "--ddp_bucket_cap_mb=64" in sent[0]["containerSpec"]["args"]
    assert not fake_vertex.unknown_requests
    without = vertex.container_worker_pools(cfg, TWO_L4, IMAGE)
    assert not any("--ddp_bucket_cap_mb" in a for a in without[0]["container_spec"]["args"])
    chosen = vertex.container_worker_pools(make_config("smoke", ddp_bucket_cap_mb=100), TWO_L4, IMAGE,
                                           reduction_server=ReductionServer(1))
    assert "--ddp_bucket_cap_mb=100" in chosen[0]["container_spec"]["args"]  # the config's choice stands


def test_custom_container_job_overrides_the_entry_point_with_the_launcher(fake_vertex, gcs_bucket):
    cfg = make_config("full", num_train_epochs=2)
    image = IMAGE
    pools = vertex.container_worker_pools(cfg, Machine("a2-highgpu-2g", "NVIDIA_TESLA_A100", 2, replica_count=2),
                                          image, reduction_server=ReductionServer(replica_count=1))
    _, sent = _submit(fake_vertex, gcs_bucket, pools)

    assert [p["replicaCount"] for p in sent] == ["1", "1", "1"]
    beside_reducers = dataclasses.replace(cfg, ddp_bucket_cap_mb=vertex.REDUCTION_SERVER_BUCKET_MB)
    for pool in sent[:2]:
        assert pool["machineSpec"] == {"machineType": "a2-highgpu-2g", "acceleratorCount": 2,
                                       "acceleratorType": AcceleratorType.NVIDIA_TESLA_A100.value}
        assert pool["containerSpec"] == {"imageUri": image, "command": ["python", "-m", "nli_helpers.vertex.launch"],
                                         "args": ["--", *vertex.job_args(beside_reducers)]}
    assert sent[2]["containerSpec"] == {"imageUri": vertex.REDUCTION_SERVER_IMAGE}
    assert sent[2]["machineSpec"] == {"machineType": vertex.REDUCTION_SERVER_MACHINE_TYPE}


def test_a_reduction_server_needs_workers():
    with pytest.raises(vertex.VertexError, match="set replica_count >= 2"):
        vertex.container_worker_pools(make_config("smoke"), Machine(), "gcr.io/p/t:1",
                                      reduction_server=ReductionServer())


# -- what each replica works out from the CLUSTER_SPEC Vertex gives it ------------------------------------------
def test_cluster_spec_of_every_replica_gives_distinct_node_ranks(fake_vertex, gcs_bucket):
    pools = vertex.container_worker_pools(make_config("smoke"), TWO_L4, IMAGE, reduction_server=ReductionServer(2))
    job, _ = _submit(fake_vertex, gcs_bucket, pools)
    proto = fake_vertex.jobs[job.resource_name].proto
    names = replica_names(proto)
    assert names == ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool1-2", "workerpool2-0",
                     "workerpool2-1"]
    hosts = {name: f"cmle-training-{name.rsplit('-', 1)[0]}-{job.name}-{name.rsplit('-', 1)[1]}:2222" for name in names}

    layouts = {name: cluster_layout(cluster_spec(proto, name, hosts)) for name in names}
    # The job spec in CLUSTER_SPEC, in the service's JSON spelling, tells each training replica its GPUs: a replica
    # without them refuses to train.
    job_spec = json.loads(cluster_spec(proto, "workerpool1-0", hosts))["job"]
    assert job_spec["workerPoolSpecs"][1]["machineSpec"] == {"machineType": "g2-standard-24",
                                                             "acceleratorType": "NVIDIA_L4", "acceleratorCount": 2}
    assert replica_gpus(ClusterSpec.parse(cluster_spec(proto, "workerpool1-0", hosts))) == "2 x NVIDIA_L4"
    assert replica_gpus(ClusterSpec.parse(cluster_spec(proto, "workerpool2-0", hosts))) is None  # reducers: none
    chief_host = hosts["workerpool0-0"].split(":")[0]
    training = [layouts[n] for n in names[:4]]
    assert [(lay.role, lay.node_rank) for lay in training] == [("chief", 0), ("worker", 1), ("worker", 2), ("worker", 3)]
    assert {(lay.nnodes, lay.master_addr, lay.master_port) for lay in training} == {(4, chief_host, 2222)}
    assert [layouts[n].role for n in names[4:]] == ["reduction_server", "reduction_server"]  # not torch nodes

    # torchrun on each node: 2 processes per node (2 GPUs), 8 in all, one rendezvous at the chief.
    commands = [torchrun_command(lay, TWO_L4.accelerator_count, ["--profile", "smoke"]) for lay in training]
    for rank, cmd in enumerate(commands):
        assert {"--nnodes=4", f"--node-rank={rank}", "--nproc-per-node=2", f"--master-addr={chief_host}",
                "--master-port=2222"} <= set(cmd)
    # Vertex's own variables count nodes, not processes: WORLD_SIZE=4 and RANK=node rank, never 8 processes.
    env = vertex_env(proto, "workerpool1-2", hosts)
    assert (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"]) == ("4", "3", chief_host)
    assert json.loads(env["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 2}


def test_launcher_reads_the_cluster_spec_from_the_environment(fake_vertex, gcs_bucket, monkeypatch, capsys):
    pools = vertex.container_worker_pools(make_config("smoke"), Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1,
                                                                        replica_count=3), "gcr.io/p/t:1",
                                          reduction_server=ReductionServer(1))
    job, _ = _submit(fake_vertex, gcs_bucket, pools)
    proto = fake_vertex.jobs[job.resource_name].proto
    hosts = {name: f"10.0.0.{i}:2222" for i, name in enumerate(replica_names(proto))}
    for name, role, rank in [("workerpool0-0", "chief", 0), ("workerpool1-1", "worker", 2)]:
        monkeypatch.setenv("CLUSTER_SPEC", cluster_spec(proto, name, hosts))
        assert launch.main(["--dry-run", "--", *pools[0]["container_spec"]["args"][1:]]) == 0
        printed = capsys.readouterr().out
        assert f"[launch] {role} node {rank}/3" in printed and "--master-addr=10.0.0.0" in printed
        assert "--module nli_helpers.vertex.entry --profile=smoke" in printed
    monkeypatch.setenv("CLUSTER_SPEC", cluster_spec(proto, "workerpool2-0", hosts))
    assert launch.main(["--dry-run"]) == 2  # a reducer replica never runs the trainer


# -- preflight and cost --------------------------------------------------------------------------------------
@pytest.mark.parametrize("machine, server, status, message", [
    (Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=2), ReductionServer(2), "ok",
     "2 x n1-highcpu-16 running us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"),
    (Machine("n1-standard-8", None, 0, replica_count=2), ReductionServer(), "fail",
     "NCCL needs GPUs: give the training pools an accelerator_type"),
    (Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=1), ReductionServer(), "fail",
     "set replica_count >= 2"),
    (Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=2), ReductionServer(1, "a2-highgpu-1g"), "fail",
     "reducers run on CPU machines without GPUs"),
])
def test_preflight_checks_the_reduction_server(gcs_bucket, machine, server, status, message):
    image = "us-central1-docker.pkg.dev/p/nli/trainer:1"
    checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=machine, image_uri=image,
                              reduction_server=server, raise_on_failure=False, verbose=False)
    check = next(c for c in checks if c.name == "reduction server")
    assert check.status == status and message in check.message, check
    if status == "fail":
        with pytest.raises(vertex.PreflightError, match="nothing was submitted"):
            vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=machine, image_uri=image,
                             reduction_server=server, verbose=False)


def test_the_reduction_server_needs_its_nccl_plugin_in_the_image_and_the_dockerfile_installs_it(gcs_bucket):
    checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", image_uri="gcr.io/p/t:1",
                              machine=Machine("g2-standard-8", "NVIDIA_L4", 1, replica_count=2),
                              reduction_server=ReductionServer(), verbose=False)
    check = next(c for c in checks if c.name == "reduction server")
    assert "google-reduction-server package): docker/Dockerfile installs it" in check.message
    dockerfile = (Path(__file__).resolve().parents[1] / "docker" / "Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends google-reduction-server" in dockerfile


def test_job_cost_adds_up_every_pool():
    machine = Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=3)
    pools = vertex.container_worker_pools(make_config("smoke"), machine, "gcr.io/p/t:1",
                                          reduction_server=ReductionServer(2, "n1-standard-16"))
    est = vertex.estimate_job_cost(pools, hours=2)
    # By hand from the table: (0.4370 + 0.4025) x (1 chief + 2 workers) + 0.8740 x 2 reducers = 4.2665 $/h; x 2 h
    assert est.per_hour == pytest.approx(4.2665) and est.total == pytest.approx(8.533)
    assert [name for name, _ in est.pools] == ["workerpool0 (chief)", "workerpool1 (workers)",
                                               "workerpool2 (reduction server)"]
    text = str(est)
    assert text.startswith("about $8.53 = ") and "2 x (n1-standard-16 $0.8740/h)" in text
    assert pricing.PRICE_SOURCE in text and pricing.PRICE_TABLE_DATE in text
    with pytest.raises(pricing.PricingError, match="workerpool2 \\(reduction server\\): no price for machine type "
                                                   "'n2-highcpu-32'"):
        vertex.estimate_job_cost(vertex.container_worker_pools(
            make_config("smoke"), machine, "gcr.io/p/t:1", reduction_server=ReductionServer(1, "n2-highcpu-32")))


def test_the_default_reducer_machine_is_priced():
    # The cost estimate of notebook 04's Reduction Server section needs this row in pricing.py.
    assert vertex.REDUCTION_SERVER_MACHINE_TYPE in pricing.MACHINE_PRICES_PER_HOUR


# -- the whole path: two training nodes run by the fake ----------------------------------------------------------
def test_two_node_job_trains_through_torchrun_in_the_trainer_image(fake_vertex_runner, gcs_bucket, tmp_path):
    # The model from the bucket, as a job behind VPC Service Controls reads it: every node copies it (model.py).
    cfg = vertex.stage_model(make_config("smoke", **TINY_JOB), f"gs://{gcs_bucket}", tmp_path)
    machine, server = Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=2), ReductionServer(1)
    vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=machine, cfg=cfg,
                     image_uri=TRAINER_IMAGE, reduction_server=server, verbose=False)
    pools = vertex.container_worker_pools(cfg, machine, TRAINER_IMAGE, reduction_server=server)
    job, sent = _submit(fake_vertex_runner, gcs_bucket, pools, name="two-nodes")
    assert [p["replicaCount"] for p in sent] == ["1", "1", "1"]

    assert vertex.watch_job(job, poll_s=0.5, timeout_s=900) == "JOB_STATE_SUCCEEDED"
    log = fake_vertex_runner.jobs[job.resource_name].log
    assert "[workerpool0-0] [launch] chief node 0/2" in log and "[workerpool1-0] [launch] worker node 1/2" in log
    assert "--shutdown-timeout=300" in log  # time for a checkpoint after a SIGTERM, not torch's 30 s
    assert "workerpool2: 1 replica(s) of us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver" in log
    metrics = vertex.fetch_outputs(job, tmp_path / "out")
    assert metrics["train"]["processes"] == 2  # one DDP run across both nodes, not two separate trainings
    assert metrics["train"]["examples"] == 64
    assert metrics["validation_matched"]["n"] == sum(map(sum, metrics["validation_matched"]["confusion_matrix"]))
