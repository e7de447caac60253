"""Vertex AI jobs through the real aiplatform SDK, against tests/fake_vertex.py and the Cloud Storage emulator.

Request bodies are asserted as the fake received them (enums as integers, int64 as strings); the end-to-end
tests run the whole path: build -> stage -> submit -> run (the fake runs the chief replica) -> watch -> fetch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.types import AcceleratorType, Scheduling

import nli_helpers
from localcloud.image import TRAINER_IMAGE
from nli_helpers import files, vertex
from nli_helpers.config import NLIError, make_config, parse_args
from nli_helpers.vertex import Machine, pricing
from tests.helpers import error_without_credentials
from tests.tiny_model import tiny_model

# Fixtures: fake_vertex, fake_vertex_runner, make_fake_vertex, trainer_image_python, sdist_path (shared with
# test_packaging, as is the trainer image's stand-in under them).
pytest_plugins = ["tests.fake_vertex"]

PROJECT, REGION = "test-project", "us-central1"
IMAGE_2_4 = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
TINY_JOB = {"data": "sample", "model_name_or_path": tiny_model(), "max_train_samples": 64, "num_train_epochs": 1}
TENSORBOARD = f"projects/{PROJECT}/locations/{REGION}/tensorboards/123"


def _init(fake, bucket: str) -> None:
    vertex.init_vertex(PROJECT, REGION, f"gs://{bucket}", credentials=AnonymousCredentials(),
                       api_endpoint=fake.endpoint)


def _exists(uri: str) -> bool:
    fs, path = files.filesystem(uri)
    return fs.exists(path)


def _package_pools(package_uri: str, image: str = IMAGE_2_4) -> list[dict]:
    """What the python-package path would submit (the package itself builds none: no prebuilt image runs it)."""
    return [{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
             "python_package_spec": {"executor_image_uri": image, "package_uris": [package_uri],
                                     "python_module": "nli_helpers.vertex.entry",
                                     "args": vertex.job_args(make_config("smoke", **TINY_JOB))}}]


# -- job args, worker pools, tables --------------------------------------------------------------------------
def test_job_args_rebuild_the_config_without_output_dir_and_resume_after_a_restart():
    cfg = make_config("smoke", output_dir="gs://somewhere/else", per_device_train_batch_size=16,
                      learning_rate=3e-5, group_by_length=False, max_train_samples=64, torch_compile=False)
    args = vertex.job_args(cfg)
    assert not any(a.startswith(("--output_dir", "--output-dir")) for a in args)
    assert "--resume_from_checkpoint=auto" in args  # a replica Vertex restarts runs the same command: it continues
    rebuilt = parse_args(args, verbose=False)  # what `python -m nli_helpers.vertex.entry ARGS` will run with
    assert rebuilt.to_dict() == {**cfg.to_dict(), "output_dir": None, "resume_from_checkpoint": "auto"}
    named = make_config("smoke", resume_from_checkpoint="gs://b/run/checkpoints/checkpoint-00000040")
    assert "--resume_from_checkpoint=gs://b/run/checkpoints/checkpoint-00000040" in vertex.job_args(named)


def test_worker_pools_put_one_chief_first_and_the_other_replicas_in_pool_1():
    cfg = make_config("smoke", **TINY_JOB)
    pools = vertex.container_worker_pools(cfg, Machine("n1-standard-8", "NVIDIA_TESLA_T4", 2, replica_count=3),
                                          "gcr.io/p/trainer:1")
    assert [p["replica_count"] for p in pools] == [1, 2]
    for pool in pools:
        assert pool["machine_spec"] == {"machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_TESLA_T4",
                                        "accelerator_count": 2}
        # Several processes: the image's ENTRYPOINT (the trainer) gives way to the torchrun launcher.
        assert pool["container_spec"] == {"image_uri": "gcr.io/p/trainer:1", "command": ["python", "-m",
                                          "nli_helpers.vertex.launch"], "args": ["--", *vertex.job_args(cfg)]}


def test_one_process_runs_the_image_entry_point_and_several_go_through_the_launcher():
    cfg = make_config("smoke", **TINY_JOB)
    for machine in (Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1), Machine("n1-standard-4", None, 0)):
        (pool,) = vertex.container_worker_pools(cfg, machine, "gcr.io/p/trainer:1")
        assert pool["container_spec"] == {"image_uri": "gcr.io/p/trainer:1", "args": vertex.job_args(cfg)}, machine
    for machine in (Machine("n1-standard-8", "NVIDIA_TESLA_T4", 2), Machine("n1-standard-4", None, 0, replica_count=2)):
        (pool, *_) = vertex.container_worker_pools(cfg, machine, "gcr.io/p/trainer:1")
        assert pool["container_spec"]["command"] == ["python", "-m", "nli_helpers.vertex.launch"], machine
        assert pool["container_spec"]["args"] == ["--", *vertex.job_args(cfg)]


@pytest.mark.parametrize("gpu, region, image", [
    (True, "us-central1", "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"),
    (True, "europe-west4", "europe-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"),
    (False, "asia-northeast1", "asia-docker.pkg.dev/vertex-ai/training/pytorch-xla.2-4.py310:latest"),
])
def test_the_newest_prebuilt_image_comes_from_the_multi_region_nearest_the_job(gpu, region, image):
    assert vertex.newest_prebuilt_image_uri(gpu=gpu, region=region) == image


def test_the_package_torch_floor_is_the_one_transformers_enforces():
    import inspect

    from transformers.utils import import_utils

    source = inspect.getsource(import_utils.is_torch_available)
    floor = re.search(r'PyTorch >= ([\d.]+) is required', source).group(1)
    assert str(vertex.package_torch_requirement()) == f">={floor}"  # pyproject.toml's, as installed


def test_no_prebuilt_image_can_run_the_package_and_each_says_to_use_the_container():
    for image in vertex.PREBUILT_PYTORCH_IMAGES.values():
        for name in (image.gpu_image, image.cpu_image):
            problem = vertex.prebuilt_image_problem(f"us-docker.pkg.dev/vertex-ai/training/{name}:latest")
            assert f"torch {image.torch} is outside this package's torch>=2.6" in problem
            assert "Use the custom container instead: build docker/Dockerfile" in problem
    old = vertex.prebuilt_image_problem(IMAGE_2_4, today="2026-07-25")
    assert "end of availability on 2026-07-24" in old
    assert "not a prebuilt Vertex AI training image" in vertex.prebuilt_image_problem("gcr.io/p/trainer:1")
    assert "not a prebuilt" in vertex.prebuilt_image_problem(IMAGE_2_4.replace(":latest", ":20240701"))


@pytest.mark.parametrize("machine, gpu, count, problem", [
    ("n1-standard-8", "NVIDIA_TESLA_T4", 1, None),
    ("n1-standard-8", "NVIDIA_TESLA_V100", 8, None),
    ("n1-standard-8", None, 0, None),
    ("a2-highgpu-2g", "NVIDIA_TESLA_A100", 2, None),
    ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, None),
    ("g2-standard-24", "NVIDIA_L4", 2, None),
    ("a2-highgpu-1g", "NVIDIA_TESLA_T4", 1, 'comes with 1 x NVIDIA_TESLA_A100 attached'),
    ("a3-highgpu-8g", "NVIDIA_H100_80GB", 1, "accelerator_count=8"),
    ("g2-standard-8", None, 0, 'use accelerator_type="NVIDIA_L4"'),
    ("n1-standard-8", "NVIDIA_L4", 1, "n1-* machines take"),
    ("n1-standard-8", "NVIDIA_TESLA_T4", 3, "counts of 1, 2, 4, not 3"),
    ("n1-standard-16", "NVIDIA_TESLA_V100", 8, None),
    ("e2-standard-8", "NVIDIA_TESLA_T4", 1, "cannot take a NVIDIA_TESLA_T4"),
])
def test_accelerator_must_fit_the_machine_type(machine, gpu, count, problem):
    found = pricing.accelerator_problem(machine, gpu, count)
    assert found is None if problem is None else problem in found


def test_cost_estimate_multiplies_the_table_prices():
    est = vertex.estimate_cost("n1-standard-8", "NVIDIA_TESLA_T4", 2, replica_count=3, hours=2)
    per_replica = pricing.MACHINE_PRICES_PER_HOUR["n1-standard-8"] + 2 * pricing.ACCELERATOR_PRICES_PER_HOUR[
        "NVIDIA_TESLA_T4"]
    assert est.per_hour == pytest.approx(3 * per_replica)
    assert est.total == pytest.approx(6 * per_replica)
    # Worked by hand from the table's $0.4370 and $0.4025: (0.437 + 2 x 0.4025) x 3 replicas x 2 h = 7.452
    assert est.total == pytest.approx(7.452)
    text = str(est)
    assert "about $7.45 = " in text and "approximate" in text and pricing.PRICE_SOURCE in text and pricing.PRICE_TABLE_DATE in text
    cpu_only = vertex.estimate_cost("n1-standard-4", hours=10)
    assert cpu_only.total == pytest.approx(10 * pricing.MACHINE_PRICES_PER_HOUR["n1-standard-4"])


def test_h100_machines_are_priced_with_their_gpus_and_a_source():
    est = vertex.estimate_cost("a3-highgpu-8g", "NVIDIA_H100_80GB", 8, hours=2)
    assert est.per_hour == pytest.approx(pricing.MACHINE_PRICES_PER_HOUR["a3-highgpu-8g"])  # GPUs included
    assert "incl. 8 x NVIDIA_H100_80GB" in str(est) and pricing.A3_PRICE_SOURCE in str(est)
    assert 80 < est.per_hour < 130  # $88.49 on Compute Engine x 1.15
    for machine in ("a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"):
        gpus = int(machine[-2])
        assert pricing.accelerator_problem(machine, "NVIDIA_H100_80GB", gpus) is None
        assert vertex.estimate_cost(machine, "NVIDIA_H100_80GB", gpus).per_hour > 0


def test_cost_estimate_refuses_what_the_table_does_not_price():
    with pytest.raises(pricing.PricingError, match="no price for machine type 'a4-highgpu-8g'.*cloud.google.com"):
        vertex.estimate_cost("a4-highgpu-8g", "NVIDIA_B200", 8)
    with pytest.raises(pricing.PricingError, match="no price for accelerator 'NVIDIA_TESLA_K80'"):
        vertex.estimate_cost("n1-standard-8", "NVIDIA_TESLA_K80", 1)


@pytest.mark.parametrize("location, region, status", [
    ("US-CENTRAL1", "us-central1", "ok"),
    ("us-central1", "us-central1", "ok"),
    ("US", "us-central1", "warn"),
    ("EU", "europe-west4", "warn"),
    ("NAM4", "us-central1", "warn"),
    ("US", "europe-west4", "fail"),
    ("EUROPE-WEST4", "us-central1", "fail"),
])
def test_bucket_location_must_suit_the_job_region(location, region, status):
    check = vertex.bucket_location_check(location, region)
    assert check.status == status
    if status == "fail":
        assert f"gcloud storage buckets create gs://BUCKET --location={region}" in check.message


# -- preflight against the Cloud Storage emulator ---------------------------------------------------------------
def test_preflight_passes_a_sound_container_job(gcs_bucket):
    checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", cfg=make_config("smoke", data="sample"),
                              machine=Machine("g2-standard-8", "NVIDIA_L4", 1), image_uri="gcr.io/p/trainer:1-cu126",
                              labels={"team": "nlp", "run": "smoke-1"})
    status = {c.name: c.status for c in checks}
    # The emulator reports every bucket as multi-region US: usable from us-central1, with a warning.
    assert status == {"staging bucket": "warn", "machine": "ok", "image/torch": "ok", "data": "ok", "model": "ok",
                      "batch": "ok", "labels": "ok"}
    assert f"gs://{gcs_bucket}: US contains us-central1" in checks[0].message


def test_practice_modes_bucket_is_in_the_jobs_region_so_preflight_asks_for_no_other(gcs_emulator):
    """LocalCloud's staging bucket: a learner in practice mode is not told to create a bucket that is the stand-in's."""
    from localcloud import LocalCloud

    bucket = gcs_emulator.make_bucket("practice-staging", location=LocalCloud.region)
    checks = vertex.preflight(region=LocalCloud.region, staging_bucket=f"gs://{bucket}", machine=Machine(),
                              image_uri="gcr.io/p/trainer:1", verbose=False)
    assert (checks[0].name, checks[0].status) == ("staging bucket", "ok"), checks[0]
    assert "US-CENTRAL1 is the job's region" in checks[0].message


def test_preflight_reports_every_failure_in_one_error(gcs_emulator, tmp_path):
    local_data = tmp_path / "pairs.jsonl"
    local_data.write_text("{}\n")
    with pytest.raises(vertex.PreflightError) as err:
        vertex.preflight(region=REGION, staging_bucket="gs://no-such-bucket", machine=Machine("a2-highgpu-1g"),
                         cfg=make_config("smoke", data=str(local_data)), image_uri=IMAGE_2_4, labels={"Team": "NLP"})
    message = str(err.value)
    assert "nothing was submitted" in message
    assert "gs://no-such-bucket does not exist: create it in the job's region with `gcloud storage buckets " \
           "create gs://no-such-bucket --location=us-central1`" in message
    assert 'a2-highgpu-1g comes with 1 x NVIDIA_TESLA_A100 attached' in message
    assert f"{IMAGE_2_4} cannot run this package: its torch 2.4" in message  # no prebuilt image runs it
    assert "is a local path the Vertex worker cannot see" in message
    assert "invalid label(s) Team" in message


def _input_check(bucket: str, cfg, name: str = "data", **kwargs):
    checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{bucket}", machine=Machine(), cfg=cfg,
                              image_uri="gcr.io/p/trainer:1", verbose=False, raise_on_failure=False, **kwargs)
    return next(c for c in checks if c.name == name)


def test_a_job_reads_data_from_cloud_storage_and_preflight_checks_the_object_is_there(gcs_bucket, tmp_path):
    bucket = f"gs://{gcs_bucket}"
    missing = _input_check(gcs_bucket, make_config("smoke", data=f"{bucket}/data/none.jsonl"))
    assert missing.status == "fail" and "does not exist: upload the data first (vertex.stage_data" in missing.message
    own = tmp_path / "own pairs.jsonl"
    own.write_text('{"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": "entailment"}\n')
    staged = vertex.stage_data(make_config("smoke", data=str(own)), bucket, tmp_path / "staging")
    assert staged.data == f"{bucket}/data/own pairs.jsonl" and _exists(staged.data)
    assert _input_check(gcs_bucket, staged).status == "ok"
    # What the job can read already stays as it is: the sample in the image, gs://.
    for data in ("sample", staged.data):
        assert vertex.stage_data(make_config("smoke", data=data), bucket, tmp_path).data == data
    typo = _input_check(gcs_bucket, make_config("smoke", data=str(tmp_path / "own-pairs.jsonl")))  # no such file
    assert typo.status == "fail" and "neither a path here nor a gs:// URI or a hub name" in typo.message


def test_a_hub_name_in_a_job_is_refused_unless_the_job_has_internet_access(gcs_bucket, tmp_path):
    """Behind VPC Service Controls a job reaches nothing outside the perimeter: staging, or the user's word."""
    cfg = make_config("smoke", data="someone/their-nli-data", model_name_or_path="someone/their-model")
    for name in ("data", "model"):
        refused = _input_check(gcs_bucket, cfg, name)
        assert refused.status == "fail" and "downloads it from the Hugging Face hub at start" in refused.message
        assert f"vertex.stage_{name}(cfg, 'gs://BUCKET', folder) uploads it" in refused.message
        assert _input_check(gcs_bucket, cfg, name, egress=True).status == "warn"
    # Staging downloads here, once; this machine has no hub, so the download fails with one line.
    with pytest.raises(NLIError, match="could not load 'someone/their-nli-data' from the Hugging Face hub"):
        vertex.stage_data(cfg, f"gs://{gcs_bucket}", tmp_path)
    with pytest.raises(vertex.VertexError, match="could not download model 'someone/their-model' from the Hugging"):
        vertex.stage_model(cfg, f"gs://{gcs_bucket}", tmp_path)


