"""The hooks: TensorBoard scalars (nli_helpers.tracking) and the hypertune report (nli_helpers.vertex.entry), and the
ones a run attaches (run.default_callbacks, and entry.callbacks on Vertex AI), from a real (tiny) training run.

The event files are read back with TensorBoard's own EventAccumulator; the hypertune file is compared with
what the `cloudml-hypertune` package itself writes.
"""

from __future__ import annotations

import json

import pytest

from nli_helpers import files
from nli_helpers.config import ConfigError, make_config
from nli_helpers.run import default_callbacks, run_training
from nli_helpers.tracking import TensorBoardCallback
from nli_helpers.vertex import entry
from nli_helpers.vertex.entry import HypertuneCallback
from tests.helpers import read_metric_file, read_scalars

TRIAL_ID = "5"


@pytest.fixture(scope="module")
def trial_run(tmp_path_factory, tiny_model_dir):
    """A tuning trial as Vertex AI starts one: only the environment says so; the entry point adds the callbacks (and
    `--report_to tensorboard` the run's own TensorBoard)."""
    tmp = tmp_path_factory.mktemp("trial")
    metric_file = tmp / "hypertune" / "output.metrics"
    cfg = make_config("smoke", model_name_or_path=tiny_model_dir, data="sample", num_train_epochs=1,
                      per_device_train_batch_size=8, max_train_samples=32, eval_steps=2, logging_steps=1,
                      save_total_limit=0, progress=False, output_dir=str(tmp / "job"), report_to="tensorboard")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLOUD_ML_TRIAL_ID", TRIAL_ID)
        mp.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
        mp.delenv("AIP_TENSORBOARD_LOG_DIR", raising=False)
        trial = entry.configure(cfg)  # what the entry point does: its defaults, then its callbacks
        result = run_training(trial, verbose=False, callbacks=entry.callbacks(trial))
    return result, metric_file, tmp / "job" / f"trial-{TRIAL_ID}"  # a trial's own folder under --output_dir


def test_a_trial_reports_the_metric_after_every_evaluation(trial_run):
    result, metric_file, _ = trial_run
    evals = result.metrics["eval_history"]
    assert [e["step"] for e in evals] == [2, 4]  # 32 pairs / batch 8 = 4 steps, eval_steps 2
    lines = [json.loads(line) for line in metric_file.read_text().splitlines()]
    assert len(lines) == len(evals)
    for line, ev in zip(lines, evals):
        assert set(line) == {"timestamp", "trial", "global_step", "checkpoint_path", "validation_matched_accuracy"}
        assert line["trial"] == TRIAL_ID and line["global_step"] == str(ev["step"])
        assert float(line["validation_matched_accuracy"]) == ev["validation_matched"]["accuracy"]
    assert [r["value"] for r in read_metric_file(metric_file, "validation_matched_accuracy")] == \
        [e["validation_matched"]["accuracy"] for e in evals]


def test_tensorboard_events_hold_every_scalar(trial_run):
    result, _, job = trial_run
    scalars = read_scalars(job / "tensorboard")
    steps = [row["step"] for row in result.history]
    assert [s for s, _ in scalars["train/loss"]] == steps
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([row["loss"] for row in result.history], rel=1e-5)
    assert [v for _, v in scalars["train/learning_rate"]] == pytest.approx([row["lr"] for row in result.history])
    timed = [row for row in result.history if "examples_per_s" in row]
    assert [s for s, _ in scalars["throughput/examples_per_s"]] == [row["step"] for row in timed]
    assert [v for _, v in scalars["throughput/tokens_per_s"]] == pytest.approx([row["tokens_per_s"] for row in timed])
    for split in ("validation_matched", "validation_mismatched"):
        for key in ("accuracy", "macro_f1"):
            points = scalars[f"{split}/{key}"]
            assert points == [(e["step"], pytest.approx(e[split][key])) for e in result.metrics["eval_history"]]


def test_a_gcs_log_dir_is_copied_at_each_evaluation(gcs_bucket, tmp_path):
    log_dir = f"gs://{gcs_bucket}/jobs/1/logs/"  # as Vertex AI sets AIP_TENSORBOARD_LOG_DIR
    fs, remote = files.filesystem(log_dir)
    cb = TensorBoardCallback(log_dir)
    cb.on_log([{"step": 1, "loss": 1.1, "lr": 1e-4}, {"step": 2, "loss": 0.9, "lr": 2e-4, "examples_per_s": 50.0,
                                                        "tokens_per_s": 900.0}])
    assert fs.find(remote) == []  # nothing copied before an evaluation
    cb.on_evaluate(2, 0, {"validation_matched": {"accuracy": 0.5, "macro_f1": 0.4}})
    copied = fs.find(remote)
    assert len(copied) == 1 and "events.out.tfevents" in copied[0]
    cb.on_log([{"step": 3, "loss": 0.7, "lr": 1e-4}])
    cb.on_train_end({})
    fs.get(remote.rstrip("/") + "/", str(tmp_path / "logs") + "/", recursive=True)
    scalars = read_scalars(tmp_path / "logs")
    assert scalars["train/loss"] == [(1, pytest.approx(1.1)), (2, pytest.approx(0.9)), (3, pytest.approx(0.7))]
    assert scalars["validation_matched/accuracy"] == [(2, 0.5)]
    assert scalars["throughput/examples_per_s"] == [(2, 50.0)]


