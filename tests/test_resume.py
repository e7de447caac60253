"""Faults: SIGTERM and SIGKILL mid-run, resume, non-finite loss, a full disk (file-size limit, or a real
small tmpfs) during a checkpoint write and during the final save.

The trainer runs as a real subprocess. The model is the tiny test BERT with dropout switched back
on, so an exact resume also needs the RNG state restored, not only weights and optimizer.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nli_helpers.checkpoint import MANIFEST, latest_checkpoint
from nli_helpers.vertex.environment import RESTARTABLE_EXIT_CODE
from tests.helpers import ROOT, VERTEX_ENTRY, on_a_small_disk, run_task


@pytest.fixture(scope="module")
def dropout_model(tiny_model_dir, tmp_path_factory) -> str:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("dropout-model")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, hidden_dropout_prob=0.1,
                                                               attention_probs_dropout_prob=0.1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return str(out)


def args(job_dir: Path, model: str, *extra: str) -> list[str]:
    return ["--profile", "smoke", "--data", "sample", "--model-name", model, "--epochs", "3",
            "--batch_size", "4", "--precision", "fp32", "--checkpoint_every", "5", "--keep_checkpoints", "3",
            "--log_every", "1", "--no-progress", "--job-dir", str(job_dir), *extra]


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
    # What the trainer image runs on Vertex AI: a SIGTERM there ends in the exit code Vertex AI retries.
    returncode, stderr = start_and_interrupt(job, dropout_model, sig, module=VERTEX_ENTRY)
    if sig == signal.SIGTERM:
        assert returncode == RESTARTABLE_EXIT_CODE == 134, stderr[-2000:]
        assert "Rerun with --resume auto" in stderr
    else:
        assert returncode == -signal.SIGKILL
    assert not (job / "metrics.json").exists()  # nothing that could pass for a result
    stopped_at = int(latest_checkpoint(str(job / "checkpoints")).rsplit("-", 1)[1])
    resumed = run_task(*args(job, dropout_model, "--resume", "auto"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"checkpoint-{stopped_at:08d}" in resumed.stdout
    history, metrics = read(job)
    want_history, want_metrics = uninterrupted
    assert [r["step"] for r in history] == [r["step"] for r in want_history]
    assert [r["loss"] for r in history] == [r["loss"] for r in want_history]  # exactly, after the resume too
    for split in ("validation_matched", "validation_mismatched"):
        assert metrics[split]["confusion_matrix"] == want_metrics[split]["confusion_matrix"]
    assert [e["step"] for e in metrics["eval_history"]] == [e["step"] for e in want_metrics["eval_history"]]


def test_a_tiny_random_run_killed_and_resumed_in_a_new_process_ends_as_an_uninterrupted_one(tmp_path):
    """`--model_name tiny-random` builds the same vocabulary and weights in every process: here each process has a
    cache of its own and another hash seed, so each builds it anew. Before, its WordPiece vocabulary was trained in
    every process and came out different, so a resumed run was refused as "the training pairs ... changed"."""
    def own(name: str, hash_seed: int) -> dict:
        return {"NLI_CACHE_DIR": str(tmp_path / f"cache-{name}"), "PYTHONHASHSEED": str(hash_seed)}

    whole = run_task(*args(tmp_path / "whole", "tiny-random"), env=own("whole", 1))
    assert whole.returncode == 0, whole.stderr[-2000:]
    job = tmp_path / "job"
    returncode, stderr = start_and_interrupt(job, "tiny-random", signal.SIGKILL, env=own("killed", 2))
    assert returncode == -signal.SIGKILL, stderr[-2000:]
    resumed = run_task(*args(job, "tiny-random", "--resume", "auto"), env=own("resumed", 3))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resum" in resumed.stdout.lower() and "starting fresh" not in resumed.stdout
    (history, metrics), (want_history, want_metrics) = read(job), read(tmp_path / "whole")
    assert [r["loss"] for r in history] == [r["loss"] for r in want_history]
    for split in ("validation_matched", "validation_mismatched"):
        assert metrics[split]["confusion_matrix"] == want_metrics[split]["confusion_matrix"]
    caches = [next((tmp_path / f"cache-{n}" / "tiny-random").glob("*/vocab.txt")) for n in ("whole", "resumed")]
    assert caches[0].read_bytes() == caches[1].read_bytes() and caches[0].parent.name == caches[1].parent.name


def test_resume_auto_without_checkpoints_starts_fresh_and_refuses_changed_settings(dropout_model, tmp_path):
    job = tmp_path / "job"
    first = run_task(*args(job, dropout_model, "--resume", "auto", "--epochs", "1"))
    assert first.returncode == 0 and "starting fresh" in first.stdout
    changed = run_task(*args(job, dropout_model, "--resume", "auto", "--epochs", "1", "--learning_rate", "3e-4"))
    assert changed.returncode == 2
    assert "learning_rate (0.0002 -> 0.0003) changed" in changed.stderr


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tiny_model_dir, tmp_path):
    job = tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model-name", tiny_model_dir, "--epochs", "2", "--batch_size", "8",
                    "--learning_rate", "1e30", "--max_grad_norm", "0", "--warmup_ratio", "0", "--precision", "fp32",
                    "--checkpoint_every", "1", "--log_every", "1", "--no-progress", "--job-dir", str(job))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the training loss became" in proc.stderr and "at step" in proc.stderr
    assert not (job / "metrics.json").exists()
    good = latest_checkpoint(str(job / "checkpoints"))
    if good:  # every checkpoint that exists was written before the loss went bad
        import torch

        state = torch.load(Path(good) / "training_state.pt", weights_only=True)
        assert all(row["loss"] == row["loss"] and abs(row["loss"]) != float("inf") for row in state["history"])


FULL_DISK = r"""
import json, os, resource, signal, sys
from pathlib import Path
import torch
from nli_helpers.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from nli_helpers.model import load_model_and_tokenizer
root = sys.argv[1]
model, _ = load_model_and_tokenizer(sys.argv[2])
save_checkpoint(root, 1, model, {"step": 1}, keep=2)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write then fails with EFBIG, like ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    save_checkpoint(root, 2, model, {"step": 2}, keep=2)
    outcome = "written"
