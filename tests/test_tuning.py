"""Hyperparameter tuning: the search-space check, and the tuning job as the fake Vertex AI receives it from the
real aiplatform SDK (the calls notebook 05 makes; the notebook itself runs trials end to end under nbval)."""

from __future__ import annotations

import json

import pytest
from google.cloud import aiplatform
from google.cloud.aiplatform import hyperparameter_tuning as hpt
from google.cloud.aiplatform_v1.types import Scheduling

from localcloud.tuning import created_tuning_bodies
from nli_helpers import files, vertex
from nli_helpers.config import ConfigError, make_config
from tests.tiny_model import tiny_model

pytest_plugins = ["tests.fake_vertex"]

PROJECT, REGION, IMAGE = "test-project", "us-central1", "us-central1-docker.pkg.dev/test-project/nli/trainer:1"


def Double(lo, hi, scale="linear"):  # noqa: N802 - short names for the SDK's specs keep the spaces readable
    return hpt.DoubleParameterSpec(min=lo, max=hi, scale=scale)


def Integer(lo, hi, scale="linear"):  # noqa: N802
    return hpt.IntegerParameterSpec(min=lo, max=hi, scale=scale)


def Discrete(values):  # noqa: N802
    return hpt.DiscreteParameterSpec(values=values, scale="linear")


def Categorical(values):  # noqa: N802
    return hpt.CategoricalParameterSpec(values=values)


# The parameter ids are the trainer's flags: Vertex AI passes each trial's values as --<id>=<value>.
SPACE = {"learning_rate": Double(1e-5, 1e-4, scale="log"), "weight_decay": Double(0.0, 0.1),
         "warmup_ratio": Double(0.0, 0.2), "per_device_train_batch_size": Discrete([16, 32])}
TENSORBOARD = f"projects/{PROJECT}/locations/{REGION}/tensorboards/123"
SERVICE_ACCOUNT = "trainer@test-project.iam.gserviceaccount.com"


# -- the search space ---------------------------------------------------------------------------------------
def test_every_problem_of_a_search_space_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        vertex.validate_search_space({
            "batch_size": Discrete([16, 32]),                      # the old name: not a flag any more
            "output_dir": Categorical(["a", "b"]),                 # not a hyperparameter
            "per_device_train_batch_size": Double(8, 64),          # a float range on an int field
            "learning_rate": Double(0.0, 1e-3, scale="log"),       # 0 is not a learning rate
            "warmup_ratio": Double(0.0, 1.0),                      # 1.0 is not a valid warmup ratio
            "gradient_accumulation_steps": Discrete([1, 2.5]),     # not a whole number
            "precision": Categorical(["fp32", "fp8"]),             # not a precision
        })
    message = str(err.value)
    assert "'batch_size' is not a TrainConfig field (known: profile, model_name_or_path" in message
    assert "'output_dir' cannot be searched" in message
    assert "per_device_train_batch_size: a DoubleParameterSpec does not fit a int field" in message
    assert "learning_rate: value 0.0: learning_rate=0.0 must be > 0" in message
    assert "warmup_ratio: value 1.0: warmup_ratio=1.0 must be in [0, 1)" in message
    assert "gradient_accumulation_steps: an int field: values must be whole numbers" in message
    assert "precision: value 'fp8': precision='fp8' is unknown" in message
    with pytest.raises(ConfigError, match="the search space is empty"):
        vertex.validate_search_space({})
    vertex.validate_search_space(SPACE)  # the default-style space is fine


def test_a_trial_takes_its_values_as_the_trainer_flags_vertex_passes():
    """Vertex AI appends `--<parameter id>=<value>` to a trial's args, discrete values as doubles ("16.0")."""
    from nli_helpers.config import parse_args

    cfg = parse_args(["--profile=smoke", "--per_device_train_batch_size=16.0", "--learning_rate=3e-05"],
                     verbose=False)
    assert (cfg.per_device_train_batch_size, cfg.learning_rate) == (16, 3e-5)


def _custom_job(fake, bucket: str, args: list[str]) -> aiplatform.CustomJob:
    vertex.init_vertex(PROJECT, REGION, f"gs://{bucket}", api_endpoint=fake.endpoint)
    pools = [{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
              "container_spec": {"image_uri": IMAGE, "args": args}}]
    return aiplatform.CustomJob(display_name="nli-trial", worker_pool_specs=pools,
                                base_output_dir=f"gs://{bucket}/hp/1")


