"""Hyperparameter tuning: the search-space check, and the tuning job as the fake Vertex AI receives it from the
real aiplatform SDK (the calls notebook 05 makes; the notebook itself runs trials end to end under nbval)."""

from __future__ import annotations

import pytest
from google.cloud import aiplatform
from google.cloud.aiplatform import hyperparameter_tuning as hpt
from google.cloud.aiplatform_v1.types import Scheduling

from localcloud.tuning import created_tuning_bodies
from nli_helpers import vertex
from nli_helpers.config import ConfigError, make_config

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


SPACE = {"learning_rate": Double(1e-5, 1e-4, scale="log"), "weight_decay": Double(0.0, 0.1),
         "warmup_ratio": Double(0.0, 0.2), "batch_size": Discrete([16, 32])}
TENSORBOARD = f"projects/{PROJECT}/locations/{REGION}/tensorboards/123"
SERVICE_ACCOUNT = "trainer@test-project.iam.gserviceaccount.com"


# -- the search space ---------------------------------------------------------------------------------------
def test_every_problem_of_a_search_space_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        vertex.validate_search_space({
            "learnin_rate": Double(1e-5, 1e-4),          # a typo
            "job_dir": Categorical(["a", "b"]),          # not a hyperparameter
            "batch_size": Double(8, 64),                 # a float range on an int field
            "learning_rate": Double(0.0, 1e-3, scale="log"),
            "warmup_ratio": Double(0.0, 1.0),            # 1.0 is not a valid warmup ratio
            "seed": Integer(5, 1),
        })
    message = str(err.value)
    assert "'learnin_rate' is not a TrainConfig field (known: profile, model_name" in message
    assert "'job_dir' cannot be searched" in message
    assert "batch_size: a DoubleParameterSpec does not fit a int field" in message
    assert "learning_rate: a log scale needs min > 0" in message
    assert "warmup_ratio: value 1.0: warmup_ratio=1.0 must be in [0, 1)" in message
    assert "seed: min 5 must be below max 1" in message
    with pytest.raises(ConfigError, match=r"values \[32, 16\] are out of order.*pass \[16, 32\]"):
        vertex.validate_search_space({"batch_size": Discrete([32, 16])})  # the fake refuses it, as Vertex does
    vertex.validate_search_space(SPACE)  # the default-style space is fine


def test_repeated_discrete_or_categorical_values_are_refused_before_anything_is_sent():
    with pytest.raises(ConfigError) as err:
        vertex.validate_search_space({"batch_size": Discrete([16, 16.0, 32]), "precision": Categorical(["fp32", "fp32"]),
                                      "learning_rate": Discrete([1e-4, 1e-4 + 1e-12])})
    message = str(err.value)
    assert "batch_size: values 16.0 repeat: Vertex AI wants distinct values, in increasing order and at least " \
           "1e-10 apart" in message
    assert "precision: values ['fp32'] repeat" in message and "learning_rate: values" in message


def test_batch_sizes_must_split_into_the_accumulation_steps():
    with pytest.raises(ConfigError, match=r"batch_size: value 6: batch_size=6 must be divisible by grad_accum_steps=4"):
        vertex.validate_search_space({"batch_size": Discrete([6, 8])}, make_config("smoke", grad_accum_steps=4))


def _custom_job(fake, bucket: str, args: list[str]) -> aiplatform.CustomJob:
    vertex.init_vertex(PROJECT, REGION, f"gs://{bucket}", api_endpoint=fake.endpoint)
    pools = [{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
              "container_spec": {"image_uri": IMAGE, "args": args}}]
    return aiplatform.CustomJob(display_name="nli-trial", worker_pool_specs=pools,
                                base_output_dir=f"gs://{bucket}/hp/1")


# -- the tuning job as the fake receives it -------------------------------------------------------------------
def test_tuning_job_request_body(fake_vertex, gcs_bucket):
    cfg = make_config("smoke", model_name="tiny-random", tuning_metric="validation_matched_accuracy")
    searched = ("--learning_rate=", "--weight_decay=", "--warmup_ratio=", "--batch_size=")
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
    assert by_id["batch_size"]["discreteValueSpec"] == {"values": [16.0, 32.0]}
    spec = body["trialJobSpec"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": f"gs://{gcs_bucket}/hp/1"}
    assert (spec["serviceAccount"], spec["tensorboard"]) == (SERVICE_ACCOUNT, TENSORBOARD)
    assert spec["scheduling"]["strategy"] == Scheduling.Strategy.SPOT.value
    (pool,) = spec["workerPoolSpecs"]
    assert pool["containerSpec"]["imageUri"] == IMAGE and "--model_name=tiny-random" in pool["containerSpec"]["args"]
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