def test_default_callbacks_follow_the_config_and_the_environment(tmp_path, monkeypatch):
    cfg = make_config("smoke")
    assert default_callbacks(cfg, str(tmp_path / "job")) == []  # Trainer's default: report to nothing
    reporting = make_config("smoke", report_to="tensorboard")
    local = default_callbacks(reporting, str(tmp_path / "job"))
    assert [type(c) for c in local] == [TensorBoardCallback]
    assert local[0].log_dir == str(tmp_path / "job" / "tensorboard")
    assert not (tmp_path / "job").exists()  # nothing is created before the first log
    assert entry.callbacks(cfg, env={}) == []  # off Vertex AI, the entry point adds nothing
    # A trial known by CLUSTER_SPEC's task.trial alone (Vertex AI's distributed-training page) still reports.
    spec = {"cluster": {"workerpool0": ["workerpool0-0:2222"]}, "environment": "cloud",
            "task": {"type": "workerpool0", "index": 0, "trial": "3"}}
    env = {"CLUSTER_SPEC": json.dumps(spec)}
    [report] = entry.callbacks(entry.configure(cfg, env), env)
    assert isinstance(report, HypertuneCallback) and report.metric == "validation_matched_accuracy"
    env = {"CLUSTER_SPEC": json.dumps({**spec, "task": {"type": "workerpool0"}})}
    assert entry.callbacks(entry.configure(cfg, env), env) == []

    env = {"CLOUD_ML_TRIAL_ID": "2", "AIP_TENSORBOARD_LOG_DIR": "gs://b/hp/2/logs/",
           "CLOUD_ML_HP_METRIC_TAG": "validation_mismatched_accuracy", "CLOUD_ML_HP_METRIC_FILE": str(tmp_path / "m")}
    for name, value in env.items():  # a trial's environment, which cloudml-hypertune reads
        monkeypatch.setenv(name, value)
    board, report = entry.callbacks(entry.configure(cfg))
    assert default_callbacks(reporting, "gs://b/hp/2/model/", given=[board, report]) == []  # Vertex AI's log dir wins
    assert board.log_dir == "gs://b/hp/2/logs/" and board.remote
    assert report.metric == "validation_mismatched_accuracy" and report.reporter.trial_id == "2"
    assert report.path == tmp_path / "m"

    asked = make_config("smoke", tuning_metric="validation_matched_macro_f1")
    _, report = entry.callbacks(entry.configure(asked))
    assert (report.split, report.score) == ("validation_matched", "macro_f1")  # the config wins over the tag


@pytest.mark.parametrize("metric, message", [
    ("test_matched_accuracy", "never on a test split"),
    ("train_accuracy", "must choose on a validation split"),
    ("validation_matched_loss", "score one of accuracy, macro_f1"),
])
def test_a_metric_not_on_a_validation_split_is_refused(metric, message):
    with pytest.raises(ConfigError, match=message):
        HypertuneCallback(metric)


def test_a_missing_split_names_the_splits_there_are(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(tmp_path / "m"))
    cb = HypertuneCallback("validation_mismatched_accuracy")
    with pytest.raises(ConfigError, match="evaluates only validation_matched"):
        cb.on_evaluate(4, 0, {"validation_matched": {"accuracy": 0.5, "macro_f1": 0.5}})


def test_the_hypertune_reporter_is_made_at_the_first_report_on_the_main_process_only(tmp_path, monkeypatch):
    """cloudml-hypertune's HyperTune() runs os.makedirs without exist_ok: every rank of a multi-GPU trial builds the
    callback, so only the one that reports (the main process; TrainLog calls no callback on the others) makes it."""
    metric_file = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
    ranks = [HypertuneCallback("validation_matched_accuracy") for _ in range(2)]
    assert not metric_file.parent.exists()  # building the callbacks touched nothing
    ranks[0].on_evaluate(4, 0, {"validation_matched": {"accuracy": 0.5, "macro_f1": 0.4}})
    assert float(json.loads(metric_file.read_text().splitlines()[-1])["validation_matched_accuracy"]) == 0.5
    assert ranks[0].path == metric_file