def test_a_model_folder_without_weights_or_tokenizer_is_refused_before_upload(gcs_bucket, tmp_path):
    """What a job or an endpoint would fail on at start, minutes and a machine-hour later: one line first."""
    import shutil

    bucket = f"gs://{gcs_bucket}"
    vertex.check_model_folder(tiny_model())  # config, safetensors weights and a vocabulary: loadable
    for removed, named in [("model.safetensors", "weights (*.safetensors)"), ("vocab.txt", "tokenizer"),
                           ("config.json", "config.json")]:
        folder = tmp_path / f"without-{removed}"
        shutil.copytree(tiny_model(), folder)
        for name in [removed, "tokenizer.json"] if removed == "vocab.txt" else [removed]:
            (folder / name).unlink(missing_ok=True)
        with pytest.raises(vertex.VertexError, match=rf"is not a model folder a job can load: no {re.escape(named)}"):
            vertex.stage_model(make_config("smoke", model_name_or_path=str(folder)), bucket, tmp_path)
        files.put(folder, f"{bucket}/broken/{folder.name}")  # the same answer for a folder already in the bucket
        with pytest.raises(vertex.VertexError, match=re.escape(named)):
            vertex.check_model_folder(f"{bucket}/broken/{folder.name}")
    fs, path = files.filesystem(f"{bucket}/models")
    assert not fs.exists(path), "a refused folder was uploaded"
    with pytest.raises(vertex.VertexError, match="no config.json, weights"):
        vertex.check_model_folder(f"{bucket}/nothing-here")


