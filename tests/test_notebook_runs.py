"""Headless notebook runs (`python -m nli_helpers.notebook_runs`) on a tiny throwaway notebook: a real
Jupyter kernel through papermill, in seconds."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from nli_helpers import notebook_runs
from nli_helpers.config import NLIError
from tests.helpers import ROOT


def write_notebook(folder: Path, name: str = "01_tiny.ipynb") -> Path:
    """Writes metrics.json into job_dir (like notebook 02) and prints a summary line; fails on demand."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    params = new_code_cell('job_dir = None  # where to write\nscore: float = 0.5  # accuracy to report\n'
                           'fail: bool = False  # raise at the end')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        new_markdown_cell("# tiny"),
        new_code_cell("import json, pathlib"),
        params,
        new_code_cell("print(f'validation_matched acc {score:.3f} F1 0.1')\n"
                      "if job_dir:\n"
                      "    pathlib.Path(job_dir).mkdir(parents=True, exist_ok=True)\n"
                      "    m = {'validation_matched': {'accuracy': score}, 'train': {'steps': 1}}\n"
                      "    (pathlib.Path(job_dir) / 'metrics.json').write_text(json.dumps(m))"),
        new_code_cell("assert not fail, 'asked to fail'"),
    ]
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_notebook(tmp_path_factory.mktemp("nbs"))


def test_a_run_writes_the_executed_notebook_artefacts_and_summary(tiny, tmp_path):
    lines = []
    runs = notebook_runs.run_notebooks([tiny], {"score": 0.75}, tmp_path / "out",
                                       echo=lambda *a, **k: lines.append(a[0]))
    (run,) = runs
    assert run.status == "ok" and run.error is None, run.error
    assert run.accuracy == {"validation_matched": 0.75}  # read from <job_dir>/metrics.json
    assert Path(run.job_dir) == tmp_path / "out" / "01_tiny"
    executed = nbformat.read(tmp_path / "out" / "01_tiny.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["params"] == {"score": 0.75} and summary["runs"][0]["status"] == "ok"
    assert lines[0].startswith("[1/1] 01_tiny.ipynb")
    text = notebook_runs.format_summary(runs, tmp_path / "out")
    assert "01_tiny" in text and "0.750" in text and "matched acc" in text


def test_cli_reports_a_failing_notebook_and_exits_non_zero(tiny, tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text("score: 0.25\nfail: true\n")
    code = notebook_runs.main([str(tiny), "--params", str(params), "-p", "score", "0.5", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 1
    assert "failed" in out and "AssertionError: asked to fail" in out
    assert "0.500" in out  # -p overrides the file; the accuracy still comes from metrics.json


def test_unknown_parameters_are_refused_before_running(tiny, tmp_path):
    with pytest.raises(NLIError, match="unknown notebook parameter.*learning_rat"):
        notebook_runs.run_notebooks([tiny], {"learning_rat": 1e-4}, tmp_path)
    assert notebook_runs.main([str(tiny), "-p", "learning_rat", "1", "--out", str(tmp_path)]) == 2


def test_parameters_declared_by_a_sibling_notebook_are_accepted(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    first = write_notebook(folder, "01_a.ipynb")
    sibling = nbformat.read(first, as_version=4)
    sibling.cells[2].source += "\nonly_here: int = 1  # a parameter of the second notebook"
    nbformat.write(sibling, folder / "02_b.ipynb")
    notebook_runs.check_params({"only_here": 2, "score": 0.1}, [first])
    with pytest.raises(NLIError):
        notebook_runs.check_params({"nowhere": 2}, [first])


def test_load_params_reads_yaml_then_pairs(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("profile: smoke\nlearning_rate: 2.0e-5\n")
    assert notebook_runs.load_params(f, [("epochs", "1"), ("data", "null")]) == {
        "profile": "smoke", "learning_rate": 2e-5, "epochs": 1, "data": None}
    with pytest.raises(NLIError, match="does not exist"):
        notebook_runs.load_params(tmp_path / "missing.yaml")
    f.write_text("- a list\n")
    with pytest.raises(NLIError, match="mapping"):
        notebook_runs.load_params(f)


def test_accuracy_falls_back_to_the_executed_notebook(tmp_path):
    executed = tmp_path / "x.ipynb"
    nb = new_notebook()
    cell = new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="epoch 1\ndone; validation_matched acc 0.612 F1 0.5 | "
                                                "validation_mismatched acc 0.580 F1 0.5\n")]
    nb.cells = [cell]
    nbformat.write(nb, executed)
    assert notebook_runs.final_accuracy("gs://bucket/run", executed) == {
        "validation_matched": 0.612, "validation_mismatched": 0.58}
    assert notebook_runs.final_accuracy(None, tmp_path / "absent.ipynb") is None


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


def test_find_notebooks_lists_the_numbered_ones(tmp_path):
    assert [p.name for p in notebook_runs.find_notebooks(ROOT / "notebooks")][:2] == [
        "01_explore_mnli.ipynb", "02_finetune_local.ipynb"]
    with pytest.raises(NLIError, match="no numbered notebooks"):
        notebook_runs.find_notebooks(tmp_path)


def test_latest_run_finds_the_newest_finished_run_in_either_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("NLI_RUNS_DIR", str(tmp_path))
    assert notebook_runs.latest_run() is None
    with pytest.raises(NLIError, match=r"no finished run of 02_finetune_local under .*run notebooks/02_finetune_local"):
        notebook_runs.latest_run(required=True)
    interactive = tmp_path / "finetune-20261123-090000"
    headless = tmp_path / "20261123-100000" / "02_finetune_local"
    unfinished = tmp_path / "finetune-20261123-110000"  # no metrics.json yet: not a run to compare with
    for folder in (interactive, headless, unfinished):
        folder.mkdir(parents=True)
    (interactive / "metrics.json").write_text("{}")
    assert notebook_runs.latest_run() == interactive
    (headless / "metrics.json").write_text("{}")
    os.utime(interactive / "metrics.json", (1_000_000, 1_000_000))
    assert notebook_runs.latest_run() == headless
    assert notebook_runs.latest_run("vertex", "04_submit_vertex") is None
