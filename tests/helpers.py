"""Helpers the tests import (`from tests.helpers import ROOT, run_task`).

They live here, not in conftest.py: notebooks/ has a conftest.py too, and `from conftest import`
picks whichever was imported first when pytest collects both folders in one run.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import types
from pathlib import Path

from localcloud.replica import free_port  # noqa: F401  (the tests' one free-port rule)

ROOT = Path(__file__).resolve().parents[1]

# 20 premises x 3 labels: enough for a premise split with eval_fraction 0.3 to leave both parts non-empty.
# (The labels are spelled out, in nli_helpers.data.LABELS order, so that importing this stays light.)
ROWS = [{"premise": f"a man walks his dog number {i // 3} in the park",
         "hypothesis": f"someone is outside with an animal {i}",
         "label": ("entailment", "neutral", "contradiction")[i % 3]} for i in range(60)]


def run_task(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 600,
             module: str = "nli_helpers.task"):
    """Run `python -m nli_helpers.task` as a user would (or `module`: VERTEX_ENTRY, what the trainer
    image runs on Vertex AI), returning the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd or ROOT, timeout=timeout)


VERTEX_ENTRY = "nli_helpers.vertex.entry"


def on_a_small_disk(mount: Path, size_kib: int, argv: list[str], *, timeout: int = 600):
    """Run `argv` with a real `size_kib` tmpfs mounted at `mount`, in a mount namespace of its own
    (`unshare -rm`: no privilege needed, nothing left mounted): writes past it fail with ENOSPC as a
    full disk's do. Skips where user namespaces are off."""
    import shlex
    import shutil
    import subprocess

    import pytest

    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("a small real disk needs `unshare -rm` (user namespaces)")
    mount.mkdir(parents=True, exist_ok=True)
    script = (f"mount -t tmpfs -o size={size_kib}k tmpfs {shlex.quote(str(mount))} && exec "
              + shlex.join(argv))
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                          env=dict(os.environ), cwd=ROOT, timeout=timeout)


def write_jsonl(path: Path, rows: list, *, gz: bool = False) -> Path:
    """One line per row: a dict is written as JSON, a str as it is (to write a broken line)."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def truncated(data: bytes) -> bytes:
    """The first two thirds of a file, as a cut-off download leaves it."""
    return data[: len(data) * 2 // 3]


def assert_no_result(job: Path) -> None:
    """Nothing a user, a notebook or `--resume_from_checkpoint auto` could take for a result: no metrics, weights,
    checkpoints."""
    if not job.exists():
        return
    names = sorted(p.relative_to(job).as_posix() for p in job.rglob("*") if p.is_file())
    looks_like_result = [n for n in names if n.endswith(("metrics.json", ".safetensors", ".pt", ".bin",
                                                           "manifest.json", "history.jsonl"))]
    assert not looks_like_result, f"a failed run left {looks_like_result} in {job}"


def run_fails(job: Path, message: str, *args: str, env: dict | None = None):
    """The command exits 2 with `message` on stderr, no traceback, and leaves no result in `job`."""
    from tests.tiny_model import tiny_model

    proc = run_task("--profile", "smoke", "--model_name_or_path", tiny_model(), "--output_dir", str(job),
                    "--no-progress", *args, env=env)
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert_no_result(job)
    return proc


def read_metric_file(path: str | Path, metric: str | None = None) -> list[dict]:
    """The reports in a cloudml-hypertune metric file, oldest first: [{"metric", "value", "step", "trial", ...}]."""
    rows = []
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        tags = [k for k in entry if k not in ("timestamp", "trial", "global_step", "checkpoint_path")]
        for tag in tags if metric is None else [t for t in tags if t == metric]:
            rows.append({"metric": tag, "value": float(entry[tag]), "step": int(entry["global_step"]),
                         "trial": entry["trial"], "timestamp": entry["timestamp"]})
    return rows


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a local TensorBoard log dir, read with TensorBoard's own reader: {tag: [(step, value)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def error_without_credentials(tmp_path: Path, imports: str, call: str) -> str:
    """The NLIError message of `call` (after `imports`) in a fresh process with no emulator, no ADC file and
    no GCE metadata server to ask."""
    import subprocess

    script = f"from nli_helpers.config import NLIError\n{imports}\ntry:\n    {call}\n" \
             "except NLIError as err:\n    print(err)\nelse:\n    raise SystemExit('expected NLIError')\n"
    hidden = {"STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"}
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               NO_GCE_CHECK="true",  # google.auth compares with the lowercase string
               GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@contextlib.contextmanager
def vm_metadata(going: str | None):
    """{"GCE_METADATA_HOST": ...} of a VM metadata server (localcloud's) that says the VM is going: "spot" (being
    preempted), "maintenance" (stopping for host maintenance) or None (staying)."""
    from localcloud.replica import METADATA_HOST_ENV, MetadataServer

    server = MetadataServer(types.SimpleNamespace(preempted=going))
    try:
        yield {METADATA_HOST_ENV: f"127.0.0.1:{server.server_address[1]}"}
    finally:
        server.shutdown()
        server.server_close()
