"""Faults: SIGTERM and SIGKILL mid-run, resume, non-finite loss, a full disk (a real small tmpfs) during a
checkpoint write and during the final save.

The trainer runs as a real subprocess. The model is the tiny test BERT with dropout switched back
on, so an exact resume also needs the RNG state restored, not only weights and optimizer.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nli_helpers.checkpoint import MANIFEST, latest_checkpoint
from nli_helpers.vertex.environment import RESTARTABLE_EXIT_CODE
from tests.helpers import ROOT, VERTEX_ENTRY, on_a_small_disk, run_task, vm_metadata
from tests.tiny_model import tiny_model


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory) -> str:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("dropout-model")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model(), hidden_dropout_prob=0.1,
                                                               attention_probs_dropout_prob=0.1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model()).save_pretrained(out)
    return str(out)


def args(job_dir: Path, model: str, *extra: str) -> list[str]:
    return ["--profile", "smoke", "--data", "sample", "--model_name_or_path", model, "--num_train_epochs", "3",
            "--per_device_train_batch_size", "4", "--precision", "fp32", "--save_steps", "5",
            "--save_total_limit", "3", "--logging_steps", "1", "--no-progress", "--output_dir", str(job_dir),
            *extra]


def read(job_dir: Path):
    history = [json.loads(line) for line in (job_dir / "history.jsonl").read_text().splitlines()]
    return history, json.loads((job_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(dropout_model, tmp_path_factory):
    job = tmp_path_factory.mktemp("uninterrupted") / "job"
    proc = run_task(*args(job, dropout_model))
    assert proc.returncode == 0, proc.stderr
    return read(job)


def start_and_interrupt(job: Path, model: str, sig: int, env: dict | None = None,
                        module: str = "nli_helpers.task") -> tuple[int, str]:
    """Start training, wait for a random number of checkpoints, then send `sig` at a random moment.

    Returns the exit code and stderr.
    """
    log = job.parent / "stderr.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", module, *args(job, model)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **(env or {})})
        _interrupt(proc, job, sig)
    return proc.returncode, log.read_text()


def _interrupt(proc: subprocess.Popen, job: Path, sig: int) -> None:
    wanted = random.randint(1, 6)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list((job / "checkpoints").glob(f"checkpoint-*/{MANIFEST}"))) >= min(wanted, 3):
            latest = latest_checkpoint(str(job / "checkpoints"))
            if latest and int(latest.rsplit("-", 1)[1]) >= 5 * wanted:
                break
        time.sleep(0.02)
    time.sleep(random.uniform(0, 0.3))
    assert proc.poll() is None, "training finished before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(timeout=300)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_interrupted_run_resumes_to_the_same_curve_and_metrics(sig, dropout_model, uninterrupted, tmp_path):
    job = tmp_path / "job"
    # What the trainer image runs on Vertex AI: a SIGTERM while the VM is being preempted ends in the exit code
    # Vertex AI retries.
    with vm_metadata("spot") as metadata:
        returncode, stderr = start_and_interrupt(job, dropout_model, sig, env=metadata, module=VERTEX_ENTRY)
    if sig == signal.SIGTERM:
        assert returncode == RESTARTABLE_EXIT_CODE == 134, stderr[-2000:]
        assert "Rerun with --resume_from_checkpoint auto" in stderr
    else:
        assert returncode == -signal.SIGKILL
    assert not (job / "metrics.json").exists()  # nothing that could pass for a result
    stopped_at = int(latest_checkpoint(str(job / "checkpoints")).rsplit("-", 1)[1])
    resumed = run_task(*args(job, dropout_model, "--resume_from_checkpoint", "auto"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"checkpoint-{stopped_at:08d}" in resumed.stdout
    history, metrics = read(job)
    want_history, want_metrics = uninterrupted
    assert [r["step"] for r in history] == [r["step"] for r in want_history]
    assert [r["loss"] for r in history] == [r["loss"] for r in want_history]  # exactly, after the resume too
    for split in ("validation_matched", "validation_mismatched"):
        assert metrics[split]["confusion_matrix"] == want_metrics[split]["confusion_matrix"]
    assert [e["step"] for e in metrics["eval_history"]] == [e["step"] for e in want_metrics["eval_history"]]


def test_the_tiny_model_is_the_same_files_in_every_process(tmp_path):
    """A run killed and resumed in a new process, and every torchrun rank, loads the tiny test model: built by a
    process with a cache of its own and another hash seed, it is the same vocabulary and weights, byte for byte.
    (Its WordPiece vocabulary was once trained per process and came out different, so a resumed run was refused
    as "the training pairs ... changed".)"""
    script = "from tests.tiny_model import tiny_model; print(tiny_model())"
    folders = []
    for seed in (1, 2):
        env = {**os.environ, "NLI_CACHE_DIR": str(tmp_path / f"cache-{seed}"), "PYTHONHASHSEED": str(seed)}
        proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        folders.append(Path(proc.stdout.strip().splitlines()[-1]))
    assert folders[0] != folders[1] and folders[0].name == folders[1].name
    names = sorted(p.name for p in folders[0].iterdir())
    assert {"vocab.txt", "model.safetensors", "config.json"} <= set(names)
    assert names == sorted(p.name for p in folders[1].iterdir())
    for name in names:
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name


def test_resume_auto_without_checkpoints_starts_fresh_and_refuses_changed_settings(dropout_model, tmp_path):
    job = tmp_path / "job"
    first = run_task(*args(job, dropout_model, "--resume_from_checkpoint", "auto", "--num_train_epochs", "1"))
    assert first.returncode == 0 and "starting fresh" in first.stdout
    changed = run_task(*args(job, dropout_model, "--resume_from_checkpoint", "auto", "--num_train_epochs", "1",
                             "--learning_rate", "3e-4"))
    assert changed.returncode == 2 and "holds a finished run" in changed.stderr, changed.stderr
    (job / "metrics.json").unlink()  # as a run killed before its final save leaves it
    changed = run_task(*args(job, dropout_model, "--resume_from_checkpoint", "auto", "--num_train_epochs", "1",
                             "--learning_rate", "3e-4"))
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "learning_rate (0.0002 -> 0.0003) changed" in changed.stderr
    # Another model: the settings are compared before its weights would fail to load, in one line.
    other = run_task(*args(job, "minilm-l6", "--resume_from_checkpoint", "auto", "--num_train_epochs", "1"))
    errors = [line for line in other.stderr.splitlines() if line.startswith("error:")]
    assert other.returncode == 2 and len(errors) == 1 and "size mismatch" not in other.stderr, other.stderr
    assert f"cannot resume from {job}/checkpoints/checkpoint-" in other.stderr
    assert f"model_name_or_path ({dropout_model!r} -> 'minilm-l6')" in other.stderr


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model_name_or_path", tiny_model(), "--num_train_epochs", "2",
                    "--per_device_train_batch_size", "8", "--learning_rate", "1e30", "--max_grad_norm", "0",
                    "--warmup_ratio", "0", "--precision", "fp32", "--save_steps", "1", "--logging_steps", "1",
                    "--no-progress", "--output_dir", str(job))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the training loss became" in proc.stderr and "at step" in proc.stderr
    assert not (job / "metrics.json").exists()
    good = latest_checkpoint(str(job / "checkpoints"))
    if good:  # every checkpoint that exists was written before the loss went bad
        import torch

        state = torch.load(Path(good) / "training_state.pt", weights_only=True)
        assert all(row["loss"] == row["loss"] and abs(row["loss"]) != float("inf") for row in state["history"])


FULL_DISK = r"""
import json, os, sys, tempfile
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from nli_helpers.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
root, model_dir, aside, state_mib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = AutoModelForSequenceClassification.from_pretrained(model_dir)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
save_checkpoint(root, 1, model, tokenizer, {"step": 1}, keep=2)
if aside:  # the files are written aside on the full disk too, as where /tmp and the run share a disk
    os.makedirs(aside)
    tempfile.tempdir = aside
