"""Checkpoints under faults: a re-save of the same step is a swap that counts at every point, a damaged newest
checkpoint is skipped for the newest intact one, and a damaged file is one clear error, never a raw traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from nli_helpers import checkpoint
from nli_helpers.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from nli_helpers.config import NLIError


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(64, 3)


def save(root: Path, step: int, seed: int = 0, keep: int = 3) -> Path:
    return Path(save_checkpoint(str(root), step, model(seed), {"step": step, "seed": seed}, keep=keep))


def test_a_resave_of_the_same_step_counts_at_every_point_of_the_swap(tmp_path, monkeypatch):
    save(tmp_path, 10, seed=1)
    real_replace, calls = os.replace, []

    def killed_after_the_first_rename(src, dst):  # the process dies between the two renames
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 10, seed=2)
    assert calls[0] == ("checkpoint-00000010", ".replaced-checkpoint-00000010")
    found = latest_checkpoint(str(tmp_path))  # the old checkpoint of step 10 still counts, under its aside name
    assert found is not None and Path(found).name == ".replaced-checkpoint-00000010"
    state = load_checkpoint(found, model())
    assert state == {"step": 10, "seed": 1}
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    final = save(tmp_path, 10, seed=2)  # the next save cleans up and swaps in the new one
    assert latest_checkpoint(str(tmp_path)) == str(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-00000010"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_newest_intact_one(tmp_path, capsys, damage):
    older, newest = save(tmp_path, 10), save(tmp_path, 20)
    weights = newest / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, other bytes
    else:
        weights.unlink()
    assert latest_checkpoint(str(tmp_path)) == str(older)
    warning = capsys.readouterr().out
    assert f"skipping damaged checkpoint {newest}" in warning
    assert {"truncate": "truncated?", "flip": "SHA-256", "delete": "is missing"}[damage] in warning


def test_a_damaged_checkpoint_loaded_by_name_is_one_clear_error(tmp_path):
    path = save(tmp_path, 10)
    weights = path / "model.safetensors"
    weights.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="is damaged .*--resume auto takes the newest intact one"):
        load_checkpoint(str(path), model())


def test_pruning_removes_the_manifest_first(tmp_path):
    for step in (10, 20, 30):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-00000020", "checkpoint-00000030"]


# -- the run's own folder ----------------------------------------------------------------------------------------
def test_a_second_run_into_a_live_run_s_job_dir_gets_one_clear_error_at_once(tmp_path):
    import filelock

    from nli_helpers.config import NLIError, make_config
    from nli_helpers.run import run_training

    held = filelock.FileLock(str(tmp_path / ".nli-run.lock"))
    held.acquire()  # the live run
    try:
        with pytest.raises(NLIError, match=f"another run is writing to {tmp_path}"):
            run_training(make_config("smoke", data="sample", model_name="tiny-random", job_dir=str(tmp_path)))
    finally:
        held.release()


class _FakeResult:
    def __init__(self, fail: bool):
        from types import SimpleNamespace

        from nli_helpers.config import make_config

        def save_pretrained(folder, **_):
            if fail:
                raise OSError(28, "No space left on device")
            (Path(folder) / "model.safetensors").write_text("new weights")

        self.model = SimpleNamespace(save_pretrained=save_pretrained, state_dict=dict)
        self.tokenizer = SimpleNamespace(save_pretrained=lambda folder: (Path(folder) / "tokenizer.json").write_text("t"))
        self.config, self.history, self.metrics = make_config("smoke"), [{"loss": 1.0}], {"new": True}


def test_a_rerun_that_fails_to_save_leaves_the_earlier_finished_run_whole(tmp_path):
    from nli_helpers.run import save_run

    (tmp_path / "model.safetensors").write_text("old weights")
    (tmp_path / "metrics.json").write_text('{"old": true}')
    with pytest.raises(NLIError, match="No space left.*The disk is full.*no checkpoint to resume"):
        save_run(_FakeResult(fail=True), str(tmp_path))
    assert (tmp_path / "metrics.json").read_text() == '{"old": true}'
    assert (tmp_path / "model.safetensors").read_text() == "old weights"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-run-")]
    save_run(_FakeResult(fail=False), str(tmp_path))
    assert (tmp_path / "model.safetensors").read_text() == "new weights" and '"new": true' in (
        tmp_path / "metrics.json").read_text()


def test_a_rerun_into_a_finished_gcs_job_dir_drops_the_old_result_before_the_first_upload(gcs_bucket, monkeypatch):
    from nli_helpers import storage
    from nli_helpers.run import save_run

    job = f"gs://{gcs_bucket}/runs/again"
    with storage.staged_output(job) as local:
        (local / "model.safetensors").write_text("old weights")
        (local / "metrics.json").write_text('{"old": true}')
    uploads = []
    real_upload = storage.upload

    def killed_after_the_first_upload(src, dst):
        if uploads:
            raise KeyboardInterrupt("killed between uploads")
        uploads.append(dst)
        return real_upload(src, dst)

    monkeypatch.setattr(storage, "upload", killed_after_the_first_upload)
    with pytest.raises(KeyboardInterrupt):
        save_run(_FakeResult(fail=False), job)
    monkeypatch.setattr(storage, "upload", real_upload)
    assert not storage.exists(f"{job}/metrics.json"), "an old result beside new weights"


def test_a_checkpoint_dir_under_a_file_is_refused_before_training_with_the_real_cause(tmp_path, tiny_model_dir):
    from nli_helpers.config import NLIError, make_config
    from nli_helpers.run import run_training

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = make_config("smoke", data="sample", model_name=tiny_model_dir, job_dir=str(tmp_path / "job"),
                      checkpoint_dir=str(blocker / "checkpoints"))
    with pytest.raises(NLIError, match="checkpoint dir .* cannot be written .* is a file, not a folder"):
        run_training(cfg)
    assert not (tmp_path / "job" / "history.jsonl").exists()  # refused before training, not after an epoch


def test_a_failed_write_names_its_cause_not_a_full_disk(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="A part of that path is a file, not a folder") as err:
        save(blocker / "checkpoints", 1)
    assert "disk is full" not in str(err.value) and "Free disk space" not in str(err.value)
