"""The command line as users meet it: every mistake gives one clear message and writes nothing."""

import json

import pytest

from tests.helpers import run_task


def test_help_lists_every_field_with_its_help():
    from nli_helpers.config import TrainConfig

    proc = run_task("--help")
    assert proc.returncode == 0
    for name in TrainConfig.field_names():
        assert f"--{name.replace('_', '-')}" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--learning_rate", "0"], "learning_rate=0.0 must be > 0"),
    (["--batch_size", "0"], "batch_size=0 must be a positive integer"),
    (["--fraction_of_train_data", "1.5"], "must be a fraction in (0, 1]"),
    (["--data", "no/such/file.jsonl"], "data file no/such/file.jsonl does not exist"),
    (["--model-name", "./no-such-model"], "model directory ./no-such-model does not exist"),
    (["--model-name", "not-a-real-org/not-a-model"], "was not found"),
    (["--precision", "fp16"], "fp16 needs a CUDA GPU"),
])
def test_mistakes_exit_2_with_one_message_and_no_output(tmp_path, args, message):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--job-dir", str(job), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not job.exists()


def test_unknown_label_in_a_file(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "yes"}) + "\n")
    proc = run_task("--profile", "smoke", "--data", str(data), "--job-dir", str(tmp_path / "job"))
    assert proc.returncode == 2 and "unknown label value(s) 'yes'" in proc.stderr
    assert not (tmp_path / "job").exists()


def test_unwritable_job_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_task("--profile", "smoke", "--job-dir", str(blocker / "job"))
    assert proc.returncode == 2 and "is not writable" in proc.stderr


def test_a_short_run_writes_every_artefact(tmp_path, tiny_model_dir):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model-name", tiny_model_dir, "--epochs", "1",
                    "--max_train_samples", "64", "--job-dir", str(job), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "train_config.json",
                 "history.jsonl"):
        assert (job / name).is_file(), name
    assert "validation_matched acc" in proc.stdout


def test_job_dir_defaults_to_aip_model_dir(tmp_path, tiny_model_dir):
    job = tmp_path / "aip"
    proc = run_task("--profile", "smoke", "--model-name", tiny_model_dir, "--epochs", "1",
                    "--max_train_samples", "32", "--no-progress", env={"AIP_MODEL_DIR": str(job)})
    assert proc.returncode == 0, proc.stderr
    assert (job / "metrics.json").is_file()
