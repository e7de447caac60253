"""Checkpoints under faults: a save killed at any point of its copy leaves nothing that counts, a damaged newest
checkpoint is skipped for the newest intact one, and a damaged file or a failed write is one clear error (the path
and the reason), never a raw traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from nli_helpers import files
from nli_helpers.checkpoint import (
    MANIFEST,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from nli_helpers.config import NLIError, make_config
from tests.tiny_model import tiny_model


def killed_at_once(*args, **kwargs):
    raise KeyboardInterrupt("killed")


@pytest.fixture(scope="module")
def tiny():
    return (AutoModelForSequenceClassification.from_pretrained(tiny_model()),
            AutoTokenizer.from_pretrained(tiny_model()))


def save(tiny, root: Path, step: int, keep: int = 3) -> Path:
    model, tokenizer = tiny
    return Path(save_checkpoint(str(root), step, model, tokenizer, {"step": step}, keep=keep))


def test_a_save_killed_at_any_point_of_its_copy_leaves_nothing_latest_checkpoint_takes(tmp_path, monkeypatch,
                                                                                       tiny):
    """The copy into place is one file at a time, the manifest last: a kill (here a KeyboardInterrupt after
    `copied` files, which no handler catches) leaves a folder without a manifest, which never counts."""
    older = save(tiny, tmp_path, 10)
    real_put_file = LocalFileSystem.put_file
    count = len(list(older.iterdir()))
    for copied in range(count):
        calls = []

        def killed_mid_copy(self, lpath, rpath, *args, calls=calls, copied=copied, **kwargs):
            if len(calls) == copied:
                raise KeyboardInterrupt("killed")
            calls.append(Path(rpath).name)
            return real_put_file(self, lpath, rpath, *args, **kwargs)

        monkeypatch.setattr(LocalFileSystem, "put_file", killed_mid_copy)
        with pytest.raises(KeyboardInterrupt):
            save(tiny, tmp_path, 20)
        monkeypatch.setattr(LocalFileSystem, "put_file", real_put_file)
        assert len(calls) == copied and MANIFEST not in calls
        assert latest_checkpoint(str(tmp_path)) == str(older)
        assert load_checkpoint(str(older), tiny[0])["step"] == 10
    newest = save(tiny, tmp_path, 20)  # the next save of that step writes it whole
    assert latest_checkpoint(str(tmp_path)) == str(newest)
    # A re-save of a step stops counting the old copy first: killed half-way, the step is absent, not mixed.
    monkeypatch.setattr(LocalFileSystem, "put_file", killed_at_once)
    with pytest.raises(KeyboardInterrupt):
        save(tiny, tmp_path, 20)
    monkeypatch.setattr(LocalFileSystem, "put_file", real_put_file)
    assert latest_checkpoint(str(tmp_path)) == str(older)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_newest_intact_one(tmp_path, capsys, damage, tiny):
    older, newest = save(tiny, tmp_path, 10), save(tiny, tmp_path, 20)
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
    expected = {"truncate": "model.safetensors does not match its SHA-256",
                "flip": "model.safetensors does not match its SHA-256",
                "delete": "it cannot be read (FileNotFoundError"}[damage]
    assert expected in warning, warning


def test_a_damaged_checkpoint_loaded_by_name_is_one_clear_error(tmp_path, tiny):
    path = save(tiny, tmp_path, 10)
    (path / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match=f"checkpoint {re.escape(str(path))} could not be loaded .*it is "
                                              "damaged .*--resume_from_checkpoint auto takes the newest intact"):
        load_checkpoint(str(path), tiny[0])
    (path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="is not a complete checkpoint"):
        load_checkpoint(str(path), tiny[0])


def test_pruning_keeps_the_newest(tmp_path, tiny):
    for step in (10, 20, 30):
        save(tiny, tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-00000020", "checkpoint-00000030"]


def test_a_failed_checkpoint_write_is_one_error_with_the_path_and_the_os_reason(tmp_path, tiny):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    target = blocker / "checkpoints" / "checkpoint-00000001"
    with pytest.raises(CheckpointError, match=f"could not write checkpoint {re.escape(str(target))} "
                                              r"\(Not a directory\).*--checkpoint_dir"):
        save(tiny, blocker / "checkpoints", 1)


# -- the run's own folder ----------------------------------------------------------------------------------------
def test_a_second_run_into_a_live_run_s_output_dir_gets_one_clear_error_at_once(tmp_path):
    from nli_helpers.run import run_lock, run_training

    held = run_lock(str(tmp_path))
    held.acquire()  # the live run
    try:
        with pytest.raises(NLIError, match=f"another run is writing to {tmp_path}"):
            run_training(make_config("smoke", data="sample", model_name_or_path=tiny_model(),
                                     output_dir=str(tmp_path)))
    finally:
        held.release()


class _FakeResult:
    def __init__(self, fail: bool):
        from types import SimpleNamespace

        def save_pretrained(folder, **_):
            if fail:
                raise OSError(28, "No space left on device")
            (Path(folder) / "model.safetensors").write_text("new weights")

        self.model = SimpleNamespace(save_pretrained=save_pretrained, state_dict=dict)
        self.tokenizer = SimpleNamespace(save_pretrained=lambda folder: (Path(folder) / "tokenizer.json").write_text("t"))
        self.config, self.history, self.metrics = make_config("smoke"), [{"loss": 1.0}], {"new": True}


def test_a_rerun_that_fails_to_save_leaves_no_result_and_says_where_and_why(tmp_path):
    from nli_helpers.run import save_run

    (tmp_path / "model.safetensors").write_text("old weights")
    (tmp_path / "metrics.json").write_text('{"old": true}')
    with pytest.raises(NLIError, match=f"could not write the trained model to {re.escape(str(tmp_path))} "
                                       r"\(No space left on device\).*no checkpoint to resume from"):
        save_run(_FakeResult(fail=True), str(tmp_path))
    assert not (tmp_path / "metrics.json").exists()  # never the old result beside what the rerun trained
    save_run(_FakeResult(fail=False), str(tmp_path))
    assert (tmp_path / "model.safetensors").read_text() == "new weights" and '"new": true' in (
        tmp_path / "metrics.json").read_text()


def test_a_rerun_into_a_finished_gcs_output_dir_drops_the_old_result_before_the_first_copy(gcs_bucket, tmp_path,
                                                                                           monkeypatch):
    from nli_helpers.run import save_run

    job = f"gs://{gcs_bucket}/runs/again"
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_text("old weights")
    (old / "metrics.json").write_text('{"old": true}')
    files.put(old, job, last="metrics.json")
    fs, path = files.filesystem(job)
    assert fs.exists(files.join(path, "metrics.json"))
    monkeypatch.setattr(fs, "put_file", killed_at_once)  # the instance files.filesystem returns
    with pytest.raises(KeyboardInterrupt):
        save_run(_FakeResult(fail=False), job)
    monkeypatch.undo()
    assert not fs.exists(files.join(path, "metrics.json")), "an old result beside new weights"


def test_a_checkpoint_dir_under_a_file_is_refused_before_training_with_the_real_cause(tmp_path):
    from nli_helpers.run import run_training

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = make_config("smoke", data="sample", model_name_or_path=tiny_model(), output_dir=str(tmp_path / "job"),
                      checkpoint_dir=str(blocker / "checkpoints"))
    with pytest.raises(NLIError, match=f"{re.escape(str(blocker / 'checkpoints'))} cannot be written "
                                       r"\(Not a directory\); pass --checkpoint_dir"):
        run_training(cfg)
    assert not (tmp_path / "job" / "history.jsonl").exists()  # refused before training, not after an epoch


# -- nothing lost: a complete checkpoint is never replaced, an earlier run's result never taken with a failure --------
def test_a_step_is_saved_once_so_no_moment_is_without_its_complete_checkpoint(tmp_path, monkeypatch):
    """save_steps equal to an epoch's steps lands on the epoch's end, which checkpoints too: the step is written once.
    A second write would first remove the complete copy, and a kill then would leave the step without one."""
    from nli_helpers import checkpoint
    from nli_helpers.run import run_training

    written = []

    def save_once(root, step, *args, **kwargs):
        assert not (Path(root) / f"checkpoint-{step:08d}" / MANIFEST).exists(), f"step {step} saved again"
        written.append(step)
        return original(root, step, *args, **kwargs)

    original = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", save_once)
    cfg = make_config("smoke", data="sample", model_name_or_path=tiny_model(), output_dir=str(tmp_path / "job"),
                      max_train_samples=64, per_device_train_batch_size=8, num_train_epochs=3, save_steps=8,
                      save_total_limit=5, precision="fp32", progress=False)
    run_training(cfg, verbose=False)
    assert written == [8, 16]  # 8 steps an epoch; the last step's state is the result itself


def finished_run(tmp_path: Path) -> tuple[list[str], Path, dict[str, bytes]]:
    job = tmp_path / "job"
    args = ["--data", "sample", "--model_name_or_path", tiny_model(), "--output_dir", str(job), "--no-progress",
            "--max_train_samples", "32", "--num_train_epochs", "2", "--per_device_train_batch_size", "8"]
    from tests.helpers import run_task

    assert run_task(*args).returncode == 0
    return args, job, {p.name: p.read_bytes() for p in job.iterdir() if p.is_file()}


def test_a_finished_run_is_refused_unless_overwrite_output_dir_so_no_failure_takes_it(tmp_path):
    from tests.helpers import run_task

    args, job, before = finished_run(tmp_path)
    again = run_task(*args)
    assert again.returncode == 2 and again.stderr.strip() == (
        f"error: {job} holds a finished run (metrics.json); pass --overwrite_output_dir to replace it, or another "
        "--output_dir"), again.stderr
    assert {p.name: p.read_bytes() for p in job.iterdir() if p.is_file()} == before
    replaced = run_task(*args, "--overwrite_output_dir", "--seed", "7")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert json.loads((job / "train_config.json").read_text())["seed"] == 7


def test_an_earlier_runs_checkpoints_are_refused_for_a_fresh_run_and_overwrite_removes_them(tmp_path):
    """A fresh run beside another run's checkpoints would prune them, or leave a later step of theirs for
    --resume_from_checkpoint auto to continue with this run's settings."""
    from tests.helpers import run_task

    args, job, _ = finished_run(tmp_path)
    (job / "metrics.json").unlink()  # a run killed before its final save: its checkpoint is the work it kept
    refused = run_task(*args)
    assert refused.returncode == 2 and f"{job}/checkpoints holds an earlier run's checkpoints (the newest at step " \
        "4); pass --resume_from_checkpoint auto to continue it" in refused.stderr, refused.stderr
    assert [p.name for p in (job / "checkpoints").iterdir()] == ["checkpoint-00000004"]
    over = run_task(*args, "--overwrite_output_dir", "--save_steps", "1", "--save_total_limit", "9")
    assert over.returncode == 0, over.stderr[-2000:]
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == [f"checkpoint-{s:08d}" for s in (1, 2, 3, 4, 5, 6, 7)]
