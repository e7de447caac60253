"""The command line as users meet it: every mistake gives one clear message and writes nothing."""

import gzip
import json
import os
import re

import pandas as pd
import pytest

from tests.helpers import ROWS, VERTEX_ENTRY, run_fails, run_task, truncated, write_jsonl


def test_help_lists_every_field_with_its_help():
    from nli_helpers.config import TrainConfig

    proc = run_task("--help")
    assert proc.returncode == 0
    for name in TrainConfig.field_names():
        assert f"--{name.replace('_', '-')}" in proc.stdout


def test_help_answers_before_torch_or_transformers_load():
    """The heavy libraries load after the arguments pass: `--help` and a bad flag answer at once."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    script = ("import sys\nfrom nli_helpers import task\n"
              "for argv in (['--help'], ['--epochs', 'x']):\n"
              "    try:\n        task.main(argv)\n    except SystemExit:\n        pass\n"
              "print(sorted(m for m in ('torch', 'transformers', 'gcsfs') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-500:]


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


@pytest.mark.parametrize("case", ["unknown-label", "empty", "truncated-parquet", "truncated-gzip", "invalid-json-line"])
def test_bad_data_exits_2_with_one_message_and_writes_nothing(tmp_path, case):
    if case == "unknown-label":
        data, message = write_jsonl(tmp_path / "d.jsonl", [{"premise": "a", "hypothesis": "b", "label": "yes"}]), \
            "unknown label value(s) 'yes'"
    elif case == "empty":
        data, message = tmp_path / "d.jsonl", "is empty"
        data.write_bytes(b"")
    elif case == "truncated-parquet":
        pd.DataFrame(ROWS).to_parquet(tmp_path / "full.parquet")
        data, message = tmp_path / "d.parquet", "as parquet"
        data.write_bytes(truncated((tmp_path / "full.parquet").read_bytes()))
    elif case == "truncated-gzip":
        data, message = tmp_path / "d.jsonl.gz", "(gzip)"
        data.write_bytes(truncated(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS * 20).encode())))
    else:
        data, message = write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:2]] + ["{oops"]), \
            "d.jsonl line 3 is not valid JSON"
    job = tmp_path / "job"
    run_fails(job, message, "--data", str(data))
    assert not job.exists()


@pytest.mark.parametrize("case", [
    "under-a-file",
    "a-file",
    pytest.param("in-a-read-only-dir",
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")),
])
def test_unwritable_job_dir(tmp_path, case):
    blocker = tmp_path / "file"
    if case == "under-a-file":
        blocker.write_text("not a directory")
        job = blocker / "job"
    elif case == "a-file":
        job = blocker
        blocker.write_text("not a directory")
    else:
        parent = tmp_path / "read-only"
        parent.mkdir()
        parent.chmod(0o500)
        job = parent / "job"
    try:
        run_fails(job, "cannot be written")
    finally:
        if case == "in-a-read-only-dir":
            parent.chmod(0o700)
    if case != "in-a-read-only-dir":
        assert blocker.read_text() == "not a directory"  # left as it was


def test_a_short_run_writes_every_artefact(tmp_path, tiny_model_dir):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model-name", tiny_model_dir, "--epochs", "1",
                    "--max_train_samples", "64", "--job-dir", str(job), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "train_config.json",
                 "history.jsonl"):
        assert (job / name).is_file(), name
    assert "validation_matched acc" in proc.stdout


def test_on_vertex_the_job_dir_defaults_to_aip_model_dir_and_checkpoints_resume(tmp_path, tiny_model_dir):
    """What the trainer image runs (nli_helpers.vertex.entry): Vertex AI's directories, and a restart resumes."""
    job, checkpoints = tmp_path / "aip", tmp_path / "aip-checkpoints"
    env = {"AIP_MODEL_DIR": str(job), "AIP_CHECKPOINT_DIR": str(checkpoints)}
    args = ("--profile", "smoke", "--model-name", tiny_model_dir, "--epochs", "2", "--max_train_samples", "32",
            "--no-progress")
    proc = run_task(*args, env=env, module=VERTEX_ENTRY)
    assert proc.returncode == 0, proc.stderr
    assert (job / "metrics.json").is_file() and list(checkpoints.glob("checkpoint-*"))
    assert "AIP_CHECKPOINT_DIR is set (Vertex AI): resuming" in proc.stdout
    again = run_task(*args, env=env, module=VERTEX_ENTRY)  # Vertex AI restarts a replica with the same command
    assert again.returncode == 0 and "resuming from " + str(checkpoints) in again.stdout, again.stderr


# -- what a person sees: a bar in a terminal, plain lines in a collected log (a file, a pipe, Cloud Logging) ------
LOGGED_RUN = ("--profile", "smoke", "--data", "sample", "--epochs", "1", "--max_train_samples", "96",
              "--batch_size", "8", "--log_every", "3")  # 12 steps: a line at 3, 6, 9 and 12


def test_a_collected_log_holds_one_plain_line_per_log_interval_and_no_bar(tmp_path, tiny_model_dir):
    proc = run_task(*LOGGED_RUN, "--model-name", tiny_model_dir, "--job-dir", str(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "\r" not in output  # no carriage-return bar, from us or from datasets/transformers
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["3/12", "6/12", "9/12", "12/12"], proc.stdout
    assert all(re.fullmatch(r"step \d+/12 epoch [\d.]+ loss \d+\.\d{4} lr \S+ [\d.]+ examples/s \d+ tokens/s", line)
               for line in lines), lines
    assert len([line for line in proc.stdout.splitlines() if line.startswith("eval step 12/12")]) == 1


def test_a_terminal_gets_the_live_bar_instead(tmp_path, tiny_model_dir):
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from tests.helpers import ROOT

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *LOGGED_RUN, "--model-name", tiny_model_dir,
                             "--job-dir", str(tmp_path / "job")], stdout=follower, stderr=follower, cwd=ROOT)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    seen = b"".join(chunks).decode(errors="replace")
    assert re.search(r"\rtrain: +\d+%.*\| *12/12 ", seen), seen[-3000:]  # tqdm's redrawn bar
    assert not re.search(r"^step \d+/12 ", seen, re.M)
