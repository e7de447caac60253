"""The trainer's sdist, installed the way Vertex's prebuilt PyTorch container installs it, trains on the smoke profile.

The "container" is a fresh venv holding only the pinned torch (session fixture `container_python`, shared with
the Vertex tests); the sdist goes in on top under constraints.txt and must leave that torch alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

from nli_helpers.vertex import build_sdist

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"

pytest_plugins = ["tests.fake_vertex"]  # fixtures: container_python, sdist_path


def _run(python: Path, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    # Outside the checkout and without the test venv's paths, as on a Vertex worker.
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NLI_REAL_DATA")}
    return subprocess.run([str(python), *args], cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=900)


def _torch_version(python: Path, cwd: Path) -> str:
    return _run(python, "-c", "import importlib.metadata as m; print(m.version('torch'))", cwd=cwd).stdout.strip()


def test_sdist_holds_the_package_and_its_sample_and_nothing_else(tmp_path):
    modules = {f"nli_helpers/{p.name}" for p in (ROOT / "nli_helpers").glob("*.py")}
    sdist = build_sdist(tmp_path)  # a fresh build: the session's may predate a module added since
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert modules <= names, f"modules missing from the sdist: {sorted(modules - names)}"
    assert "nli_helpers/sample/mnli_sample.jsonl" in names
    assert "pyproject.toml" in names
    unwanted = sorted(n for n in names if n.split("/")[0] in ("tests", "runs", ".venv", "notebooks", "dist", "build",
                                                               "benchmarks", "docker", ".git"))
    assert not unwanted, f"the sdist should hold only the package: {unwanted}"


def test_sdist_installs_over_the_container_torch_and_trains(container_python, sdist_path, tmp_path):
    pin = next(line.split("==")[1] for line in CONSTRAINTS.read_text().splitlines() if line.startswith("torch=="))
    before = _torch_version(container_python, tmp_path)
    assert before.split("+")[0] == pin  # the "prebuilt container" holds the pinned torch and nothing else

    install = _run(container_python, "-m", "pip", "install", "--disable-pip-version-check", "-c", str(CONSTRAINTS),
                   f"{sdist_path}[smoke]", cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]
    assert _torch_version(container_python, tmp_path) == before, "installing the sdist replaced the container's torch"
    check = _run(container_python, "-m", "pip", "check", cwd=tmp_path)
    assert check.returncode == 0, check.stdout

    where = _run(container_python, "-c", "import nli_helpers; print(nli_helpers.__file__)", cwd=tmp_path).stdout
    assert "site-packages" in where and str(ROOT) not in where  # the installed copy, not the checkout

    job_dir = tmp_path / "job"
    run = _run(container_python, "-m", "nli_helpers.task", "--profile", "smoke", "--max_train_samples", "64",
               "--epochs", "1", "--model_name", "tiny-random", "--job-dir", str(job_dir), "--no-progress",
               cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["train"]["examples"] == 64
    assert 0 <= metrics["validation_matched"]["accuracy"] <= 1
