"""The command line as users meet it: every mistake gives one clear message and writes nothing."""

import gzip
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from nli_helpers.config import make_config
from nli_helpers.vertex import entry
from tests.helpers import ROOT, ROWS, VERTEX_ENTRY, run_fails, run_task, truncated, write_jsonl


def error_lines(stderr: str) -> list[str]:
    """The `error:` lines; what follows the first (a list of bad settings) must be indented under it."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert errors and all(line.startswith("  ") for line in lines[errors[0] + 1:]), stderr
    return [lines[i] for i in errors]


def test_help_lists_every_field_with_its_help():
    from nli_helpers.config import TrainConfig

    proc = run_task("--help")
    assert proc.returncode == 0
    for name in TrainConfig.field_names():
        assert f"--{name}" in proc.stdout and f"--{name.replace('_', '-')}" in proc.stdout
    assert "--config FILE" in proc.stdout and "--bf16" in proc.stdout


def test_help_shows_each_flags_default_and_the_profiles_values():
    """Every value a profile sets is in --help beside the field's own default, as run_glue.py shows its defaults."""
    from nli_helpers.config import PROFILE_DEFAULTS

    help_text = " ".join(run_task("--help").stdout.split("options:")[1].split())  # argparse wraps lines
    assert "peak AdamW learning rate; smoke 0.0001 with real data, 0.0002 on the sample, full 2e-05 (default: " \
        "0.0001)" in help_text
    for profile in ("smoke", "smoke_real_data", "full"):
        for name, value in PROFILE_DEFAULTS[profile].items():
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            block = help_text.split(f"--{name.replace('_', '-')} ", 1)[1].split(" --", 1)[0]
            assert shown in block.replace("- ", "-") and "(default: " in block, (profile, name, block)


def test_help_answers_before_torch_loads():
    """The heavy libraries load after the arguments pass: `--help` and a bad flag answer at once (the parser is
    transformers' HfArgumentParser, which loads no torch)."""
    script = ("import sys\nfrom nli_helpers import task\n"
              "for argv in (['--help'], ['--num_train_epochs', 'x']):\n"
              "    try:\n        task.main(argv)\n    except SystemExit:\n        pass\n"
              "print(sorted(m for m in ('torch', 'gcsfs', 'datasets', 'pandas') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-500:]


@pytest.mark.parametrize("args, message", [
    (["--learning_rate", "0"], "learning_rate=0.0 must be > 0"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size=0 must be a positive integer"),
    (["--eval_fraction", "1.5"], "must be a fraction in (0, 1]"),
    (["--data", "no/such/file.jsonl"], "data file no/such/file.jsonl does not exist"),
    (["--model_name_or_path", "./no-such-model"], "could not load model './no-such-model'"),
    (["--model_name_or_path", "not-a-real-org/not-a-model"], "nor reachable on the Hugging Face hub"),
    (["--precision", "fp16"], "fp16 needs a CUDA GPU"),
    (["--num_train_epochs", "x"], "--num_train_epochs/--num-train-epochs: invalid float value: 'x'"),
    (["--job-dir", "out"], "unrecognized arguments: --job-dir out"),  # the old names are gone
    (["--log_level", "loud"], "--log_level/--log-level: invalid choice: 'loud' (choose from 'debug', 'info', "
                              "'warning', 'error', 'critical', 'passive')"),
])
def test_mistakes_exit_2_with_one_message_and_no_output(tmp_path, args, message):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--output_dir", str(job), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not job.exists()


@pytest.mark.parametrize("case", ["unknown-label", "empty", "truncated-parquet", "truncated-gzip", "invalid-json-line"])
def test_bad_data_exits_2_with_one_message_and_writes_nothing(tmp_path, case):
    if case == "unknown-label":
        data, message = write_jsonl(tmp_path / "d.jsonl", [{"premise": "a", "hypothesis": "b", "label": "yes"}]), \
            "'yes'"
    elif case == "empty":
        data, message = tmp_path / "d.jsonl", "is empty"
        data.write_bytes(b"")
    elif case == "truncated-parquet":
        pd.DataFrame(ROWS).to_parquet(tmp_path / "full.parquet")
        data, message = tmp_path / "d.parquet", "as parquet"
        data.write_bytes(truncated((tmp_path / "full.parquet").read_bytes()))
    elif case == "truncated-gzip":
        data, message = tmp_path / "d.jsonl.gz", "d.jsonl.gz"
        data.write_bytes(truncated(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS * 20).encode())))
    else:
        data, message = write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:2]] + ["{oops"]), \
            "line 3"
    job = tmp_path / "job"
    proc = run_fails(job, message, "--data", str(data))
    assert len(error_lines(proc.stderr)) == 1 and str(data.name) in error_lines(proc.stderr)[0], proc.stderr
    assert not job.exists()


