"""SIGTERM wherever the process is, and the resume check's data fingerprint: in-process runs of the tiny model.

A callback sends the process its own SIGTERM at an exact point (a logged step, the final evaluation), which is
where the platform's signal would land."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import localcloud.replica
from nli_helpers.checkpoint import latest_checkpoint
from nli_helpers.config import ConfigError, NLIError, make_config
from nli_helpers.run import run_training
from nli_helpers.tracking import TrainCallback
from nli_helpers.vertex.entry import stopped_exit
from tests.helpers import ROOT, vm_metadata


class SigtermAt(TrainCallback):
    def __init__(self, *, step: int | None = None, final_eval: bool = False):
        self.step, self.final_eval, self.sent = step, final_eval, False

    def _send(self):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_log(self, rows):
        if self.step is not None and any(r.get("step") == self.step for r in rows):
            self._send()

    def on_evaluate(self, step, epoch, scores):
        if self.final_eval:
            self._send()


def cfg(job: Path, tiny_model_dir: str, **kw):
    values = dict(data="sample", model_name_or_path=tiny_model_dir, num_train_epochs=1,
                  per_device_train_batch_size=16, precision="fp32", logging_steps=1, progress=False,
                  output_dir=str(job), max_train_samples=64, max_eval_samples=32)
    return make_config("smoke", **{**values, **kw})


def test_sigterm_without_checkpoints_says_so_and_exits_with_a_code_vertex_does_not_retry(tmp_path, tiny_model_dir):
    stopped = run_training(cfg(tmp_path / "job", tiny_model_dir, save_total_limit=0),
                           callbacks=[SigtermAt(step=1)]).stopped
    assert stopped.checkpoint is None and stopped.step == 1
    assert re.search("with no checkpoint to resume from .--save_total_limit 0", stopped.message)
    assert stopped_exit(stopped, env={})[0] == 143  # on Vertex AI: permanent, no retry
    assert "checkpoint saved to None" not in stopped.message
    assert not (tmp_path / "job" / "metrics.json").exists()  # a stopped run is not a finished one


def test_sigterm_with_a_checkpoint_exits_the_code_vertex_retries_only_when_the_vm_is_going(tmp_path, tiny_model_dir):
    """Vertex AI restarts a preempted or maintained VM's job whatever its exit code, and retries 134 after anything
    else too: so 134 only when the metadata server says the VM is going, 143 after a cancel or a timeout."""
    stopped = run_training(cfg(tmp_path / "job", tiny_model_dir), callbacks=[SigtermAt(step=1)]).stopped
    assert re.search("checkpoint saved to .*Rerun with --resume_from_checkpoint auto", stopped.message)
    assert stopped.checkpoint == latest_checkpoint(str(tmp_path / "job" / "checkpoints"))
    assert stopped_exit(stopped, env={})[0] == 143  # no metadata server (off Google Cloud): not going
    for going, code in (("spot", 134), ("maintenance", 134), (None, 143)):
        with vm_metadata(going) as env:
            assert stopped_exit(stopped, env=env)[0] == code, going
    markers = tmp_path / "markers"  # torchrun stopping the ranks after another failed: no retry
    markers.mkdir()
    with vm_metadata("spot") as env:
        assert stopped_exit(stopped, env={**env, "NLI_PREEMPTED_MARKERS": str(markers)})[0] == 143


def test_sigterm_during_the_final_evaluation_checkpoints_the_last_step_and_finishes(tmp_path, tiny_model_dir):
    job = tmp_path / "job"
    result = run_training(cfg(job, tiny_model_dir), callbacks=[SigtermAt(final_eval=True)])
    steps = result.metrics["train"]["steps"]
    assert latest_checkpoint(str(job / "checkpoints")).endswith(f"checkpoint-{steps:08d}")
    assert (job / "metrics.json").is_file()  # and the run itself was saved whole


def test_gradient_accumulation_longer_than_an_epoch_is_refused_instead_of_looping_forever(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=16 is more than the 4 micro-batch"):
        run_training(cfg(tmp_path / "job", tiny_model_dir, max_train_samples=8, per_device_train_batch_size=2,
                         gradient_accumulation_steps=16))


def test_resume_refuses_edited_data_under_the_same_path(tmp_path, tiny_model_dir):
    from nli_helpers.data import SAMPLE_PATH

    data = tmp_path / "pairs.jsonl"
    lines = SAMPLE_PATH.read_text().splitlines()
    data.write_text("\n".join(lines) + "\n")
    job = tmp_path / "job"
    assert run_training(cfg(job, tiny_model_dir, data=str(data)), callbacks=[SigtermAt(step=2)]).stopped
    data.write_text("\n".join(lines[:-12]) + "\n")  # the file changed under its name
    with pytest.raises(NLIError, match=f"the training pairs under data='{data}'"):
        run_training(cfg(job, tiny_model_dir, data=str(data), resume_from_checkpoint="auto"))
    with pytest.raises(NLIError, match=r"eval_fraction \(0.1 -> 0.2\)"):
        run_training(cfg(job, tiny_model_dir, data=str(data), resume_from_checkpoint="auto", eval_fraction=0.2))


@pytest.mark.parametrize("command, said", [
    (["nli_helpers.vertex.entry", "--data", "sample"], "SIGTERM before training started: exiting "),
    (["nli_helpers.vertex.launch", "--", "--data", "sample"], "SIGTERM before training started: exiting "),
], ids=["entry", "launch"])
@pytest.mark.parametrize("going, code", [("spot", 134), (None, 143)], ids=["preempted", "cancelled"])
def test_a_sigterm_while_the_entry_point_imports_exits_at_once(tmp_path, command, said, going, code):
    """The image's entry points (the trainer, and the launcher of a multi-process job) take SIGTERM from their first
    lines: during the imports (seconds) and the loading that follow they exit at once, 134 (retried) when the VM is
    being preempted, else 143, instead of dying by the signal or, as PID 1, waiting for SIGKILL (pid_namespaces(7):
    PID 1 gets only the signals it handles)."""
    with vm_metadata(going) as metadata:
        proc = subprocess.Popen([sys.executable, "-m", *command], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **metadata, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 30
        while not localcloud.replica.catches(proc.pid, signal.SIGTERM) and proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # as soon as the handler is in: the trainer's imports follow it
        assert proc.wait(timeout=30) == code
    assert f"{said}{code}" in proc.stderr.read()


def test_the_stand_in_drops_a_sigterm_its_first_process_does_not_handle(tmp_path):
    """localcloud's replica is a container: its first process is PID 1, which a SIGTERM reaches only through a
    handler; without one the process runs on until SIGKILL at the end of the grace period."""
    handles = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(3)); print(1, flush=True); time.sleep(60)"
    ignores = "import time; print(1, flush=True); time.sleep(60)"
    replicas = [localcloud.replica.Replica(name, "container_spec", [sys.executable, "-c", code], dict(os.environ),
                                           tmp_path) for name, code in (("handles", handles), ("ignores", ignores))]
    for replica in replicas:
        replica.start()
    while not all(replica.log_text().strip() for replica in replicas):  # both past their first line
        time.sleep(0.01)
    localcloud.replica.stop_all(replicas, grace_s=1.0)
    assert [replica.process.returncode for replica in replicas] == [3, -signal.SIGKILL]
