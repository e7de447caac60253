"""Hyperparameter tuning: the search space, the tuning job as the fake Vertex AI receives it and runs it, and the
local papermill sweep (real kernels on a toy notebook).

The tuning-job tests use the real aiplatform SDK against tests/fake_vertex.py (its tuning routes live in
tests/fake_vertex_tuning.py); the trial test runs two real trainer processes that report through the
hypertune file, which the fake reads back into the trials' measurements.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from google.cloud.aiplatform import hyperparameter_tuning as hpt
from google.cloud.aiplatform_v1.types import Scheduling

from localcloud.tuning import created_tuning_bodies
from nli_helpers import plots, storage, sweep, tuning, vertex
from nli_helpers.config import ConfigError, NLIError, make_config
from nli_helpers.vertex import Machine

pytest_plugins = ["tests.fake_vertex"]

PROJECT, REGION, IMAGE = "test-project", "us-central1", "us-central1-docker.pkg.dev/test-project/nli/trainer:1"
CPU = Machine("n1-standard-4", None, 0)


def Double(lo, hi, scale="linear"):  # noqa: N802 - short names for the SDK's specs keep the spaces readable
    return hpt.DoubleParameterSpec(min=lo, max=hi, scale=scale)


def Integer(lo, hi, scale="linear"):  # noqa: N802
    return hpt.IntegerParameterSpec(min=lo, max=hi, scale=scale)


def Discrete(values):  # noqa: N802
    return hpt.DiscreteParameterSpec(values=values, scale="linear")


def Categorical(values):  # noqa: N802
    return hpt.CategoricalParameterSpec(values=values)
SPACE = {"learning_rate": Double(1e-5, 1e-4, scale="log"), "weight_decay": Double(0.0, 0.1),
         "warmup_ratio": Double(0.0, 0.2), "batch_size": Discrete([32, 16])}
TENSORBOARD = f"projects/{PROJECT}/locations/{REGION}/tensorboards/123"
SERVICE_ACCOUNT = "trainer@test-project.iam.gserviceaccount.com"


def _init(fake, bucket: str) -> None:
    vertex.init_vertex(PROJECT, REGION, f"gs://{bucket}", api_endpoint=fake.endpoint)


# -- the search space ---------------------------------------------------------------------------------------
def test_every_problem_of_a_search_space_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        tuning.validate_search_space({
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
    tuning.validate_search_space(SPACE)  # the default-style space is fine


def test_repeated_discrete_or_categorical_values_are_refused_before_anything_is_sent():
    with pytest.raises(ConfigError) as err:
        tuning.validate_search_space({"batch_size": Discrete([16, 32, 16.0]), "precision": Categorical(["fp32", "fp32"]),
                                      "learning_rate": Discrete([1e-4, 1e-4 + 1e-12])})
    message = str(err.value)
    assert "batch_size: values 16.0 repeat: Vertex AI wants distinct values, in increasing order and at least " \
           "1e-10 apart" in message
    assert "precision: values ['fp32'] repeat" in message and "learning_rate: values" in message


def test_batch_sizes_must_split_into_the_accumulation_steps():
    with pytest.raises(ConfigError, match=r"batch_size: value 6: batch_size=6 must be divisible by grad_accum_steps=4"):
        tuning.validate_search_space({"batch_size": Discrete([8, 6])}, make_config("smoke", grad_accum_steps=4))


def test_apply_parameters_casts_what_vertex_reports():
    cfg = tuning.apply_parameters(make_config("smoke"), {"batch_size": 16.0, "learning_rate": 3e-5})
    assert cfg.batch_size == 16 and isinstance(cfg.batch_size, int) and cfg.learning_rate == 3e-5


# -- the tuning job as the fake receives it -------------------------------------------------------------------
def test_tuning_job_request_body(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    cfg = make_config("smoke", model_name="tiny-random", learning_rate=2e-4, batch_size=16, epochs=1)
    base = f"gs://{gcs_bucket}/hp/1"
    job = tuning.build_tuning_job(cfg, CPU, SPACE, image_uri=IMAGE, base_output_dir=base, goal="maximize",
                                  max_trial_count=6, parallel_trial_count=2, max_failed_trial_count=1,
                                  search_algorithm="random", measurement_selection="last", display_name="nli-hp",
                                  labels={"team": "nlp"})
    job = tuning.submit_tuning_job(job, service_account=SERVICE_ACCOUNT, tensorboard=TENSORBOARD, spot=True,
                                   timeout_s=7200)

    (body,) = created_tuning_bodies(fake_vertex)
    assert (body["displayName"], body["labels"]) == ("nli-hp", {"team": "nlp"})
    assert (body["maxTrialCount"], body["parallelTrialCount"], body["maxFailedTrialCount"]) == (6, 2, 1)
    study = body["studySpec"]
    assert study["metrics"] == [{"metricId": "validation_matched_accuracy", "goal": 1}]  # 1: MAXIMIZE
    assert study["algorithm"] == 3 and study["measurementSelectionType"] == 1  # RANDOM_SEARCH, LAST_MEASUREMENT
    assert study["parameters"] == [
        {"parameterId": "learning_rate", "doubleValueSpec": {"minValue": 1e-5, "maxValue": 1e-4}, "scaleType": 2},
        {"parameterId": "weight_decay", "doubleValueSpec": {"maxValue": 0.1}, "scaleType": 1},  # min 0.0: proto3's
        {"parameterId": "warmup_ratio", "doubleValueSpec": {"maxValue": 0.2}, "scaleType": 1},  # default, omitted
        {"parameterId": "batch_size", "discreteValueSpec": {"values": [16.0, 32.0]}, "scaleType": 1},
    ]  # scale 1: UNIT_LINEAR_SCALE, 2: UNIT_LOG_SCALE; discrete values sorted, as Vertex requires
    spec = body["trialJobSpec"]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": base}
    assert (spec["serviceAccount"], spec["tensorboard"]) == (SERVICE_ACCOUNT, TENSORBOARD)
    assert spec["scheduling"] == {"strategy": Scheduling.Strategy.SPOT.value, "timeout": "7200s"}
    (pool,) = spec["workerPoolSpecs"]
    args = pool["containerSpec"]["args"]
    assert pool["containerSpec"]["imageUri"] == IMAGE and "--model_name=tiny-random" in args
    assert "--hypertune_metric=validation_matched_accuracy" in args
    # A Spot trial checkpoints every few minutes too.
    assert args[-1] == f"--checkpoint_every_minutes={vertex.SPOT_CHECKPOINT_EVERY_MINUTES}"
    assert not [a for a in args if a.startswith(("--learning_rate", "--weight_decay", "--warmup_ratio", "--batch_size"))]
    assert not fake_vertex.unknown_requests

    assert job.state.name == "JOB_STATE_PENDING"  # the queue-only fake never starts it
    job.cancel()
    assert job.state.name == "JOB_STATE_CANCELLED"


def test_mistakes_are_caught_before_anything_is_sent(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    cfg, base = make_config("smoke"), f"gs://{gcs_bucket}/hp/2"
    with pytest.raises(ConfigError, match="never on a test split"):
        tuning.build_tuning_job(cfg, CPU, SPACE, image_uri=IMAGE, base_output_dir=base, metric="test_matched_accuracy")
    with pytest.raises(ConfigError, match="parallel_trial_count"):
        tuning.build_tuning_job(cfg, CPU, SPACE, image_uri=IMAGE, base_output_dir=base, max_trial_count=2,
                                parallel_trial_count=3)
    job = tuning.build_tuning_job(cfg, CPU, SPACE, image_uri=IMAGE, base_output_dir=base)
    with pytest.raises(vertex.VertexError, match="needs service_account"):
        tuning.submit_tuning_job(job, tensorboard=TENSORBOARD)
    with pytest.raises(vertex.VertexError, match="not a Vertex AI TensorBoard resource name"):
        tuning.submit_tuning_job(job, tensorboard="my-board", service_account=SERVICE_ACCOUNT)
    assert fake_vertex.requests == []


def test_a_refused_job_says_what_vertex_said(fake_vertex, gcs_bucket):
    _init(fake_vertex, gcs_bucket)
    job = tuning.build_tuning_job(make_config("smoke"), CPU, SPACE, image_uri=IMAGE,
                                  base_output_dir=f"gs://{gcs_bucket}/hp/3", search_algorithm="grid")
    with pytest.raises(vertex.VertexError, match=r"refused the tuning job \(400\).*grid search needs INTEGER"):
        tuning.submit_tuning_job(job)


# -- trials run by the fake ---------------------------------------------------------------------------------------
def test_trials_train_report_and_come_back_as_a_table(make_fake_vertex, gcs_bucket, tmp_path):
    fake = make_fake_vertex(run_jobs=True)
    fake.register_image(IMAGE, Path(sys.executable))  # this venv stands in for the trainer image
    _init(fake, gcs_bucket)
    cfg = make_config("smoke", model_name="tiny-random", epochs=1, max_train_samples=32, eval_every=2,
                      keep_checkpoints=0)
    space = {"learning_rate": Double(1e-4, 1e-3, scale="log"), "batch_size": Discrete([8, 16])}
    base = f"gs://{gcs_bucket}/hp/run"
    job = tuning.build_tuning_job(cfg, CPU, space, image_uri=IMAGE, base_output_dir=base, max_trial_count=2,
                                  parallel_trial_count=1)
    job = tuning.submit_tuning_job(job)
    assert vertex.watch_job(job, poll_s=0.5, timeout_s=600, progress=False) == "JOB_STATE_SUCCEEDED"

    results = tuning.tuning_results(job)
    assert results.attrs["metric"] == "validation_matched_accuracy" and results.attrs["goal"] == "maximize"
    assert list(results["trial"]) == [1, 2] and set(results["state"]) == {"SUCCEEDED"}
    # The fake's suggestions: the ends of the log range, the discrete values in turn.
    assert list(results["learning_rate"]) == pytest.approx([1e-4, 1e-3]) and list(results["batch_size"]) == [8, 16]
    # 32 pairs: batch 8 -> 4 steps, evaluated at 2 and 4; batch 16 -> 2 steps, evaluated at 2.
    assert list(results["reports"]) == [2, 1]
    for _, row in results.iterrows():
        child = fake.jobs[row["custom_job"]].proto.job_spec.worker_pool_specs[0].container_spec
        assert child.args[-2:] == [f"--learning_rate={row['learning_rate']}", f"--batch_size={row['batch_size']}"]
        metrics = json.loads(storage.download(f"{base}/{row['trial']}/model/metrics.json", tmp_path).read_text())
        assert metrics["train"]["steps"] == 32 // row["batch_size"]
        assert row["validation_matched_accuracy"] == metrics["validation_matched"]["accuracy"]  # final = last eval here
    best = sweep.best_trial(results)
    assert best["validation_matched_accuracy"] == results["validation_matched_accuracy"].max()
    assert tuning.apply_parameters(cfg, best[list(space)].to_dict()).batch_size == best["batch_size"]


# -- the local sweep (papermill) ------------------------------------------------------------------------------------
TOY_PARAMETERS = "learning_rate = 1e-4  # peak learning rate\nbatch_size = 16  # pairs per step\njob_dir = None  # out"
TOY_RUN = """import json, pathlib
assert learning_rate < 1, "the loss diverged"
out = pathlib.Path(job_dir)
out.mkdir(parents=True, exist_ok=True)
scores = {"validation_matched": {"accuracy": 0.5 + learning_rate}, "validation_mismatched": {"accuracy": 0.25}}
(out / "metrics.json").write_text(json.dumps(scores))"""


@pytest.fixture
def toy_notebook(tmp_path) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    params = nbformat.v4.new_code_cell(TOY_PARAMETERS, metadata={"tags": ["parameters"]})
    nb.cells = [params, nbformat.v4.new_code_cell(TOY_RUN)]
    path = tmp_path / "nb" / "01_toy.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


def test_local_sweep_gathers_one_row_per_run(toy_notebook, tmp_path):
    out = tmp_path / "sweep"
    results = sweep.local_sweep(toy_notebook, {"learning_rate": [0.1, 0.2, 5.0]}, {"batch_size": 8}, out,
                                 echo=lambda *a, **k: None)
    assert list(results["run"]) == ["run-01", "run-02", "run-03"]
    assert list(results["status"]) == ["ok", "ok", "failed"]
    assert list(results["validation_matched_accuracy"][:2]) == pytest.approx([0.6, 0.7])
    assert list(results["validation_mismatched_accuracy"][:2]) == [0.25, 0.25]
    assert "the loss diverged" in results["error"][2] and (results["seconds"] > 0).all()
    for _, row in results.iterrows():
        assert Path(row["notebook"]) == out / row["run"] / "01_toy.ipynb" and Path(row["notebook"]).is_file()
        cells = nbformat.read(row["notebook"], as_version=4).cells
        (injected,) = [c.source for c in cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert f"learning_rate = {row['learning_rate']}" in injected and "batch_size = 8" in injected
    assert (out / "sweep.csv").read_text().count("\n") == 4
    assert sweep.best_trial(results)["learning_rate"] == 0.2  # the failed run is never the best
    fig = plots.tuning_results(results)
    assert [ax.get_xlabel() for ax in fig.axes] == ["learning_rate"]


def test_local_sweep_refuses_names_the_notebook_does_not_declare(toy_notebook, tmp_path):
    with pytest.raises(NLIError, match="01_toy.ipynb does not declare epochs"):
        sweep.local_sweep(toy_notebook, {"epochs": [1, 2]}, out_dir=tmp_path / "s")
    with pytest.raises(NLIError, match="unknown notebook parameter"):
        sweep.local_sweep(toy_notebook, {"learning_rate": [0.1]}, {"epoch": 1}, tmp_path / "s")
    assert not (tmp_path / "s").exists()