@pytest.mark.parametrize("case", [
    "under-a-file",
    "a-file",
    pytest.param("in-a-read-only-dir",
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")),
])
def test_unwritable_output_dir(tmp_path, case):
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
        proc = run_fails(job, "cannot be written")
    finally:
        if case == "in-a-read-only-dir":
            parent.chmod(0o700)
    assert "--output_dir" in proc.stderr
    if case != "in-a-read-only-dir":
        assert blocker.read_text() == "not a directory"  # left as it was


# -- a short run with Hugging Face's flags, and its train_config.json read back with --config ---------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_model_dir):
    job = tmp_path_factory.mktemp("short") / "job"
    proc = run_task("--model_name_or_path", tiny_model_dir, "--data", "sample", "--max_train_samples", "64",
                    "--num_train_epochs", "1", "--per_device_train_batch_size", "16", "--output_dir", str(job),
                    "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, job


def test_a_short_run_writes_every_artefact(short_run):
    proc, job = short_run
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "train_config.json",
                 "history.jsonl"):
        assert (job / name).is_file(), name
    assert "validation_matched acc" in proc.stdout
    assert "batch: 16 pairs per optimizer step = 1 process(es) x 16 x 1 accumulation step(s)" in proc.stdout
    train = json.loads((job / "metrics.json").read_text())["train"]
    assert (train["steps"], train["global_batch"], train["per_process_batch"], train["epochs"]) == (4, 16, 16, 1)


def test_the_saved_train_config_reads_back_as_the_same_config(short_run):
    from nli_helpers.config import TrainConfig, parse_args

    _, job = short_run
    saved = TrainConfig(**json.loads((job / "train_config.json").read_text()))
    assert (saved.num_train_epochs, saved.per_device_train_batch_size, saved.output_dir, saved.data) == (
        1, 16, str(job), "sample")
    assert parse_args(["--config", str(job / "train_config.json")], verbose=False) == saved


def test_a_run_of_a_saved_config_with_a_flag_over_it_imports_no_cloud_code(short_run, tmp_path):
    """`--config <a run's train_config.json>` trains again, the flag over the file winning; a local run loads no
    Cloud Storage code (gcsfs, google.*): sys.modules at the command's end."""
    _, job = short_run
    again = tmp_path / "again"
    script = ("import runpy, sys\n"
              "before = set(sys.modules)  # google and google.cloud: empty namespaces a .pth file makes\n"
              f"sys.argv = ['nli_helpers.task', '--config', {str(job / 'train_config.json')!r}, "
              f"'--output_dir', {str(again)!r}, '--no-progress']\n"
              "try:\n    runpy.run_module('nli_helpers.task', run_name='__main__')\n"
              "except SystemExit as e:\n    assert e.code == 0, e.code\n"
              "print(sorted(m for m in set(sys.modules) - before if m.startswith(('gcsfs', 'google'))))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-500:]
    first, second = (json.loads((d / "train_config.json").read_text()) for d in (job, again))
    assert second == {**first, "output_dir": str(again)}
    assert (again / "metrics.json").is_file()


@pytest.mark.parametrize("text, message", [
    ('{"num_train_epochs": 1, "learnin_rate": 0.1}', "has unknown field(s) learnin_rate"),
    ('{"num_train_epochs": "one"}', "--num_train_epochs/--num-train-epochs: invalid float value: 'one'"),
    ('{"learning_rate": -1}', "learning_rate=-1.0 must be > 0"),
    ('{"num_train_epochs": 1', "could not be read"),
])
def test_a_wrong_config_file_exits_2_with_one_error_line(tmp_path, text, message):
    path = tmp_path / "train.json"
    path.write_text(text)
    job = tmp_path / "job"
    proc = run_task("--config", str(path), "--output_dir", str(job))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not job.exists()


def test_on_vertex_the_output_dir_defaults_to_aip_model_dir_and_checkpoints_resume(tmp_path, tiny_model_dir):
    """What the trainer image runs (nli_helpers.vertex.entry): Vertex AI's directories, and a restart resumes."""
    job, checkpoints = tmp_path / "aip", tmp_path / "aip-checkpoints"
    env = {"AIP_MODEL_DIR": str(job), "AIP_CHECKPOINT_DIR": str(checkpoints)}
    args = ("--profile", "smoke", "--model_name_or_path", tiny_model_dir, "--num_train_epochs", "2",
            "--max_train_samples", "32", "--no-progress")
    proc = run_task(*args, env=env, module=VERTEX_ENTRY)
    assert proc.returncode == 0, proc.stderr
    assert (job / "metrics.json").is_file() and list(checkpoints.glob("checkpoint-*"))
    assert "AIP_CHECKPOINT_DIR is set (Vertex AI): resuming" in proc.stdout
    metrics = (job / "metrics.json").read_bytes()
    again = run_task(*args, env=env, module=VERTEX_ENTRY)  # a restart after the run finished: nothing to do
    assert again.returncode == 0 and "finished: --resume_from_checkpoint auto has nothing to do" in again.stdout
    assert (job / "metrics.json").read_bytes() == metrics
    (job / "metrics.json").unlink()  # as a replica killed before its final save leaves it
    again = run_task(*args, env=env, module=VERTEX_ENTRY)  # Vertex AI restarts a replica with the same command
    assert again.returncode == 0 and "resuming from " + str(checkpoints) in again.stdout, again.stderr



def test_a_run_leaves_nothing_in_tmpdir(tmp_path, tiny_model_dir):
    """torch makes its compile cache folder when transformers imports dynamo: in the package's cache, not TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # this process set it
    proc = subprocess.run([sys.executable, "-m", "nli_helpers.task", "--data", "sample", "--model_name_or_path",
                           tiny_model_dir, "--max_train_samples", "16", "--num_train_epochs", "1", "--output_dir",
                           str(tmp_path / "job"), "--no-progress"], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "TMPDIR": str(tmp), "NLI_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(tmp.iterdir()) == []
    assert (tmp_path / "cache" / "torchinductor").is_dir()


def test_a_quiet_log_level_quiets_the_replicas_resume_line(capsys, tmp_path):
    env = {"AIP_CHECKPOINT_DIR": str(tmp_path)}
    quiet = entry.configure(make_config("smoke", data="sample", log_level="warning"), env)
    assert quiet.resume_from_checkpoint == "auto" and capsys.readouterr().out == ""
    entry.configure(make_config("smoke", data="sample"), env)
    assert "AIP_CHECKPOINT_DIR is set (Vertex AI): resuming" in capsys.readouterr().out

# -- what a person sees: a bar in a terminal, plain lines in a collected log (a file, a pipe, Cloud Logging) ------
LOGGED_RUN = ("--profile", "smoke", "--data", "sample", "--num_train_epochs", "1", "--max_train_samples", "96",
              "--per_device_train_batch_size", "8", "--logging_steps", "3")  # 12 steps: a line at 3, 6, 9 and 12


def test_a_collected_log_holds_one_plain_line_per_log_interval_and_no_bar(tmp_path, tiny_model_dir):
    proc = run_task(*LOGGED_RUN, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "\r" not in output  # no carriage-return bar, from us or from datasets/transformers
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["3/12", "6/12", "9/12", "12/12"], proc.stdout
    assert all(re.fullmatch(r"step \d+/12 epoch [\d.]+ loss \d+\.\d{4} lr \S+ [\d.]+ examples/s \d+ tokens/s [\d.]+ min to go", line)
               for line in lines), lines
    assert len([line for line in proc.stdout.splitlines() if line.startswith("eval step 12/12")]) == 1


def test_a_terminal_gets_the_live_bar_instead(tmp_path, tiny_model_dir):
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *LOGGED_RUN, "--model_name_or_path",
                             tiny_model_dir, "--output_dir", str(tmp_path / "job")], stdout=follower,
                            stderr=follower, cwd=ROOT)
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


# -- --log_level, Trainer's flag: transformers' and datasets' loggers, and from warning up our start-up lines ----
QUIET_RUN = ("--model_name_or_path", "minilm-l6", "--data", "sample", "--num_train_epochs", "1",
             "--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "16",
             "--logging_steps", "1")  # minilm-l6 has no classifier: transformers warns that it starts untrained


@pytest.mark.parametrize("log_level", [None, "error"])
def test_log_level_error_quiets_the_libraries_and_the_start_up_lines_but_not_the_run(tmp_path, log_level):
    job = tmp_path / "job"
    proc = run_task(*QUIET_RUN, "--output_dir", str(job), *(["--log_level", log_level] if log_level else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    start_up = [line.split(":")[0] for line in proc.stdout.splitlines()
                if line.startswith(("note:", "config:", "data:", "model:", "batch:"))]
    if log_level is None:  # the default, passive: as before the flag
        assert "[transformers]" in proc.stderr and "LOAD REPORT" in proc.stderr, proc.stderr[-3000:]
        assert start_up == ["config", "data", "model", "batch"], proc.stdout
    else:
        assert "[transformers]" not in proc.stderr and start_up == [], proc.stdout + proc.stderr
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == ["1/2", "2/2"]
    assert "eval step 2/2" in proc.stdout and f"saved to {job}" in proc.stdout
    assert json.loads((job / "metrics.json").read_text())["train"]["steps"] == 2


def test_log_level_sets_both_libraries_verbosity_as_trainer_does():
    import logging

    import datasets
    import transformers

    from nli_helpers.config import LOG_LEVELS, make_config
    from nli_helpers.run import set_library_output

    libraries = (transformers.utils.logging, datasets.utils.logging)
    before = [(lib.get_verbosity(), lib.is_progress_bar_enabled()) for lib in libraries]
    try:
        for level in LOG_LEVELS:
            for lib in libraries:
                lib.set_verbosity(35)  # a level of no name: passive must leave it as it is
            set_library_output(make_config("smoke", data="sample", log_level=level))
            expected = 35 if level == "passive" else getattr(logging, level.upper())
            assert [lib.get_verbosity() for lib in libraries] == [expected] * 2, level
    finally:
        for lib, (verbosity, bars) in zip(libraries, before):
            lib.set_verbosity(verbosity)
            if bars:
                lib.enable_progress_bar()
