"""No credentials in notebooks, logs or run outputs, and no pickle in what a run writes (issue 8, item 5).

- Every committed notebook (notebooks/*.ipynb, and the papermill parameter files) is scanned for
  key-like strings: cell sources, outputs and metadata.
- A real short training run (the tests' tiny model, a few steps) is started with fake credentials in its
  environment; its stdout, stderr and every file it writes are scanned for them and for any other
  key-like string.
- Every file the run writes is checked for pickle: model weights are `model.safetensors`; the only
  pickle allowed is a checkpoint's `training_state.pt`, which must load with
  `torch.load(weights_only=True)` (tensors and plain values only, no code).
- The scanner itself is tested on planted fake keys, so a scanner that finds nothing fails.

The fake keys are assembled at run time, so this file holds no key-like literal for a repository's
own secret scanner to trip on.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_task
from tests.tiny_model import tiny_model

SECRET_PATTERNS = {
    "Google API key": re.compile(r"AIza[0-9A-Za-z_\-]{35}"),
    "private key block": re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----"),
    "service-account key field": re.compile(r"\"private_key\"\s*:"),
    "OAuth access token": re.compile(r"ya29\.[0-9A-Za-z_\-]{10,}"),
    "AWS access key id": re.compile(r"AKIA[0-9A-Z]{16}"),
    "Hugging Face token": re.compile(r"hf_[A-Za-z0-9]{30,}"),
    # `api_key = "..."`, `"secret": "..."`, `TOKEN=...`: a long opaque value assigned to a secret-ish name.
    # The value class stops at brackets and spaces, so `token = os.environ["HF_TOKEN"]` is fine.
    "assigned secret": re.compile(r"(?i)(api[_-]?key|secret|token)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9_\-/+=.]{16,}"),
}
PICKLE_ALLOWED = {"training_state.pt"}  # checkpoint state: loaded only with weights_only=True


def fake_secrets() -> dict[str, str]:
    """One fake credential per pattern, built here so that the source holds none."""
    return {
        "Google API key": "AI" + "za" + "Sy" + "F4kE" * 8 + "x",
        "private key block": "-----BEGIN " + "PRIVATE KEY-----\nMIIEv" + "Q" * 40 + "\n-----END PRIVATE KEY-----",
        "service-account key field": json.dumps({"type": "service_account", "private" + "_key": "x"}),
        "OAuth access token": "ya" + "29." + "a0Af" + "F4kE" * 10,
        "AWS access key id": "AK" + "IA" + "F4KEF4KEF4KEF4KE",
        "Hugging Face token": "hf" + "_" + "F4kEtOkEn" * 4,
        "assigned secret": "API" + "_KEY=" + "sk-" + "F4kE" * 8,
    }


def find_secrets(text: str) -> list[str]:
    """The names of the patterns that match anywhere in `text`, with a short excerpt of each match."""
    found = []
    for name, pattern in SECRET_PATTERNS.items():
        for match in pattern.finditer(text):
            found.append(f"{name}: {match.group(0)[:12]}...")
    return found


def strings_in(value) -> list[str]:
    """Every string in a parsed JSON document, keys included (notebook sources are JSON-escaped on disk)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def file_text(path: Path) -> str:
    """A file's text for scanning: every string of a notebook, else the bytes as latin-1 (binary files too)."""
    if path.suffix == ".ipynb":
        return "\n".join(strings_in(json.loads(path.read_text(encoding="utf-8"))))
    return path.read_bytes().decode("latin-1")


def pickle_kind(path: Path) -> str | None:
    """'pickle' for a raw pickle (protocol 2-5 header), 'torch zip' for torch.save's zip of a pickle, else None."""
    with open(path, "rb") as f:
        head = f.read(2)
    if len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(name.endswith(".pkl") for name in z.namelist()):
                return "torch zip"
    return None


# -- the scanner can fail -----------------------------------------------------------------------------
def test_scanner_catches_every_planted_fake_key(tmp_path):
    secrets = fake_secrets()
    for name, secret in secrets.items():
        planted = tmp_path / f"{len(name)}.txt"
        planted.write_text(f"some log line\n{secret}\nmore output\n")
        assert any(f.startswith(name + ":") for f in find_secrets(file_text(planted))), name
    notebook = tmp_path / "leaky.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [f'key = "{secrets["Google API key"]}"'],
                                               "outputs": [{"text": [f"token={secrets['assigned secret']}"]}]}]}))
    assert {f.split(":")[0] for f in find_secrets(file_text(notebook))} >= {"Google API key", "assigned secret"}


