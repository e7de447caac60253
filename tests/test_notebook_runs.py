"""Where notebook runs go (nli_helpers.notebook_runs), and `make demo`'s papermill command on a tiny notebook."""

import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from nli_helpers import notebook_runs
from nli_helpers.config import NLIError
from tests.helpers import ROOT


def test_runs_go_under_the_project_or_nli_runs_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("NLI_RUNS_DIR", raising=False)
    assert notebook_runs.project_root(ROOT / "notebooks") == ROOT
    run = notebook_runs.new_run_dir("finetune", ROOT / "notebooks")
    assert run.parent == ROOT / "runs" and run.name.startswith("finetune-") and run.is_dir()
    run.rmdir()
    monkeypatch.setenv("NLI_RUNS_DIR", str(tmp_path))
    first, second = notebook_runs.new_run_dir("finetune"), notebook_runs.new_run_dir("finetune")
    assert first.parent == second.parent == tmp_path and first != second  # two runs in one second
    assert first.is_dir() and second.is_dir() and not any(first.iterdir())


def test_latest_run_is_the_newest_finished_one(tmp_path, monkeypatch):
    monkeypatch.setenv("NLI_RUNS_DIR", str(tmp_path))
    assert notebook_runs.latest_run() is None
    with pytest.raises(NLIError, match=r"no finished finetune run under .*run notebooks/02_finetune_local"):
        notebook_runs.latest_run(required=True)
    older, newer = tmp_path / "finetune-20261123-090000", tmp_path / "finetune-20261123-100000"
    unfinished = tmp_path / "finetune-20261123-110000"  # no metrics.json yet: not a run to compare with
    for folder in (older, newer, unfinished):
        folder.mkdir()
    (older / "metrics.json").write_text("{}")
    assert notebook_runs.latest_run() == older
    (newer / "metrics.json").write_text("{}")
    os.utime(older / "metrics.json", (1_000_000, 1_000_000))
    assert notebook_runs.latest_run() == newer
    assert notebook_runs.latest_run("vertex") is None


def test_make_demo_runs_each_notebook_with_papermill_given_only_its_parameters(tmp_path):
    """make demo runs notebooks/demo.py: papermill per notebook, each given the names it declares; a failing notebook
    stops it non-zero, naming the cell."""
    recipe = (ROOT / "Makefile").read_text()
    assert re.search(r"notebooks/demo\.py --out \$\$out --params \$\(PARAMS\)", recipe)
    assert re.search(r"^PARAMS \?= notebooks/params/smoke\.yaml$", recipe, re.M)  # make demo PARAMS=... for another
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    params = new_code_cell("score: float = 0.5  # what to print")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, new_code_cell("assert score < 1, 'score too high'\nprint(f'score {score}')")]
    source = tmp_path / "01_tiny.ipynb"
    nbformat.write(nb, source)
    (tmp_path / "a.yaml").write_text("score: 0.5\nsteps: 3\n")  # steps: a name this notebook does not declare
    (tmp_path / "b.yaml").write_text("score: 0.75\n")  # the later file wins, as papermill's later -f
    demo = [sys.executable, str(ROOT / "notebooks" / "demo.py"), str(source), "--params"]
    ok = subprocess.run([*demo, str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"), "--out", str(tmp_path / "ok")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    outputs = nbformat.read(tmp_path / "ok" / "01_tiny.ipynb", as_version=4).cells[-1].outputs
    assert outputs[0]["text"] == "score 0.75\n"
    assert (tmp_path / "ok" / "01_tiny.yaml").read_text() == "score: 0.75\n"
    (tmp_path / "c.yaml").write_text("score: 2\n")
    failed = subprocess.run([*demo, str(tmp_path / "c.yaml"), "--out", str(tmp_path / "bad")],
                            capture_output=True, text=True)
    # cell 3: papermill's injected parameters cell comes after the notebook's own
    assert failed.returncode == 1 and "failed in cell 3: AssertionError: score too high" in failed.stderr
    typo = subprocess.run([*demo, str(tmp_path / "smoke.yml")], capture_output=True, text=True)
    assert typo.returncode == 2 and f"no such file: {tmp_path / 'smoke.yml'}" in typo.stderr
