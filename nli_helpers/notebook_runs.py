"""Run the numbered notebooks headlessly with papermill and print a one-screen summary.

    python -m nli_helpers.notebook_runs --params notebooks/params/smoke.yaml     # what `make demo` runs
    python -m nli_helpers.notebook_runs notebooks/02_finetune_local.ipynb -p epochs 1
    python -m nli_helpers.notebook_runs --help

A run writes everything under the project's git-ignored `runs/<timestamp>/`: the executed
notebooks, the training artefacts of every notebook that declares a `job_dir` parameter (in
`runs/<timestamp>/<notebook>/`, unless you pass `job_dir` yourself) and `summary.json`. The
summary gives, per notebook, its status, wall time and final accuracy, read from the run's
`metrics.json` (or, when the job dir is not local, from the accuracy line the notebook printed).

Parameters come from a YAML file (`--params`) and `-p NAME VALUE` pairs (values parsed as YAML);
each notebook receives only the parameters its `parameters` cell declares, and a name that no
selected notebook declares is an error, so a typo never runs silently with defaults.
`project_root` and `new_run_dir` are also what the notebooks use to keep artefacts under `runs/`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .config import NLIError

NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
ACCURACY_RE = re.compile(r"(validation_\w+) acc ([0-9.]+)")


# -- where runs go -------------------------------------------------------------------------------
def project_root(start: str | Path | None = None) -> Path:
    """The checkout that holds the notebooks: the nearest folder above `start` (default: the current
    directory, e.g. notebooks/ in JupyterLab) with a pyproject.toml, else the folder above this
    package when it is an editable install, else `start` itself."""
    start = Path(start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "notebooks").is_dir():
            return folder
    package_parent = Path(__file__).resolve().parents[1]
    return package_parent if (package_parent / "pyproject.toml").is_file() else start


def runs_dir(root: str | Path | None = None) -> Path:
    """Where runs go: `$NLI_RUNS_DIR` when set (tests point it at a temporary folder), else the
    project's git-ignored `runs/`."""
    return Path(os.environ["NLI_RUNS_DIR"]) if os.environ.get("NLI_RUNS_DIR") else project_root(root) / "runs"


def new_run_dir(prefix: str, root: str | Path | None = None) -> Path:
    """A new, empty `<runs>/<prefix>-<time>` folder for one run's artefacts (see `runs_dir`); created here, with a
    `-2`, `-3`, ... suffix when another run took that second (two notebooks, or a sweep, starting together)."""
    base = runs_dir(root) / f"{prefix}-{datetime.now():%Y%m%d-%H%M%S}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise NLIError(f"cannot make a new run folder next to {base}: 999 runs started in that second")


def latest_run(prefix: str = "finetune", notebook: str = "02_finetune_local",
               root: str | Path | None = None, *, required: bool = False) -> Path | None:
    """The newest finished run of a notebook: `<runs>/<prefix>-<time>/` (run in Jupyter) or `<runs>/<time>/<notebook>/`
    (run by `run_notebooks`), whichever is newer; a run counts once its metrics.json is written. None if none is, or
    with `required=True` an NLIError that says to run the notebook first."""
    runs = runs_dir(root)
    found = [*runs.glob(f"{prefix}-*/metrics.json"), *runs.glob(f"*/{notebook}/metrics.json")]
    if not found and required:
        raise NLIError(f"no finished run of {notebook} under {runs}: run notebooks/{notebook}.ipynb first (it "
                       "writes metrics.json at its end), or name the run folder yourself")
    return max(found, key=lambda path: path.stat().st_mtime).parent if found else None


def find_notebooks(folder: str | Path | None = None) -> list[Path]:
    """The numbered notebooks (`01_*.ipynb`, `02_*.ipynb`, ...) of a folder, in order."""
    folder = Path(folder) if folder else project_root() / "notebooks"
    found = sorted(folder.glob(NOTEBOOK_GLOB))
    if not found:
        raise NLIError(f"no numbered notebooks ({NOTEBOOK_GLOB}) in {folder}; pass notebook paths")
    return found


# -- parameters ----------------------------------------------------------------------------------
def notebook_parameters(path: str | Path) -> list[str]:
    """Names declared in a notebook's `parameters` cell, in order (papermill's own parser)."""
    import papermill

    return list(papermill.inspect_notebook(str(path)))


def load_params(path: str | Path | None, pairs: Sequence[Sequence[str]] = ()) -> dict[str, Any]:
    """Parameters from a YAML mapping, then `-p NAME VALUE` pairs (values parsed as YAML)."""
    import yaml

    params: dict[str, Any] = {}
    if path:
        path = Path(path)
        if not path.is_file():
            raise NLIError(f"parameter file {path} does not exist (see notebooks/params/)")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise NLIError(f"{path} must be a YAML mapping of parameter: value lines")
        params.update(loaded)
    for name, value in pairs:
        params[name] = yaml.safe_load(value)
    return params


