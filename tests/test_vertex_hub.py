"""A Vertex AI job needs no Hugging Face hub: in the stand-in it has none, as behind VPC Service Controls.

The hub's stand-in (localcloud/hub.py) runs on this machine and HF_ENDPOINT names it, as .ci/newcomer starts it, but
the fake gives the job's replicas no route to it (localcloud/vertex.py: HF_HUB_OFFLINE, no HF_ENDPOINT), the way
"Vertex AI won't be able to reach resources outside the perimeter"
(https://cloud.google.com/vertex-ai/docs/general/vpc-service-controls). Preflight refuses the job that names the hub
unless the user declares egress; a job submitted anyway fails at once and bills minutes, not hours. Staged in the
bucket (`vertex.stage_data`, `vertex.stage_model`), the same job trains. Each job goes through the real aiplatform SDK.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localcloud.hub import HubStandIn
from localcloud.image import TRAINER_IMAGE
from nli_helpers import mnli, vertex
from nli_helpers.config import make_config
from nli_helpers.data import MNLI_SUBSET
from nli_helpers.vertex import Machine
from tests.tiny_model import tiny_model

pytest_plugins = ["tests.fake_vertex"]  # fixtures: fake_vertex_runner, trainer_image_python

PROJECT, REGION = "test-project", "us-central1"
# As small as the other jobs that train (test_vertex_multiworker.py's TINY_JOB), on the hub's pairs.
JOB = {"data": MNLI_SUBSET, "model_name_or_path": tiny_model(), "max_train_samples": 64, "max_eval_samples": 32,
       "num_train_epochs": 1}


@pytest.fixture
def dev_matched(request) -> Path:
    """The real MultiNLI file the stand-in serves: $NLI_REAL_DATA (conftest.py's real_data_path), else
    ../shared/data's; where neither is, real_data_path skips (fails under NLI_REQUIRE_REAL_DATA=1)."""
    if os.environ.get("NLI_REAL_DATA") or not mnli.SHARED_FILE.is_file():
        return request.getfixturevalue("real_data_path")
    return mnli.SHARED_FILE


def _run(fake, gcs_bucket: str, cfg, name: str):
    pools = vertex.container_worker_pools(cfg, Machine("n1-standard-4", None, 0), TRAINER_IMAGE)
    job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/nli-jobs/{name}", display_name=name)
    fake.wait(job.resource_name, timeout=900)
    return job, fake.jobs[job.resource_name].log


def test_a_job_has_no_hub_and_trains_on_what_was_staged(fake_vertex_runner, gcs_bucket, dev_matched, tmp_path,
                                                        monkeypatch):
    hub = HubStandIn(dev_matched, tmp_path / "hub")
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # conftest.py sets two
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # this machine reaches the hub; the job must not
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    bucket, cfg = f"gs://{gcs_bucket}", make_config("smoke", **JOB)
    try:
        vertex.init_vertex(PROJECT, REGION, bucket, api_endpoint=fake_vertex_runner.endpoint)
        with pytest.raises(vertex.PreflightError, match="data=mnli-subset: the job downloads it from the Hugging Face"):
            vertex.preflight(region=REGION, staging_bucket=bucket, machine=Machine(), cfg=cfg,
                             image_uri=TRAINER_IMAGE, verbose=False)
        job, log = _run(fake_vertex_runner, gcs_bucket, cfg, "nli-hub")  # submitted anyway: it fails at once
        assert job.state.name == "JOB_STATE_FAILED", log[-3000:]
        assert f"--data {MNLI_SUBSET}:" in log and not hub.requests, log[-3000:]
        staged = vertex.stage_model(vertex.stage_data(cfg, bucket, tmp_path), bucket, tmp_path)
        vertex.preflight(region=REGION, staging_bucket=bucket, machine=Machine(), cfg=staged, image_uri=TRAINER_IMAGE,
                         verbose=False)
        job, log = _run(fake_vertex_runner, gcs_bucket, staged, "nli-staged")
    finally:
        hub.close()
    assert job.state.name == "JOB_STATE_SUCCEEDED", log[-3000:]  # the SDK's get, as watch_job's
    assert f"[workerpool0-0] model: {bucket}/models/{Path(tiny_model()).name} (" in log, log[-3000:]
    assert f"[workerpool0-0] data: {bucket}/data/{MNLI_SUBSET}" in log, log[-3000:]
    metrics = vertex.fetch_outputs(job, tmp_path / "outputs")
    assert json.loads((tmp_path / "outputs" / "train_config.json").read_text())["data"] == staged.data
    assert metrics["train"]["examples"] == 64
