"""A Vertex AI job that downloads MultiNLI from the Hugging Face hub, against the fake with the hub's stand-in running.

A container on Vertex reaches huggingface.co. Here the hub is localcloud/hub.py's stand-in, started as .ci/newcomer
starts it, and the fake passes its HF_ENDPOINT to the job's replicas when the process running the fake names it and is
not offline (localcloud/vertex.py, `hub_env`). The job is submitted through the real aiplatform SDK with
`--data=mnli-subset`, not staged to Cloud Storage, so the trainer in the image's stand-in, where no ../shared/data sits
beside the installed package, must fetch the split from the hub itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localcloud.hub import FILE, REPO, HubStandIn
from localcloud.image import TRAINER_IMAGE
from localcloud.vertex import hub_env
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


def test_the_replicas_get_the_hub_this_process_names_unless_it_is_offline():
    endpoint = "http://127.0.0.1:8765"
    assert hub_env({"HF_ENDPOINT": endpoint}) == {"HF_ENDPOINT": endpoint}
    assert hub_env({"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0"}) == {"HF_ENDPOINT": endpoint}
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert hub_env({}) == offline  # huggingface.co: unreachable from this machine
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        assert hub_env({"HF_ENDPOINT": endpoint, flag: "true"}) == offline, flag


def test_a_job_trains_on_multinli_it_downloads_from_the_hub(fake_vertex_runner, gcs_bucket, dev_matched, tmp_path,
                                                             monkeypatch):
    hub = HubStandIn(dev_matched, tmp_path / "hub")
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # conftest.py sets two
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache: the job must download the split
    try:
        vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake_vertex_runner.endpoint)
        pools = vertex.container_worker_pools(make_config("smoke", **JOB), Machine("n1-standard-4", None, 0),
                                              TRAINER_IMAGE)
        job = vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/nli-jobs/hub",
                                       display_name="nli-hub")
        fake_vertex_runner.wait(job.resource_name, timeout=900)
    finally:
        hub.close()
    log = fake_vertex_runner.jobs[job.resource_name].log
    assert job.state.name == "JOB_STATE_SUCCEEDED", log[-3000:]  # the SDK's get, as watch_job's
    assert hub.requests.count(f"GET /datasets/{REPO}/resolve/{mnli.HUB_REVISION}/{FILE}") == 1  # downloaded
    # The trainer's line naming its data: the subset, read from the hub at the stand-in's address.
    assert (f"[workerpool0-0] data: {MNLI_SUBSET} (MultiNLI dev_matched from the Hugging Face hub ({REPO}, "
            f"validation_matched, via {hub.endpoint};") in log, log[-3000:]
    metrics = vertex.fetch_outputs(job, tmp_path / "outputs")
    assert json.loads((tmp_path / "outputs" / "train_config.json").read_text())["data"] == MNLI_SUBSET
    assert metrics["train"]["examples"] == 64