def test_scanner_ignores_ordinary_code_and_tokenizer_files():
    ordinary = '\n'.join([
        'token = os.environ["HF_TOKEN"]', '"pad_token": "[PAD]"', '"tokens_per_s": 12345.678901234567',
        'tokenizer = AutoTokenizer.from_pretrained(path)', 'secret_manager_uri = None',
        'gcloud auth application-default login', '"max_position_embeddings": 512'])
    assert find_secrets(ordinary) == []


def test_pickle_detection(tmp_path):
    import pickle

    import torch
    from safetensors.torch import save_file

    (tmp_path / "raw.pkl").write_bytes(pickle.dumps({"a": 1}))
    torch.save({"w": torch.zeros(2)}, tmp_path / "state.pt")
    save_file({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    assert pickle_kind(tmp_path / "raw.pkl") == "pickle"
    assert pickle_kind(tmp_path / "state.pt") == "torch zip"
    assert pickle_kind(tmp_path / "w.safetensors") is None


# -- committed notebooks --------------------------------------------------------------------------------
def committed_notebook_files() -> list[Path]:
    notebooks = ROOT / "notebooks"
    return sorted([*notebooks.glob("*.ipynb"), *notebooks.glob("params/*.yaml"), *notebooks.glob("params/*.yml")])


def test_committed_notebooks_hold_no_secrets():
    files = committed_notebook_files()
    scanned, findings = 0, {}
    for path in files:
        text = file_text(path)
        if path.suffix == ".ipynb":  # a notebook that parsed to nothing was not really scanned
            assert json.loads(path.read_text(encoding="utf-8"))["cells"], f"{path} has no cells"
        scanned += 1
        if found := find_secrets(text):
            findings[str(path.relative_to(ROOT))] = found
    assert scanned == len(files)
    assert not findings, f"key-like strings in committed notebooks: {findings}"


# -- a real run: its logs and its files -------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """Two tiny epochs (4 steps; a checkpoint at the first epoch's end), fake credentials in the environment."""
    job = tmp_path_factory.mktemp("secrets") / "job"
    secrets = fake_secrets()
    env = {"HF_TOKEN": secrets["Hugging Face token"], "GOOGLE_API_KEY": secrets["Google API key"],
           "AWS_ACCESS_KEY_ID": secrets["AWS access key id"], "NLI_TEST_OAUTH": secrets["OAuth access token"],
           "NLI_TEST_SECRET": secrets["assigned secret"]}
    proc = run_task("--profile", "smoke", "--model_name_or_path", tiny_model(), "--num_train_epochs", "2",
                    "--max_train_samples", "32", "--per_device_train_batch_size", "16", "--logging_steps", "1",
                    "--output_dir", str(job), "--no-progress", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, job, secrets


def test_run_logs_and_files_hold_no_secrets(short_run):
    proc, job, secrets = short_run
    files = sorted(p for p in job.rglob("*") if p.is_file())
    assert {"metrics.json", "model.safetensors", "train_config.json"} <= {p.name for p in files}
    texts = {"stdout": proc.stdout, "stderr": proc.stderr} | {str(p.relative_to(job)): file_text(p) for p in files}
    leaked = {where: [name for name, s in secrets.items() if s in text] for where, text in texts.items()}
    assert not any(leaked.values()), f"credentials from the environment were written: {leaked}"
    findings = {where: found for where, text in texts.items() if (found := find_secrets(text))}
    assert not findings, f"key-like strings in the run's output: {findings}"


def test_run_writes_safetensors_and_no_pickle_but_checkpoint_state(short_run):
    import torch

    _, job, _ = short_run
    files = sorted(p for p in job.rglob("*") if p.is_file())
    assert (job / "model.safetensors").is_file()
    assert not [p for p in files if p.name in ("pytorch_model.bin", "training_args.bin")]
    for weights in (p for p in files if p.suffix == ".safetensors"):
        header_len = int.from_bytes(weights.read_bytes()[:8], "little")
        json.loads(weights.read_bytes()[8:8 + header_len])  # a safetensors header: JSON, no code
    pickles = {p: kind for p in files if (kind := pickle_kind(p))}
    assert {p.name for p in pickles} <= PICKLE_ALLOWED, f"pickle files written: {pickles}"
    checkpoints = {p.parent.name for p in files if p.name == "manifest.json"}
    assert checkpoints and pickles, "the run wrote no checkpoint: its training state went unchecked"
    for state in pickles:  # training state: tensors and plain values only
        loaded = torch.load(state, map_location="cpu", weights_only=True)
        assert isinstance(loaded, dict) and "optimizer" in loaded
