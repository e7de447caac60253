"""The trainer's sdist, installed the way Vertex's prebuilt PyTorch container installs it, trains on the smoke profile.

The "container" is a fresh venv holding only the pinned torch (session fixture `container_python`, shared with
the Vertex tests); the sdist goes in on top under constraints.txt and must leave that torch alone. The steps are
`nli_helpers.packaging`'s, which notebook 03 shows.
"""

from __future__ import annotations

import json
from pathlib import Path

from nli_helpers import packaging
from nli_helpers.config import make_config
from nli_helpers.vertex import build_sdist

ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.fake_vertex"]  # fixtures: container_python, sdist_path


def test_sdist_holds_the_package_and_its_sample_and_nothing_else(tmp_path):
    modules = {f"nli_helpers/{p.name}" for p in (ROOT / "nli_helpers").glob("*.py")}
    sdist = build_sdist(tmp_path)  # a fresh build: the session's may predate a module added since
    names = {name for name, _ in packaging.sdist_members(sdist)}
    assert modules <= names, f"modules missing from the sdist: {sorted(modules - names)}"
    assert "nli_helpers/sample/mnli_sample.jsonl" in names
    assert "pyproject.toml" in names
    unwanted = sorted(n for n in names if n.split("/")[0] in ("tests", "runs", ".venv", "notebooks", "dist", "build",
                                                               "benchmarks", "docker", ".git"))
    assert not unwanted, f"the sdist should hold only the package: {unwanted}"


def test_sdist_installs_over_the_container_torch_and_trains(container_python, sdist_path, tmp_path):
    before = packaging.installed_version(container_python, "torch", cwd=tmp_path)
    assert before.split("+")[0] == packaging.pinned_torch()  # the "prebuilt container" holds the pinned torch

    install = packaging.install_sdist(container_python, sdist_path, extras="smoke")
    assert any(d.startswith("nli_helpers-") or d.startswith("nli-helpers-") for d in install.installed), install
    assert packaging.installed_version(container_python, "torch", cwd=tmp_path) == before, \
        "installing the sdist replaced the container's torch"
    check = packaging.run_module(container_python, "pip", ["check"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout

    where = packaging.run_module(container_python, "nli_helpers.task", ["--help"], cwd=tmp_path)
    assert where.returncode == 0 and "--max_train_samples" in where.stdout
    located = packaging.run_module(container_python, "pip", ["show", "-f", "nli-helpers"], cwd=tmp_path).stdout
    assert "site-packages" in located and str(ROOT) not in located  # the installed copy, not the checkout

    cfg = make_config("smoke", max_train_samples=64, epochs=1, model_name="tiny-random", job_dir=str(tmp_path / "job"))
    packaging.run_task(container_python, cfg, cwd=tmp_path)  # raises PackagingError with the run's stderr
    metrics = json.loads((tmp_path / "job" / "metrics.json").read_text())
    assert metrics["train"]["examples"] == 64
    assert 0 <= metrics["validation_matched"]["accuracy"] <= 1
