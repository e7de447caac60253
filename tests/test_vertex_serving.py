"""Serving through the real aiplatform SDK against the fake's Model Registry and endpoints (localcloud/serving.py).

A Model is registered from a model folder in the Cloud Storage emulator, deployed to an endpoint whose container is
the trainer image's stand-in running `python -m nli_helpers.vertex.serve`, and asked for predictions, which must
equal transformers' `pipeline` on the same folder. Refusals follow the API: a deployed model is not deleted, nor an
endpoint with deployed models, and `Endpoint.delete(force=True)` undeploys first.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform

from nli_helpers import files, vertex
from tests.tiny_model import tiny_model

pytest_plugins = ["tests.fake_vertex"]

REGION = "us-central1"
SERVE = ["python", "-m", "nli_helpers.vertex.serve"]
PAIRS = [("A man is playing a guitar on stage.", "A man is performing music."),
         ("A man is playing a guitar on stage.", "Nobody is playing an instrument."),
         ("The museum opens at nine every morning.", "The museum is popular with tourists.")]


def _init(fake, bucket: str) -> None:
    aiplatform.init(project="serving-test", location=REGION, staging_bucket=f"gs://{bucket}",
                    api_endpoint=fake.endpoint, api_transport="rest", credentials=AnonymousCredentials())


def _upload(bucket: str, image: str, **kwargs) -> aiplatform.Model:
    artifact = f"gs://{bucket}/models/tiny"
    files.put(tiny_model(), artifact)
    return aiplatform.Model.upload(display_name="nli-tiny", artifact_uri=artifact, serving_container_image_uri=image,
                                   serving_container_command=SERVE, serving_container_predict_route="/predict",
                                   serving_container_health_route="/health", labels={"tutorial": "nli"}, **kwargs)


def test_the_registry_and_endpoints_answer_as_the_rest_api_shapes_them(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    model = _upload(gcs_bucket, "us-central1-docker.pkg.dev/p/nli/trainer:0.1.0")
    assert model.resource_name.startswith(f"projects/serving-test/locations/{REGION}/models/")
    assert model.labels == {"tutorial": "nli"} and model.uri == f"gs://{gcs_bucket}/models/tiny"
    body = next(r.body for r in fake_vertex.requests if r.path.endswith("models:upload"))
    assert body["model"]["containerSpec"]["command"] == SERVE  # the SDK's own request, parsed by the fake
    endpoint = aiplatform.Endpoint.create(display_name="nli-endpoint", labels={"tutorial": "nli"})
    other = aiplatform.Endpoint.create(display_name="someone-else")
    assert [e.resource_name for e in aiplatform.Endpoint.list(filter='labels.tutorial="nli"')] == [endpoint.resource_name]
    assert {m.resource_name for m in aiplatform.Model.list()} == {model.resource_name}
    with pytest.raises(exceptions.BadRequest, match="cannot pull image"):  # nothing was pushed under that name
        model.deploy(endpoint=endpoint, machine_type="n1-standard-2")
    leftover = aiplatform.Endpoint.create(display_name="nli-left-behind", labels=vertex.TUTORIAL_LABELS)
    assert vertex.remove_endpoints() == [leftover.resource_name]  # only the tutorial's label
    for resource in (endpoint, other, model):
        resource.delete()
    assert not aiplatform.Endpoint.list() and not aiplatform.Model.list()
    assert not fake_vertex.unknown_requests


def test_an_endpoint_predicts_what_the_local_pipeline_predicts(fake_vertex_runner, gcs_bucket, trainer_image_python):
    from transformers import pipeline

    from tests.fake_vertex import TRAINER_IMAGE

    _init(fake_vertex_runner, gcs_bucket)
    model = _upload(gcs_bucket, TRAINER_IMAGE)
    endpoint = model.deploy(machine_type="n1-standard-2")  # creates the endpoint, starts the container
    try:
        (deployed,) = endpoint.list_models()
        prediction = endpoint.predict(instances=[{"premise": p, "hypothesis": h} for p, h in PAIRS])
        assert prediction.deployed_model_id == deployed.id
        local = pipeline("text-classification", model=tiny_model(), device="cpu")
        expected = local([{"text": p, "text_pair": h} for p, h in PAIRS])
        assert [row["label"] for row in prediction.predictions] == [row["label"] for row in expected]
        for row, top in zip(prediction.predictions, expected):
            assert row["probs"][top["label"]] == pytest.approx(top["score"], abs=1e-4)
        with pytest.raises(exceptions.BadRequest, match="hypothesis"):  # the container's one line, passed on
            endpoint.predict(instances=[{"premise": "only a premise"}])
        unknown = urllib.request.Request(f"{fake_vertex_runner.endpoint}/v1/{endpoint.resource_name}:predict",
                                         data=b'{"instances": [], "instance": []}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:  # a field PredictRequest does not have
            urllib.request.urlopen(unknown)
        assert refused.value.code == 400
        # FAILED_PRECONDITION, which REST answers with HTTP 400: the SDK raises BadRequest
        with pytest.raises(exceptions.BadRequest, match="is deployed on"):
            model.delete()
        with pytest.raises(exceptions.BadRequest, match="has deployed models"):
            endpoint.delete()
    finally:
        endpoint.delete(force=True)  # undeploys first, as the SDK documents
    processes = fake_vertex_runner.serving.processes
    assert len(processes) == 1 and processes[0].poll() is not None, "the serving container is still running"
    model.delete()
    assert not aiplatform.Model.list()


def test_a_batch_prediction_job_writes_what_the_endpoint_answers(fake_vertex_runner, gcs_bucket, trainer_image_python):
    import json

    from transformers import pipeline

    from tests.fake_vertex import TRAINER_IMAGE

    _init(fake_vertex_runner, gcs_bucket)
    model = _upload(gcs_bucket, TRAINER_IMAGE)
    instances = [{"premise": p, "hypothesis": h} for p, h in PAIRS]
    fs, path = files.filesystem(f"gs://{gcs_bucket}/batch/in.jsonl")
    fs.pipe_file(path, "".join(json.dumps(i) + "\n" for i in instances).encode())
    job = model.batch_predict(job_display_name="nli-batch", gcs_source=f"gs://{gcs_bucket}/batch/in.jsonl",
                              gcs_destination_prefix=f"gs://{gcs_bucket}/batch/out", machine_type="n1-standard-2",
                              starting_replica_count=1, max_replica_count=1, batch_size=2)  # two requests
    assert job.state.name == "JOB_STATE_SUCCEEDED", job.error
    out = job.output_info.gcs_output_directory
    assert out.startswith(f"gs://{gcs_bucket}/batch/out/prediction-nli-tiny-")
    blobs = [b for b in job.iter_outputs() if b.name.rsplit("/", 1)[-1].startswith("prediction.results")]
    rows = [json.loads(line) for b in blobs for line in b.download_as_text().splitlines()]
    assert [row["instance"] for row in rows] == instances
    expected = pipeline("text-classification", model=tiny_model(), device="cpu")(
        [{"text": p, "text_pair": h} for p, h in PAIRS])
    assert [row["prediction"]["label"] for row in rows] == [row["label"] for row in expected]
    assert all(p.poll() is not None for p in fake_vertex_runner.serving.processes), "a container outlived its job"
    body = next(r.body for r in fake_vertex_runner.requests if r.path.endswith("batchPredictionJobs"))
    assert body["manualBatchTuningParameters"] == {"batchSize": 2}  # the SDK's own request, parsed by the fake

    fs.pipe_file(path, b'{"premise": "only a premise"}\n')
    with pytest.raises(RuntimeError, match="hypothesis"):  # the job fails with the container's one line
        model.batch_predict(job_display_name="nli-batch-bad", gcs_source=f"gs://{gcs_bucket}/batch/in.jsonl",
                            gcs_destination_prefix=f"gs://{gcs_bucket}/batch/out", machine_type="n1-standard-2")


def test_an_interrupted_deploy_cell_of_notebook_07_leaves_no_endpoint(fake_vertex_runner, gcs_bucket, monkeypatch):
    """Notebook 07's deploy cell, run as it stands, interrupted while the model is deployed: its `finally`
    must leave nothing billing."""
    import json
    from pathlib import Path

    from tests.fake_vertex import TRAINER_IMAGE

    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "07_deploy_and_predict.ipynb").read_text())["cells"]
    deploy_cell = "".join(next(c for c in cells if c["id"] == "07-23")["source"])
    assert "model.deploy(" in deploy_cell and "finally:" in deploy_cell

    def interrupted(self, *args, **kwargs):
        assert len(self.list_models()) == 1  # the model is deployed, and billing, when the interrupt comes
        raise KeyboardInterrupt

    _init(fake_vertex_runner, gcs_bucket)
    model = _upload(gcs_bucket, TRAINER_IMAGE)
    monkeypatch.setattr(aiplatform.Endpoint, "predict", interrupted)
    namespace = {"aiplatform": aiplatform, "vertex": vertex, "model": model, "cloud": "practice", "deploy": False,
                 "machine_type": "n1-standard-2", "service_account": None, "hourly": 0.1, "run_dir": Path("deploy-x"),
                 "instances": [{"premise": p, "hypothesis": h} for p, h in PAIRS]}
    with pytest.raises(KeyboardInterrupt):
        exec(deploy_cell, namespace)
    assert not aiplatform.Endpoint.list(), "the interrupted cell left an endpoint"
    assert all(p.poll() is not None for p in fake_vertex_runner.serving.processes), "a container is still serving"


def test_preflight_for_serving_checks_the_prediction_machine_and_the_images_region(gcs_bucket):
    from tests.fake_vertex import TRAINER_IMAGE

    def check(machine_type: str, image: str = TRAINER_IMAGE) -> dict[str, str]:
        checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", image_uri=image, serving=True,
                                  machine=vertex.Machine(machine_type, None, 0), raise_on_failure=False, verbose=False)
        return {c.name: c.status for c in checks}

    sound = check("n1-standard-2")
    assert sound["staging bucket"] != "fail" and (sound["machine"], sound["image/torch"]) == ("ok", "ok"), sound
    assert check("n1-highcpu-2")["machine"] == "fail"  # the configure-compute page lists no such serving machine
    assert check("m1-ultramem-40")["machine"] == "fail"
    assert check("n1-standard-2", TRAINER_IMAGE.replace("us-central1-docker", "us-docker"))["image/torch"] == "fail"
    with pytest.raises(vertex.PreflightError, match="does not serve predictions"):
        vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", image_uri=TRAINER_IMAGE, serving=True,
                         machine=vertex.Machine("n1-highcpu-2", None, 0), verbose=False)
