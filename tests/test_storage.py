"""nli_helpers.files, and the checkpoints and runs written through it, against a real local Cloud Storage
(gcp-storage-emulator), no mocks: gs:// takes the same calls as a local path.

Needs the fixtures in tests/gcs_emulator.py (registered by tests/conftest.py, or run
`python -m pytest -p tests.gcs_emulator tests/test_storage.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nli_helpers import checkpoint, files
from nli_helpers.config import NLIError
from tests.helpers import error_without_credentials

TREE = {
    "config.json": b'{"labels": 3}',
    "model.safetensors": os.urandom(50_000),
    "metrics.json": b"{}",
    "logs/with space.txt": b"epoch 1\n",
    "empty.bin": b"",
}


def write_tree(root: Path, tree: dict[str, bytes]) -> Path:
    for relative, content in tree.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_gs_uris_and_local_paths():
    assert files.is_gcs_uri("gs://b/x") and not files.is_gcs_uri("runs/x")
    assert not files.is_gcs_uri(Path("gs:/b"))  # what Path("gs://b") collapses to
    assert files.join("gs://b/runs/", "/1", "metrics.json") == "gs://b/runs/1/metrics.json"


def test_a_gs_filesystem_works_anonymously_under_the_emulator(gcs_bucket, monkeypatch, tmp_path):
    # No credentials anywhere: under STORAGE_EMULATOR_HOST nothing asks for any.
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    fs, path = files.filesystem(f"gs://{gcs_bucket}/runs/a.txt")
    assert path == f"{gcs_bucket}/runs/a.txt"
    fs.pipe_file(path, b"hello")
    assert fs.cat_file(path) == b"hello" and fs.exists(path)
    assert fs.ls(f"{gcs_bucket}/runs") == [path]


def test_without_credentials_gs_says_how_to_log_in(tmp_path):
    shown = error_without_credentials(tmp_path, "from nli_helpers.files import filesystem",
                                      'filesystem("gs://some-bucket/x")')
    assert shown.strip() == files.CREDENTIALS_HELP
    assert "gcloud auth application-default login" in shown and "GOOGLE_APPLICATION_CREDENTIALS" in shown


@pytest.mark.parametrize("where", ["gs", "local"])
def test_put_copies_a_folder_byte_for_byte_with_the_last_file_last(gcs_bucket, tmp_path, where):
    source = write_tree(tmp_path / "run", TREE)
    target = f"gs://{gcs_bucket}/jobs/run-1" if where == "gs" else str(tmp_path / "out" / "run-1")
    files.put(source, target, last="metrics.json")
    fs, root = files.filesystem(target)
    fs.get(root, str(tmp_path / "back"), recursive=True)
    assert read_tree(tmp_path / "back") == TREE
    if where == "gs":  # a reader that waits for metrics.json sees every other file: it was created last
        generation = {name: int(fs.info(files.join(root, name))["generation"]) for name in TREE}
        assert max(generation, key=generation.get) == "metrics.json"


def test_put_copies_one_file_to_its_target_name(gcs_bucket, tmp_path):
    (tmp_path / "pairs.jsonl").write_text('{"premise": "a"}\n')
    files.put(tmp_path / "pairs.jsonl", f"gs://{gcs_bucket}/data/train.jsonl")
    fs, _ = files.filesystem(f"gs://{gcs_bucket}")
    assert fs.cat_file(f"{gcs_bucket}/data/train.jsonl") == b'{"premise": "a"}\n'



@pytest.mark.parametrize("tail", [b"\r", b"\r\n", b"\n\n", b""], ids=["cr", "crlf", "lflf", "none"])
def test_put_keeps_the_last_byte_of_a_file_whatever_it_is(gcs_bucket, tmp_path, tail):
    """Every byte of a file arrives, its MD5 checked (files.filesystem): the emulator's own multipart reader dropped a
    final "\r" (localcloud/gcs.py), as a TensorBoard event file's CRC may end, 1 file in 256."""
    local = tmp_path / "events.out.tfevents"
    local.write_bytes(bytes(range(256)) + tail)
    files.put(local, f"gs://{gcs_bucket}/logs/events.out.tfevents")
    fs, _ = files.filesystem(f"gs://{gcs_bucket}")
    assert fs.cat(f"{gcs_bucket}/logs/events.out.tfevents") == local.read_bytes()

def test_check_writable_passes_a_bucket_and_leaves_nothing(gcs_bucket):
    files.check_writable(f"gs://{gcs_bucket}/runs/1", "--output_dir")
    fs, _ = files.filesystem(f"gs://{gcs_bucket}")
    assert fs.find(gcs_bucket) == []



def test_a_client_that_hangs_up_early_prints_no_traceback_but_a_real_error_still_does(gcs_emulator, capfd):
    httpd = gcs_emulator.server._api._httpd
    for error in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset"), ValueError("a bug")):
        try:
            raise error
        except Exception:
            httpd.handle_error(None, ("127.0.0.1", 1))  # what socketserver calls inside its except block
    printed = capfd.readouterr().err
    assert "BrokenPipeError" not in printed and "ConnectionResetError" not in printed
    assert "ValueError: a bug" in printed