# -- the tuning job as the fake receives it -------------------------------------------------------------------
def test_tuning_job_request_body(fake_vertex, gcs_bucket):
    cfg = make_config("smoke", model_name_or_path=tiny_model(), tuning_metric="validation_matched_accuracy")
    searched = ("--learning_rate=", "--weight_decay=", "--warmup_ratio=", "--per_device_train_batch_size=")
    args = [a for a in vertex.job_args(cfg) if not a.startswith(searched)] + ["--checkpoint_every_minutes=10"]
    vertex.validate_search_space(SPACE, cfg)
    job = aiplatform.HyperparameterTuningJob(
        display_name="nli-hp", custom_job=_custom_job(fake_vertex, gcs_bucket, args),
        metric_spec={"validation_matched_accuracy": "maximize"}, parameter_spec=SPACE, max_trial_count=6,
        parallel_trial_count=2, max_failed_trial_count=1, search_algorithm="random",
        measurement_selection="last", labels={"team": "nlp"})
    job.run(sync=False, service_account=SERVICE_ACCOUNT, tensorboard=TENSORBOARD,
            scheduling_strategy=Scheduling.Strategy.SPOT, timeout=7200)
    job.wait_for_resource_creation()

    (body,) = created_tuning_bodies(fake_vertex)
    assert (body["displayName"], body["labels"]) == ("nli-hp", {"team": "nlp"})
    assert (body["maxTrialCount"], body["parallelTrialCount"], body["maxFailedTrialCount"]) == (6, 2, 1)
    study = body["studySpec"]
    assert study["metrics"] == [{"metricId": "validation_matched_accuracy", "goal": 1}]  # 1: MAXIMIZE
    assert study["algorithm"] == 3 and study["measurementSelectionType"] == 1  # RANDOM_SEARCH, LAST_MEASUREMENT
    by_id = {p["parameterId"]: p for p in study["parameters"]}
    assert by_id["learning_rate"]["doubleValueSpec"] == {"minValue": 1e-5, "maxValue": 1e-4}
    assert by_id["learning_rate"]["scaleType"] == 2  # UNIT_LOG_SCALE
    assert by_id["weight_decay"]["doubleValueSpec"] == {"maxValue": 0.1}  # min 0.0: proto3's default, omitted
    assert by_id["per_device_train_batch_size"]["discreteValueSpec"] == {"values": [16.0, 32.0]}
    spec = body["trialJobSpec"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": f"gs://{gcs_bucket}/hp/1"}
    assert (spec["serviceAccount"], spec["tensorboard"]) == (SERVICE_ACCOUNT, TENSORBOARD)
    assert spec["scheduling"]["strategy"] == Scheduling.Strategy.SPOT.value
    assert spec["scheduling"]["timeout"] == "7200s"  # each trial's; Vertex's default is 7 days
    (pool,) = spec["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == IMAGE
    assert f"--model_name_or_path={tiny_model()}" in pool["containerSpec"]["args"]
    assert not any(a.startswith(searched) for a in pool["containerSpec"]["args"])  # each trial sets them
    assert "--tuning_metric=validation_matched_accuracy" in pool["containerSpec"]["args"]
    assert not fake_vertex.unknown_requests
    job.cancel()


def test_a_refused_job_says_what_vertex_said(fake_vertex, gcs_bucket):
    job = aiplatform.HyperparameterTuningJob(
        display_name="nli-hp", custom_job=_custom_job(fake_vertex, gcs_bucket, ["--profile=smoke"]),
        metric_spec={"validation_matched_accuracy": "maximize"}, parameter_spec=SPACE, max_trial_count=2,
        parallel_trial_count=1, search_algorithm="grid")
    job.run(sync=False)
    with pytest.raises(Exception, match=r"grid search needs INTEGER"):
        job.wait_for_resource_creation()


# -- trials, run by the fake ------------------------------------------------------------------------------------
def test_parallel_trials_given_one_checkpoint_dir_keep_to_their_own_folders(fake_vertex_runner, gcs_bucket,
                                                                           monkeypatch):
    """Resuming with `auto` from a shared folder would train one trial on with another's weights and
    hyperparameters: each trial appends its id to a folder its args name."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the cores the fake may share out (host_cores), whatever xdist gave
    from tests.fake_vertex import TRAINER_IMAGE

    shared = f"gs://{gcs_bucket}/shared-checkpoints"
    cfg = make_config("smoke", data="sample", model_name_or_path=tiny_model(), max_train_samples=32,
                      max_eval_samples=32, num_train_epochs=2, checkpoint_dir=shared,
                      tuning_metric="validation_matched_accuracy")
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", api_endpoint=fake_vertex_runner.endpoint)
    pools = [{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
              "container_spec": {"image_uri": TRAINER_IMAGE,
                                 "args": [a for a in vertex.job_args(cfg) if not a.startswith("--learning_rate=")]}}]
    job = aiplatform.HyperparameterTuningJob(
        display_name="nli-hp-folders", metric_spec={"validation_matched_accuracy": "maximize"},
        custom_job=aiplatform.CustomJob(display_name="nli-trial", worker_pool_specs=pools,
                                        base_output_dir=f"gs://{gcs_bucket}/hp/2"),
        parameter_spec={"learning_rate": Double(1e-4, 3e-4, scale="log")}, max_trial_count=2,
        parallel_trial_count=2)
    job.run(timeout=600)
    assert [t.state.name for t in job.trials] == ["SUCCEEDED", "SUCCEEDED"]
    # each trial has a VM on Vertex AI; here the two share the fake's cores from the start (the first, started alone,
    # took all 4, and the two trials then ran 6 threads on 4 cores)
    threads = [fake_vertex_runner.jobs[t.custom_job].replicas["workerpool0-0"].env["OMP_NUM_THREADS"] for t in job.trials]
    assert threads == ["2", "2"]
    fs, root = files.filesystem(shared)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root)) == ["trial-1", "trial-2"]
    for trial in job.trials:  # a complete checkpoint each, and the run folder Vertex AI gave the trial
        (checkpoint,) = fs.ls(f"{root}/trial-{trial.id}")
        assert fs.exists(f"{checkpoint}/manifest.json")
        saved = json.loads(fs.cat_file(f"{gcs_bucket}/hp/2/{trial.id}/model/train_config.json"))
        assert saved["checkpoint_dir"] == f"{shared}/trial-{trial.id}"
        assert saved["learning_rate"] == pytest.approx(trial.parameters[0].value)