def test_a_staged_model_folder_is_what_the_trainer_loads_from_cloud_storage(gcs_bucket, tmp_path, capsys):
    from nli_helpers.model import ModelError, load_model_and_tokenizer

    bucket = f"gs://{gcs_bucket}"
    local = make_config("smoke", model_name_or_path=tiny_model())
    assert _input_check(gcs_bucket, local, "model").message.endswith("is a local path the Vertex worker cannot see: "
                                                                    "vertex.stage_model(cfg, 'gs://BUCKET', folder) "
                                                                    "uploads it and passes the gs:// URI")
    staged = vertex.stage_model(local, bucket, tmp_path)
    assert staged.model_name_or_path == f"{bucket}/models/{Path(tiny_model()).name}"
    assert "where the job reads it" in capsys.readouterr().out
    assert _input_check(gcs_bucket, staged, "model").status == "ok"
    assert vertex.stage_model(staged, bucket, tmp_path) == staged  # gs:// and the image's model stay
    assert vertex.stage_model(make_config("smoke"), bucket, tmp_path).model_name_or_path == "minilm-l6"
    model, _ = load_model_and_tokenizer(staged.model_name_or_path)  # through a local copy that is gone after
    reference, _ = load_model_and_tokenizer(tiny_model())
    assert model.config.name_or_path == staged.model_name_or_path  # what its saves record, not the copy
    assert {**model.config.to_dict(), "_name_or_path": ""} == {**reference.config.to_dict(), "_name_or_path": ""}
    with pytest.raises(ModelError, match=f"could not load model '{bucket}/models/none': copying it failed \\(not found"):
        load_model_and_tokenizer(f"{bucket}/models/none")