def test_check_writable_names_a_missing_bucket(gcs_emulator):
    with pytest.raises(NLIError) as err:
        files.check_writable("gs://no-such-bucket-xyz/runs/1", "--output_dir")
    assert str(err.value) == ("gs://no-such-bucket-xyz/runs/1 cannot be written (no such bucket); pass --output_dir "
                              "with a folder you can write")


# -- checkpoints on gs://: whole or absent, found again, a damaged one skipped ---------------------------------
@pytest.fixture(scope="module")
def tiny():
    from nli_helpers.model import load_model_and_tokenizer
    from tests.tiny_model import tiny_model

    return load_model_and_tokenizer(tiny_model())


def test_a_checkpoint_on_gs_is_found_and_loaded(gcs_bucket, tiny):
    from nli_helpers.model import load_model_and_tokenizer
    from tests.tiny_model import tiny_model

    model, tokenizer = tiny
    root = f"gs://{gcs_bucket}/run/checkpoints"
    assert checkpoint.latest_checkpoint(root) is None  # nothing there yet
    rng = torch.get_rng_state()
    path = checkpoint.save_checkpoint(root, 3, model, tokenizer, {"step": 3, "rng": rng})
    assert path == f"{root}/checkpoint-00000003" and checkpoint.latest_checkpoint(root) == path
    fs, p = files.filesystem(path)
    names = {name.rsplit("/", 1)[1] for name in fs.ls(p)}
    assert {checkpoint.MANIFEST, checkpoint.STATE, "config.json", "model.safetensors", "tokenizer.json"} <= names
    fresh, _ = load_model_and_tokenizer(tiny_model())
    with torch.no_grad():
        for param in fresh.parameters():
            param.add_(1.0)
    state = checkpoint.load_checkpoint(path, fresh)
    assert state["step"] == 3 and torch.equal(state["rng"], rng)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_a_damaged_or_unfinished_gs_checkpoint_is_skipped(gcs_bucket, tiny, capsys):
    model, tokenizer = tiny
    root = f"gs://{gcs_bucket}/run/checkpoints"
    first, second, third = (checkpoint.save_checkpoint(root, step, model, tokenizer, {"step": step}, keep=3)
                            for step in (1, 2, 3))
    fs, _ = files.filesystem(root)
    fs.rm_file(files.filesystem(files.join(third, checkpoint.MANIFEST))[1])  # killed before its manifest
    weights = files.filesystem(files.join(second, "model.safetensors"))[1]
    data = bytearray(fs.cat_file(weights))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(weights, bytes(data))  # rotted after it was written
    capsys.readouterr()
    assert checkpoint.latest_checkpoint(root) == first
    out = capsys.readouterr().out
    assert f"skipping damaged checkpoint {second}: model.safetensors does not match its SHA-256" in out
    assert str(third) not in out  # no manifest: never a checkpoint, nothing to warn about
    with pytest.raises(checkpoint.CheckpointError, match="is not a complete checkpoint"):
        checkpoint.load_checkpoint(third, model)
    kept = checkpoint.save_checkpoint(root, 4, model, tokenizer, {"step": 4}, keep=2)  # prunes all but the newest 2
    assert sorted(step for step, _ in checkpoint.checkpoints(root)) == [2, 4] and checkpoint.latest_checkpoint(root) == kept