except CheckpointError as e:
    outcome = str(e)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps({"outcome": outcome, "latest": latest_checkpoint(root),
                  "state": load_checkpoint(latest_checkpoint(root), model)["step"],
                  "left": sorted(os.listdir(root))}))
"""


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tiny_model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(root), tiny_model_dir], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "could not write checkpoint checkpoint-00000002" in result["outcome"]
    assert "the previous checkpoint checkpoint-00000001 is kept. The disk is full" in result["outcome"]
    assert result["latest"].endswith("checkpoint-00000001") and result["state"] == 1
    assert result["left"] == ["checkpoint-00000001"]  # the half-written one is gone


TORCH_SAVE_ON_A_FULL_DISK = r"""
import json, sys
import torch
from nli_helpers.checkpoint import CheckpointError, latest_checkpoint, save_checkpoint
from nli_helpers.model import load_model_and_tokenizer
root = sys.argv[1]
model, _ = load_model_and_tokenizer(sys.argv[2])
save_checkpoint(root, 1, model, {"step": 1}, keep=2)
try:  # the weights fit; torch.save's 8 MiB do not, and its zip writer says only "unexpected pos"
    save_checkpoint(root, 2, model, {"step": 2, "moments": torch.zeros(2**21)}, keep=2)
    print(json.dumps({"outcome": "written"}))
except CheckpointError as e:
    print(json.dumps({"outcome": str(e), "latest": latest_checkpoint(root)}))
"""


def test_a_full_disk_that_torch_save_does_not_name_is_still_called_full(tiny_model_dir, tmp_path):
    disk = tmp_path / "disk"
    proc = on_a_small_disk(disk, 4096, [sys.executable, "-c", TORCH_SAVE_ON_A_FULL_DISK, str(disk / "ckpt"),
                                         tiny_model_dir], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "could not write checkpoint checkpoint-00000002" in result["outcome"], result
    assert "the previous checkpoint checkpoint-00000001 is kept. The disk is full: " in result["outcome"]
    assert re.search(r"\d+ MiB free where .* needs about (8|9) MiB", result["outcome"]), result["outcome"]
    assert result["latest"].endswith("checkpoint-00000001")


def test_a_full_disk_at_the_final_save_is_one_message_and_resume_finishes_the_run(tiny_model_dir, tmp_path):
    disk, checkpoints = tmp_path / "disk", tmp_path / "checkpoints"
    command = [sys.executable, "-m", "nli_helpers.task", *args(disk / "job", tiny_model_dir),
               "--checkpoint_dir", str(checkpoints)]
    full = on_a_small_disk(disk, 64, command)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: could not write the trained model to {disk / 'job'}"), error
    assert "The disk is full: " in error and "pass --job-dir on another disk" in error
    kept = latest_checkpoint(str(checkpoints))
    assert kept and f"The newest checkpoint, {kept}, is kept" in error
    resumed = on_a_small_disk(disk, 64 * 1024, [*command, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {kept}" in resumed.stdout + resumed.stderr


def test_ctrl_c_while_torch_imports_is_one_line_and_exit_130(tmp_path):
    """Found by tests/test_contract.py's drawn signals: a SIGINT in the seconds torch and transformers take to import
    was a KeyboardInterrupt traceback. The profile line is printed just before those imports (or while it prints)."""
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *args(tmp_path / "job", "tiny-random")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the line as it is printed
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().startswith("Profile smoke")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and err.strip().splitlines() == [
        "interrupted: the newest complete checkpoint (if any) is intact; rerun with --resume auto"], err[-2000:]
    assert not (tmp_path / "job").exists()


def test_ctrl_c_as_the_finished_command_shuts_down_is_no_traceback(tmp_path):
    """Found by tests/test_contract.py's drawn signals: a SIGINT after the files were written, while the interpreter
    joined its threads, printed "Exception ignored in: <module 'threading'> ... KeyboardInterrupt"."""
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *args(tmp_path / "job", "tiny-random"),
                             "--epochs", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if line.startswith("saved to"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, err[-2000:]
    assert (tmp_path / "job" / "metrics.json").is_file()