def test_the_multinli_subset_is_staged_as_the_same_splits(gcs_bucket, tmp_path, mnli_subset):
    staged = vertex.stage_data(make_config("smoke", data="mnli-subset"), f"gs://{gcs_bucket}", tmp_path)
    assert staged.data == f"gs://{gcs_bucket}/data/mnli-subset"  # a folder: one file a split
    from nli_helpers.data import load_nli_splits

    job_reads = load_nli_splits(staged.data)  # what the trainer in the job loads
    assert {name: len(ds) for name, ds in job_reads.items()} == {name: len(ds) for name, ds in mnli_subset.items()}
    assert job_reads["validation_matched"]["premise"] == mnli_subset["validation_matched"]["premise"]


def test_preflight_names_zero_replicas_instead_of_crashing(gcs_bucket):
    with pytest.raises(vertex.PreflightError) as err:
        vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", image_uri="gcr.io/p/trainer:1",
                         machine=Machine("n1-standard-4", None, 0, replica_count=0), cfg=make_config("smoke"))
    assert "replica_count=0 must be >= 1" in str(err.value)


def test_preflight_shows_the_global_batch_and_warns_when_full_leaves_the_recipe(gcs_bucket):
    def batch(machine, cfg):
        checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=machine, cfg=cfg,
                                  image_uri="gcr.io/p/trainer:1", verbose=False, raise_on_failure=False)
        return next(c for c in checks if c.name == "batch")

    # per_device_train_batch_size is per process: the global batch grows with every GPU of every replica.
    three = batch(Machine("g2-standard-8", "NVIDIA_L4", 1, replica_count=3), make_config("full"))
    assert three.status == "warn" and "96 pairs per optimizer step = 3 process(es) x 32 x 1" in three.message
    assert "reference recipe trains at a global batch of 32" in three.message
    eight = batch(Machine("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8), make_config("full", per_device_train_batch_size=4))
    assert eight.status == "ok" and eight.message.startswith("32 pairs per optimizer step = 8 process(es) x 4")
    assert batch(Machine("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8), make_config("smoke")).status == "ok"


def test_preflight_fails_a_bucket_outside_the_job_region(gcs_bucket):
    with pytest.raises(vertex.PreflightError, match="the bucket is in US but the job runs in europe-west4"):
        vertex.preflight(region="europe-west4", staging_bucket=f"gs://{gcs_bucket}", machine=Machine(),
                         image_uri="gcr.io/p/trainer:1", verbose=False)


def test_preflight_refuses_the_newest_prebuilt_image_before_anything_is_created(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    newest = vertex.newest_prebuilt_image_uri()
    with pytest.raises(vertex.PreflightError) as err:
        vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=Machine(), image_uri=newest,
                         verbose=False)
    assert "image/torch: " + newest + " cannot run this package: its torch 2.4" in str(err.value)
    assert "Use the custom container instead" in str(err.value)
    assert fake_vertex.created_bodies == []


def test_the_bucket_check_without_credentials_says_how_to_log_in(tmp_path):
    shown = error_without_credentials(
        tmp_path, "from nli_helpers.vertex import Machine, preflight",
        "preflight(region='us-central1', staging_bucket='gs://b', machine=Machine(), image_uri='gcr.io/p/t:1', "
        "verbose=False)")
    assert "staging bucket: cannot read gs://b: no Google Cloud credentials found" in shown
    assert shown.count("gcloud auth application-default login") == 1
    assert "GOOGLE_APPLICATION_CREDENTIALS" in shown


def test_init_without_credentials_says_how_to_log_in(monkeypatch, tmp_path):
    monkeypatch.delenv(vertex.API_ENDPOINT_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    with pytest.raises(vertex.VertexError, match="gcloud auth application-default login"):
        vertex.init_vertex(PROJECT, REGION, "gs://bucket")


def test_init_takes_every_setting_it_is_not_given_from_the_environment(fake_vertex, gcs_bucket, monkeypatch):
    # What notebooks 04 and 05 rely on in CI: nothing but the environment points them at the fake.
    monkeypatch.setenv(vertex.API_ENDPOINT_ENV, fake_vertex.endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    monkeypatch.setenv("NLI_STAGING_BUCKET", f"gs://{gcs_bucket}")
    cloud = vertex.init_vertex()  # plain HTTP: anonymous
    assert cloud == vertex.VertexSettings("env-project", "us-central1", f"gs://{gcs_bucket}", fake_vertex.endpoint,
                                          f"us-central1-docker.pkg.dev/env-project/nli/trainer:{nli_helpers.__version__}-cu126")
    assert vertex.init_vertex(region="europe-west4", image_uri="gcr.io/p/t:1").image_uri == "gcr.io/p/t:1"
    vertex.init_vertex()
    vertex.submit_custom_job(vertex.container_worker_pools(make_config("smoke"), Machine(), cloud.image_uri),
                             base_output_dir=f"gs://{gcs_bucket}/run-env", expected_hours=1.5)
    (create,) = [r for r in fake_vertex.requests if r.method == "POST"]
    assert create.path == "/v1/projects/env-project/locations/us-central1/customJobs"
    # No job bills for Vertex's default 7 days: twice the hours its cost was estimated for.
    assert fake_vertex.created_bodies[-1]["jobSpec"]["scheduling"]["timeout"] == "10800s"
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    with pytest.raises(vertex.VertexError, match="no Google Cloud project: pass project="):
        vertex.init_vertex()
    monkeypatch.delenv("NLI_STAGING_BUCKET")
    with pytest.raises(vertex.VertexError, match="Vertex needs a gs://BUCKET.*set NLI_STAGING_BUCKET.*--location=us-central1"):
        vertex.init_vertex(PROJECT, REGION, None)


# -- request bodies as the fake receives them -------------------------------------------------------------------
def test_a_job_sends_every_field(fake_vertex, gcs_bucket, capsys, caplog):
    _init(fake_vertex, gcs_bucket)
    cfg = make_config("smoke", **TINY_JOB)
    machine = Machine("n1-standard-8", "NVIDIA_TESLA_T4", 2, replica_count=2)
    pools = vertex.container_worker_pools(cfg, machine, TRAINER_IMAGE)
    base = f"gs://{gcs_bucket}/nli-jobs/run-1"
    job = vertex.submit_custom_job(pools, base_output_dir=base, display_name="nli-smoke-1",
                                   service_account="trainer@test-project.iam.gserviceaccount.com",
                                   labels={"team": "nlp", "profile": "smoke"}, spot=True,
                                   restart_job_on_worker_restart=True, timeout_s=3600, tensorboard=TENSORBOARD)
    # The stand-in's job has no Console page or Cloud Logging: no links to a project that does not exist.
    assert "logs: kept by the local stand-in" in capsys.readouterr().out
    sdk_said = [r.getMessage() for r in caplog.records if r.name == "google.cloud.aiplatform.jobs"]
    assert any("CustomJob created" in m for m in sdk_said), sdk_said
    assert not any("console.cloud.google.com" in m for m in sdk_said), sdk_said

    (body,) = fake_vertex.created_bodies
    assert body["displayName"] == "nli-smoke-1"
    assert body["labels"] == {"team": "nlp", "profile": "smoke"}
    spec = body["jobSpec"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": base}
    assert spec["serviceAccount"] == "trainer@test-project.iam.gserviceaccount.com"
    assert spec["tensorboard"] == TENSORBOARD
    assert spec["scheduling"] == {"restartJobOnWorkerRestart": True, "strategy": Scheduling.Strategy.SPOT.value,
                                  "timeout": "3600s"}
    assert [p["replicaCount"] for p in spec["workerPoolSpecs"]] == ["1", "1"]  # int64 travels as a string
    # On Spot VMs the trainer also checkpoints every few minutes: its config set no budget.
    budget = f"--checkpoint_every_minutes={vertex.SPOT_CHECKPOINT_EVERY_MINUTES}"
    for pool in spec["workerPoolSpecs"]:
        assert pool["machineSpec"] == {"machineType": "n1-standard-8",
                                       "acceleratorType": AcceleratorType.NVIDIA_TESLA_T4.value, "acceleratorCount": 2}
        assert pool["containerSpec"] == {"imageUri": TRAINER_IMAGE,
                                         "command": ["python", "-m", "nli_helpers.vertex.launch"],
                                         "args": ["--", *vertex.job_args(cfg), budget]}
    trainer = parse_args(spec["workerPoolSpecs"][0]["containerSpec"]["args"][1:], verbose=False)
    assert trainer.checkpoint_every_minutes == vertex.SPOT_CHECKPOINT_EVERY_MINUTES
    assert pools[0]["container_spec"]["args"] == ["--", *vertex.job_args(cfg)]  # the caller's
    assert "--max_train_samples=64" in vertex.job_args(cfg)
    assert f"--model_name_or_path={tiny_model()}" in vertex.job_args(cfg)
    assert not fake_vertex.unknown_requests

    assert job.state.name == "JOB_STATE_PENDING"  # the queue-only fake never starts it
    job.cancel()
    assert job.state.name == "JOB_STATE_CANCELLED"
    url = unquote(vertex.logs_url(job))
    assert 'resource.type="ml_job"' in url and f'resource.labels.job_id="{job.name}"' in url
    assert url.endswith(f"?project={PROJECT}")


def test_spot_pools_keep_a_budget_the_config_chose_and_leave_reducers_alone():
    machine = Machine("g2-standard-8", "NVIDIA_L4", 1, replica_count=2)
    for chosen in (0, 30):  # 0 is a choice too: no time-based checkpoints
        cfg = make_config("full", checkpoint_every_minutes=chosen)
        pools = vertex.container_worker_pools(cfg, machine, "gcr.io/p/trainer:1",
                                              reduction_server=vertex.ReductionServer(1))
        assert vertex.spot_worker_pools(pools) == pools
    cfg = make_config("full")
    pools = vertex.container_worker_pools(cfg, machine, "gcr.io/p/trainer:1",
                                          reduction_server=vertex.ReductionServer(1))
    spot = vertex.spot_worker_pools(pools)
    for pool in spot[:2]:  # the chief and the worker run the launcher: `-- ARGS`
        assert parse_args(pool["container_spec"]["args"][1:], verbose=False).checkpoint_every_minutes == \
            vertex.SPOT_CHECKPOINT_EVERY_MINUTES
    assert spot[2] == pools[2] and "args" not in spot[2]["container_spec"]  # Google's reducer image


def test_container_job_without_gpu_has_only_the_timeout_scheduling(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    cfg = make_config("full", num_train_epochs=2)
    pools = vertex.container_worker_pools(cfg, Machine("n1-standard-4", None, 0), "gcr.io/p/trainer:1")
    vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/run-2")
    (body,) = fake_vertex.created_bodies
    (pool,) = body["jobSpec"]["workerPoolSpecs"]
    assert pool == {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                    "containerSpec": {"imageUri": "gcr.io/p/trainer:1", "args": vertex.job_args(cfg)}}
    assert not [a for a in pool["containerSpec"]["args"] if "every_minutes" in a]  # not Spot
    assert body["jobSpec"]["scheduling"] == {"timeout": "7200s"}  # twice the one expected hour
    assert "serviceAccount" not in body["jobSpec"]
    assert body["displayName"].startswith("nli-")


@pytest.mark.parametrize("tensorboard, service_account, problem", [
    ("my-board", "sa@p.iam.gserviceaccount.com", "is not projects/"),
    (f"projects/{PROJECT}/locations/{REGION}/tensorboards/7", None, "needs a service_account"),
])
def test_a_tensorboard_needs_a_resource_name_and_a_service_account(tensorboard, service_account, problem,
                                                                    fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    pools = vertex.container_worker_pools(make_config("full"), Machine("n1-standard-4", None, 0), "gcr.io/p/t:1")
    with pytest.raises(vertex.VertexError, match=r"Vertex AI refused the job \(400\).*" + problem):
        vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/run-3", tensorboard=tensorboard,
                                 service_account=service_account)
    assert not fake_vertex.jobs  # refused on create (rule 11 of localcloud/rules.py): nothing runs


def test_a_refused_job_says_what_vertex_said(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    pools = vertex.container_worker_pools(make_config("smoke"), Machine(), "gcr.io/p/trainer:1")
    pools[0]["replica_count"] = 2  # Vertex refuses a chief pool of two
    with pytest.raises(vertex.VertexError, match=r"Vertex AI refused the job \(400\).*chief.*replica_count 1"):
        vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/run-3")


def test_watch_gives_up_after_its_timeout(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    job = vertex.submit_custom_job(vertex.container_worker_pools(make_config("smoke"), Machine(), "gcr.io/p/t:1"),
                                   base_output_dir=f"gs://{gcs_bucket}/run-4")
    with pytest.raises(vertex.VertexError, match="still JOB_STATE_PENDING after 0.3 s; it keeps running"):
        vertex.watch_job(job, poll_s=0.1, timeout_s=0.3)


def test_watch_raises_with_the_error_and_logs_link_when_a_job_fails(make_fake_vertex, gcs_bucket):
    fake = make_fake_vertex(run_jobs=True)  # runs jobs, but knows no images: the pull fails
    _init(fake, gcs_bucket)
    job = vertex.submit_custom_job(vertex.container_worker_pools(make_config("smoke"), Machine(), "gcr.io/p/nope:1"),
                                   base_output_dir=f"gs://{gcs_bucket}/run-5")
    with pytest.raises(vertex.JobFailedError, match="ended JOB_STATE_FAILED: cannot pull image gcr.io/p/nope:1.*logs:"):
        vertex.watch_job(job.resource_name, poll_s=0.1, timeout_s=60)
    with pytest.raises(vertex.VertexError, match="no metrics.json under .*run-5/model"):
        vertex.fetch_outputs(job, Path("unused"))


# -- the whole path, run by the fake ----------------------------------------------------------------------------
def test_the_fake_refuses_an_image_vertex_does_not_publish(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    pools = _package_pools("gs://b/p.tar.gz", "us-central1-docker.pkg.dev/p/r/my-image:1")
    with pytest.raises(vertex.VertexError, match=r"refused the job \(400\).*not a prebuilt training image"):
        vertex.submit_custom_job(pools, base_output_dir=f"gs://{gcs_bucket}/unpublished")


def test_a_python_package_job_on_the_newest_prebuilt_image_fails_where_pip_would_replace_torch(
        make_fake_vertex, gcs_bucket, sdist_path):
    # What preflight prevents, submitted anyway: the fake reads the staged sdist's own ranges against the image.
    fake = make_fake_vertex(run_jobs=True)
    _init(fake, gcs_bucket)
    package_uri = f"gs://{gcs_bucket}/nli-packages/{sdist_path.name}"
    files.put(sdist_path, package_uri)
    job = vertex.submit_custom_job(_package_pools(package_uri), base_output_dir=f"gs://{gcs_bucket}/nli-jobs/prebuilt")
    with pytest.raises(vertex.JobFailedError, match=r"pip would replace the image's torch 2\.4\.1 with the newest "
                                                    r"torch on PyPI that satisfies torch>=2\.6"):
        vertex.watch_job(job, poll_s=0.2, timeout_s=120)
    assert "the package asks for torch>=2.6" in fake.jobs[job.resource_name].log


def test_a_container_job_trains_the_smoke_model_the_image_carries(fake_vertex_runner, gcs_bucket, tmp_path, capsys):
    _init(fake_vertex_runner, gcs_bucket)
    cfg = make_config("smoke", data="sample", max_train_samples=64, max_eval_samples=64, num_train_epochs=1)
    base = f"gs://{gcs_bucket}/nli-jobs/container"
    vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=Machine(), cfg=cfg,
                     image_uri=TRAINER_IMAGE)
    job = vertex.submit_custom_job(vertex.container_worker_pools(cfg, Machine(), TRAINER_IMAGE), base_output_dir=base,
                                   display_name="nli-e2e")
    assert vertex.watch_job(job, poll_s=0.5, timeout_s=900) == "JOB_STATE_SUCCEEDED"
    shown = capsys.readouterr()
    assert "nli-e2e: JOB_STATE_RUNNING" in shown.err + shown.out and "nli-e2e: JOB_STATE_SUCCEEDED" in shown.err + shown.out
    assert not fake_vertex_runner.unknown_requests  # the SDK used only create and get

    # The trainer wrote to AIP_MODEL_DIR (base/model/), since the args carry no --output_dir.
    assert _exists(f"{base}/model/metrics.json") and _exists(f"{base}/model/model.safetensors")
    metrics = vertex.fetch_outputs(job, tmp_path / "outputs")
    assert metrics["train"]["examples"] == 64 and metrics["parameters"] > 20e6  # MiniLM, from the image
    assert (tmp_path / "outputs" / "model.safetensors").is_file()  # the whole folder, not only the metrics
    assert json.loads((tmp_path / "outputs" / "train_config.json").read_text())["model_name_or_path"] == "minilm-l6"
    # What Cloud Logging would show: plain lines, one per log interval, no carriage-return bar.
    log = fake_vertex_runner.jobs[job.resource_name].log
    assert "\r" not in log and re.search(r"\[workerpool0-0\] step \d+/\d+ epoch [\d.]+ loss [\d.]+ lr", log), log[-2000:]
    assert "[workerpool0-0] eval step" in log


def test_nothing_is_billed_without_a_yes(monkeypatch):
    for name in vertex.jobs.PRACTICE_ENV:
        monkeypatch.delenv(name, raising=False)
    vertex.confirm_submit("practice", False, "submit", "The job")  # the stand-ins: free, always runs
    vertex.confirm_submit("google", True, "submit", "The job")     # asked for
    with pytest.raises(vertex.NotSubmitted) as stopped:
        vertex.confirm_submit("google", False, "submit", "The tuning job")
    # In a notebook the stop shows as its message alone, no traceback: IPython prints _render_traceback_().
    assert stopped.value._render_traceback_() == [
        "Not submitted. The tuning job would bill your Google Cloud project (the cost is printed above). To submit "
        "it, set submit = True in the parameters cell and run from here."]
    with pytest.raises(vertex.VertexError, match="cloud='gcp' is unknown: use 'practice'"):
        vertex.confirm_submit("gcp", True, "submit", "The job")
    monkeypatch.setenv(vertex.API_ENDPOINT_ENV, "http://127.0.0.1:1")
    with pytest.raises(vertex.VertexError, match="NLI_VERTEX_API_ENDPOINT point at the local stand-ins"):
        vertex.check_cloud("google")  # a real submission must not go to the stand-in's emulator by accident


def test_preflight_warns_when_the_image_lives_in_another_region(gcs_bucket):
    def image_note(image_uri: str, region: str = "us-central1") -> str:
        checks = vertex.preflight(region=region, staging_bucket=f"gs://{gcs_bucket}", machine=Machine(), verbose=False,
                                  image_uri=image_uri, raise_on_failure=False)
        return next(c for c in checks if c.name == "image/torch").message

    far = "it lives in europe-west4, the job runs in us-central1: every replica pulls it across regions"
    assert far in image_note("europe-west4-docker.pkg.dev/p/nli/trainer:0.1.0-cu126")
    assert "across regions" in image_note("asia-docker.pkg.dev/p/nli/trainer:0.1.0-cu126")
    for near in ("us-central1-docker.pkg.dev/p/nli/trainer:0.1.0-cu126", "us-docker.pkg.dev/p/nli/trainer:0.1.0-cu126"):
        assert "across regions" not in image_note(near)
    assert "across regions" not in image_note("europe-docker.pkg.dev/p/nli/trainer:0.1.0-cu126", "europe-west4")


def test_g4_machines_carry_their_blackwell_gpu_and_need_the_cu130_image(gcs_bucket):
    g4 = Machine("g4-standard-48", "NVIDIA_RTX_PRO_6000", 1)
    assert AcceleratorType["NVIDIA_RTX_PRO_6000"]  # the SDK's enum has the name preflight accepts

    def status(image_uri: str) -> dict:
        checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", machine=g4, verbose=False,
                                  image_uri=image_uri, raise_on_failure=False)
        return {c.name: (c.status, c.message) for c in checks}

    built_for_blackwell = status("us-central1-docker.pkg.dev/p/nli/trainer:0.1.0-cu130")
    assert built_for_blackwell["machine"][0] == "ok" and built_for_blackwell["image/torch"][0] != "fail"
    default_build = status("us-central1-docker.pkg.dev/p/nli/trainer:0.1.0-cu126")["image/torch"]
    assert default_build[0] == "fail" and "cu130" in default_build[1]
    assert "comes with 2 x NVIDIA_RTX_PRO_6000" in pricing.accelerator_problem("g4-standard-96", "NVIDIA_L4", 1)


@pytest.mark.parametrize("machine_type, gpus, spot, status", [
    ("a3-highgpu-1g", 1, False, "warn"), ("a3-highgpu-4g", 4, False, "warn"),
    ("a3-highgpu-2g", 2, True, "ok"), ("a3-highgpu-8g", 8, False, "ok")])
def test_the_small_a3_sizes_are_flagged_unless_they_run_on_spot(gcs_bucket, machine_type, gpus, spot, status):
    checks = vertex.preflight(region=REGION, staging_bucket=f"gs://{gcs_bucket}", spot=spot, verbose=False,
                              machine=Machine(machine_type, "NVIDIA_H100_80GB", gpus),
                              image_uri="us-central1-docker.pkg.dev/p/nli/trainer:0.1.0-cu126")
    (machine,) = [c for c in checks if c.name == "machine"]
    assert machine.status == status, machine
    if status == "warn":
        assert "only as Spot or Flex-start VMs" in machine.message and "spot=True" in machine.message


def test_the_reduction_server_image_comes_from_the_multi_region_nearest_the_job():
    assert vertex.ReductionServer(1).image_uri == vertex.REDUCTION_SERVER_IMAGE  # us-central1
    europe = vertex.ReductionServer(1, region="europe-west4").worker_pool()["container_spec"]["image_uri"]
    assert europe == "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    assert vertex.reduction_server_image("asia-southeast1").startswith("asia-docker.pkg.dev/vertex-ai-restricted/")