# -- a whole run to gs:// ---------------------------------------------------------------------------------------
def test_a_run_writes_its_result_and_checkpoints_to_gs(gcs_bucket, tmp_path, capsys):
    """`--output_dir gs://...`: the run folder from_pretrained opens, and its checkpoints, in the bucket."""
    from nli_helpers import task
    from nli_helpers.model import load_model_and_tokenizer
    from tests.tiny_model import tiny_model

    job = f"gs://{gcs_bucket}/runs/1"
    code = task.main(["--model_name_or_path", tiny_model(), "--data", "sample", "--max_train_samples", "32",
                      "--num_train_epochs", "2", "--per_device_train_batch_size", "16", "--output_dir", job,
                      "--no-progress"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert f"saved to {job}" in capsys.readouterr().out
    fs, root = files.filesystem(job)
    metrics = json.loads(fs.cat_file(files.join(root, "metrics.json")))
    assert metrics["train"]["steps"] == 4 and "validation_matched" in metrics
    # The first epoch's end checkpointed; the last step's state is the result itself.
    assert checkpoint.latest_checkpoint(files.join(job, "checkpoints")) == f"{job}/checkpoints/checkpoint-00000002"
    fs.get(root, str(tmp_path / "run"), recursive=True)
    model, _ = load_model_and_tokenizer(str(tmp_path / "run"))  # what from_pretrained opens
    assert model.config.num_labels == 3


# -- Cloud Storage that fails: bounded retries that say so, then one line naming the endpoint and the cause ----------
STORAGE_FAULT_BOUND_S = 15  # the whole fault, from the first failed request to the error line (issue 50)


def test_an_unreachable_endpoint_is_one_error_naming_it_within_the_bound(monkeypatch, capsys):
    import time

    from nli_helpers.data import load_nli_splits
    from tests.helpers import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    began = time.monotonic()
    with pytest.raises(files.StorageError) as err:
        load_nli_splits("gs://some-bucket/pairs.jsonl")
    assert time.monotonic() - began < STORAGE_FAULT_BOUND_S
    assert str(err.value).startswith(f"Cloud Storage at {endpoint} did not answer (Cannot connect")
    retries = [line for line in capsys.readouterr().err.splitlines() if "; retry " in line]
    assert len(retries) == len(files.RETRY_DELAYS) and retries[0].startswith(f"warning: Cloud Storage at {endpoint}")


def fault_mid_run(tmp_path: Path, fault: str) -> tuple[subprocess.CompletedProcess, float, str]:
    """The command writing its checkpoints to a bucket of an emulator of its own, and `fault` after step 5: the
    emulator stopped, or the bucket deleted. Returns the ended process, the seconds from the fault to its end, and
    the checkpoint root."""
    import time

    from localcloud.gcs import start_emulator
    from tests.helpers import ROOT
    from tests.tiny_model import tiny_model

    emulator = start_emulator()
    try:
        emulator.make_bucket("doomed")
        root = "gs://doomed/run/checkpoints"
        proc = subprocess.Popen(
            [sys.executable, "-m", "nli_helpers.task", "--data", "sample", "--model_name_or_path", tiny_model(),
             "--output_dir", str(tmp_path / "job"), "--checkpoint_dir", root, "--save_steps", "2",
             "--num_train_epochs", "3", "--per_device_train_batch_size", "8", "--logging_steps", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env={**os.environ, **emulator.env, "PYTHONUNBUFFERED": "1"})
        for line in proc.stdout:
            if line.startswith("step 5/"):
                break
        began = time.monotonic()
        if fault == "endpoint gone":
            emulator.stop()
        else:  # the run may write between the listing and the bucket's delete: then again
            from google.api_core.exceptions import Conflict, NotFound

            bucket = emulator.client().bucket("doomed")
            for _ in range(20):
                try:
                    for blob in bucket.list_blobs():
                        blob.delete()
                    bucket.delete()
                    break
                except (Conflict, NotFound):
                    continue
        output = line + proc.stdout.read()
        proc.wait(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, output, ""), time.monotonic() - began, root
    finally:
        if fault != "endpoint gone":
            emulator.stop()


@pytest.mark.parametrize("fault", ["endpoint gone", "bucket deleted"])
def test_storage_that_fails_mid_run_is_one_error_line_within_the_bound(tmp_path, fault):
    proc, seconds, root = fault_mid_run(tmp_path, fault)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == proc.stdout.strip().splitlines()[-1], proc.stdout[-3000:]
    assert errors[0].startswith(f"error: could not write checkpoint {root}/checkpoint-"), errors[0]
    assert seconds < STORAGE_FAULT_BOUND_S, (seconds, proc.stdout[-2000:])
    if fault == "endpoint gone":
        assert "Cloud Storage at http://127.0.0.1:" in errors[0] and "did not answer" in errors[0]
        assert "; retry 1/" in proc.stdout
    else:
        assert "(is the bucket there?)" in errors[0]
    assert f"the checkpoints already in {root} are kept: rerun with --resume_from_checkpoint auto" in errors[0]
    assert not (tmp_path / "job" / "metrics.json").exists()


def test_a_gs_checkpoint_that_lost_its_weights_is_passed_over_for_the_one_before(gcs_bucket, tmp_path):
    """Its manifest is still there, but the bucket no longer holds every file the manifest hashes: resume takes the
    previous complete checkpoint and says which it skipped and why."""
    from tests.helpers import run_task
    from tests.tiny_model import tiny_model

    job = f"gs://{gcs_bucket}/run"
    args = ("--data", "sample", "--model_name_or_path", tiny_model(), "--output_dir", job, "--save_steps", "3",
            "--save_total_limit", "3", "--max_train_samples", "64", "--per_device_train_batch_size", "8",
            "--num_train_epochs", "2", "--no-progress", "--resume_from_checkpoint", "auto")
    first = run_task(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    fs, root = files.filesystem(job)
    fs.rm_file(files.join(root, "metrics.json"))  # as a run killed before its final save leaves it
    saved = sorted(checkpoint.checkpoints(files.join(job, "checkpoints")))
    newest, previous = saved[-1][1], saved[-2][1]
    fs.rm_file(files.filesystem(files.join(newest, "model.safetensors"))[1])
    again = run_task(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (f"warning: skipping damaged checkpoint {newest}: it cannot be read (FileNotFoundError" in again.stdout
            and f"resuming from {previous}" in again.stdout), again.stdout