try:
    save_checkpoint(root, 2, model, tokenizer, {"step": 2, "moments": torch.zeros(state_mib * 2**18)}, keep=2)
    outcome = "written"
except CheckpointError as e:
    outcome = str(e)
tempfile.tempdir = None
latest = latest_checkpoint(root)
print(json.dumps({"outcome": outcome, "latest": latest, "state": load_checkpoint(latest, model)["step"],
                  "manifests": sorted(d for d in os.listdir(root) if os.path.exists(f"{root}/{d}/manifest.json")),
                  "aside": os.listdir(aside) if aside else []}))
"""


@pytest.mark.parametrize("where, disk_kib, state_mib", [
    ("copy", 4096, 8),  # the weights fit; the 8 MiB training state does not, copied into place
    ("aside-state", 4096, 8),  # the same, written aside first: torch.save alone says only "unexpected pos"
    ("aside-weights", 1536, 0),  # model.safetensors does not fit aside: safetensors' own error type
])
def test_a_full_disk_during_a_checkpoint_is_one_error_and_keeps_the_previous_one(tmp_path, where, disk_kib,
                                                                                  state_mib):
    disk = tmp_path / "disk"
    aside = str(disk / "tmp") if where.startswith("aside") else ""
    proc = on_a_small_disk(disk, disk_kib, [sys.executable, "-c", FULL_DISK, str(disk / "ckpt"), tiny_model(),
                                            aside, str(state_mib)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    outcome = result["outcome"]
    assert outcome.startswith(f"could not write checkpoint {disk}/ckpt/checkpoint-00000002 ("), outcome
    assert "No space left on device" in outcome, outcome
    assert f"the newest checkpoint, {disk}/ckpt/checkpoint-00000001, is kept" in outcome, outcome
    assert result["latest"].endswith("checkpoint-00000001") and result["state"] == 1
    assert result["manifests"] == ["checkpoint-00000001"]  # what was half-written does not count
    assert result["aside"] == []  # nor is it left aside


def test_a_full_disk_at_the_final_save_is_one_message_and_resume_finishes_the_run(tmp_path):
    disk, checkpoints = tmp_path / "disk", tmp_path / "checkpoints"
    job = disk / "job"
    # The command, then what it left in the run folder (the small disk goes when the namespace ends).
    command = ["sh", "-c", '"$@"; code=$?; echo LEFT:; ls -A "$JOB"; exit $code', "sh",
               sys.executable, "-m", "nli_helpers.task", *args(job, tiny_model()), "--checkpoint_dir", str(checkpoints)]
    full = on_a_small_disk(disk, 64, ["env", f"JOB={job}", *command])
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: could not write the trained model to {job} (No space left on device)"), error
    assert "pass --output_dir with a folder you can write" in error
    kept = latest_checkpoint(str(checkpoints))
    assert kept and f"the newest checkpoint, {kept}, is kept" in error
    assert "--resume_from_checkpoint auto" in error
    left = full.stdout.split("LEFT:")[-1].split()
    assert "metrics.json" not in left, left  # no result that could pass for a finished run
    resumed = on_a_small_disk(disk, 64 * 1024, ["env", f"JOB={job}", *command, "--resume_from_checkpoint", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {kept}" in resumed.stdout + resumed.stderr
    assert "metrics.json" in resumed.stdout.split("LEFT:")[-1].split()


def test_ctrl_c_while_torch_imports_is_one_line_and_exit_130(tmp_path):
    """Found by tests/test_contract.py's drawn signals: a SIGINT in the seconds torch and transformers take to import
    was a KeyboardInterrupt traceback. The config line is printed just before those imports (or while it prints)."""
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *args(tmp_path / "job", tiny_model())],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the line as it is printed
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().startswith("config: smoke")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and err.strip().splitlines() == [
        "interrupted: the newest complete checkpoint (if any) is intact; rerun with --resume_from_checkpoint auto"
    ], err[-2000:]
    assert not (tmp_path / "job").exists()


def test_ctrl_c_as_the_finished_command_shuts_down_is_no_traceback(tmp_path):
    """Found by tests/test_contract.py's drawn signals: a SIGINT after the files were written, while the interpreter
    joined its threads, printed "Exception ignored in: <module 'threading'> ... KeyboardInterrupt"."""
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *args(tmp_path / "job", tiny_model()),
                             "--num_train_epochs", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if line.startswith("saved to"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, err[-2000:]
    assert (tmp_path / "job" / "metrics.json").is_file()