def check_params(params: dict[str, Any], notebooks: Sequence[Path]) -> None:
    """Fail on a name that neither these notebooks nor their numbered siblings declare (a typo).

    Siblings count so that one shared file (params/smoke.yaml) serves a run of a single notebook.
    """
    siblings = {nb for p in notebooks for nb in Path(p).parent.glob(NOTEBOOK_GLOB)}
    known = {name for nb in {*map(Path, notebooks), *siblings} for name in notebook_parameters(nb)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise NLIError(f"unknown notebook parameter(s) {', '.join(unknown)}; the notebooks "
                       f"declare: {', '.join(sorted(known))}")


# -- one run -------------------------------------------------------------------------------------
@dataclass
class NotebookRun:
    notebook: str
    output: str
    status: str  # "ok" or "failed"
    seconds: float
    accuracy: dict[str, float] | None = None
    error: str | None = None
    job_dir: str | None = None


def run_notebook(path: Path, out_dir: Path, params: dict[str, Any], declared: list[str], *,
                 timeout: int | None = None, kernel_name: str | None = None) -> NotebookRun:
    """Execute one notebook with papermill (cwd: its own folder, as in JupyterLab)."""
    import papermill

    mine = {k: v for k, v in params.items() if k in declared}
    if "job_dir" in declared and mine.get("job_dir") is None:
        mine["job_dir"] = str(out_dir / path.stem)
    output = out_dir / path.name
    start = time.perf_counter()
    status, error = "ok", None
    try:
        papermill.execute_notebook(str(path), str(output), parameters=mine, cwd=str(path.parent),
                                   kernel_name=kernel_name, progress_bar=False, log_output=False,
                                   execution_timeout=timeout)
    except papermill.PapermillExecutionError as e:
        status, error = "failed", f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except Exception as e:  # kernel died, timeout, bad notebook: report it, run the next one
        status, error = "failed", f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - start
    job_dir = mine.get("job_dir")
    return NotebookRun(path.stem, str(output), status, round(seconds, 1),
                       final_accuracy(job_dir, output), error, job_dir)


def final_accuracy(job_dir: str | None, executed: Path) -> dict[str, float] | None:
    """Accuracy per validation split: from `<job_dir>/metrics.json`, else from the executed notebook."""
    metrics_file = Path(job_dir) / "metrics.json" if job_dir and "://" not in job_dir else None
    if metrics_file and metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        return {k: v["accuracy"] for k, v in metrics.items()
                if k.startswith("validation") and isinstance(v, dict) and "accuracy" in v} or None
    if not executed.is_file():
        return None
    found: dict[str, float] = {}
    for cell in json.loads(executed.read_text()).get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = "".join(out.get("text", ""))
                found.update((m[1], float(m[2])) for m in ACCURACY_RE.finditer(text))
    return found or None


# -- many runs and the summary -------------------------------------------------------------------
def run_notebooks(notebooks: Sequence[str | Path], params: dict[str, Any], out_dir: str | Path, *,
                  timeout: int | None = None, kernel_name: str | None = None,
                  echo=print) -> list[NotebookRun]:
    """Run each notebook in turn into `out_dir`, write `out_dir/summary.json`, return the runs."""
    paths = [Path(p).resolve() for p in notebooks]
    for p in paths:
        if not p.is_file():
            raise NLIError(f"notebook {p} does not exist")
    check_params(params, paths)
    declared = {p: notebook_parameters(p) for p in paths}
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, path in enumerate(paths, 1):
        echo(f"[{i}/{len(paths)}] {path.name} ...", flush=True)
        runs.append(run_notebook(path, out_dir, params, declared[path], timeout=timeout, kernel_name=kernel_name))
        echo(f"      {runs[-1].status} in {runs[-1].seconds:.0f}s", flush=True)
    summary = {"params": params, "runs": [asdict(r) for r in runs]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return runs


def format_summary(runs: Sequence[NotebookRun], out_dir: str | Path) -> str:
    """A one-screen table: notebook, status, wall time, final accuracy per split; then any errors."""
    splits = sorted({s for r in runs for s in (r.accuracy or {})})
    heads = ["notebook", "status", "wall"] + [s.removeprefix("validation_") + " acc" for s in splits]
    rows = [[r.notebook, r.status, f"{r.seconds:.0f}s"]
            + [f"{r.accuracy[s]:.3f}" if r.accuracy and s in r.accuracy else "-" for s in splits] for r in runs]
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [heads, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{r.notebook}: {r.error}" for r in runs if r.error]
    lines.append(f"executed notebooks, artefacts and summary.json: {out_dir}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nli_helpers.notebook_runs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: every numbered "
                        "notebook in the project's notebooks/ folder)")
    parser.add_argument("--params", metavar="YAML", help="papermill parameters file, e.g. "
                        "notebooks/params/smoke.yaml")
    parser.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="one parameter (value parsed as YAML); overrides --params")
    parser.add_argument("--out", help="output folder (default: <project>/runs/<timestamp>, or "
                        "$NLI_RUNS_DIR/<timestamp>)")
    parser.add_argument("--timeout", type=int, default=None, help="seconds a single cell may run")
    parser.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # papermill logs every cell at INFO
    try:
        notebooks = args.notebooks or find_notebooks()
        params = load_params(args.params, args.param)
        out_dir = Path(args.out) if args.out else runs_dir() / f"{datetime.now():%Y%m%d-%H%M%S}"
        runs = run_notebooks(notebooks, params, out_dir, timeout=args.timeout, kernel_name=args.kernel)
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(runs, out_dir))
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
