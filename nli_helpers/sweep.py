"""A sweep on this machine: run a notebook once per point of a grid with papermill, one row per run.

    >>> results = local_sweep("notebooks/02_finetune_local.ipynb", {"learning_rate": [1e-4, 3e-4]},
    ...                       base_params={"profile": "smoke"})          # -> runs/sweep-<time>/run-01, ...
    >>> best_trial(results); plots.tuning_results(results)

`best_trial` also picks the best row of a Vertex AI tuning job's results (`tuning.tuning_results`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .config import NLIError
from .tracking import DEFAULT_HYPERTUNE_METRIC


def grid_points(grid: Mapping[str, Sequence]) -> list[dict]:
    """Every combination of the grid's values, in order: {"a": [1, 2], "b": [3]} -> [{a:1,b:3}, {a:2,b:3}]."""
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def local_sweep(notebook: str | Path, grid: Mapping[str, Sequence], base_params: Mapping[str, Any] | None = None,
                out_dir: str | Path | None = None, *, timeout: int | None = None, kernel_name: str | None = None,
                echo=print) -> pd.DataFrame:
    """Run `notebook` once per grid point (papermill) into `out_dir/run-NN/`; one row per run.

    Each run gets `base_params` plus its grid point; the notebook's `job_dir` (if it declares one) goes
    to `run-NN/<notebook>/`. The row holds the grid values, status, wall seconds, final accuracy per
    validation split (from the run's metrics.json, else the executed notebook) and where things are.
    The table is also written to `out_dir/sweep.csv`.
    """
    from . import notebook_runs

    path = Path(notebook).resolve()
    if not path.is_file():
        raise NLIError(f"notebook {path} does not exist")
    points = grid_points(grid)
    if not points:
        raise NLIError("the grid is empty: give each parameter at least one value")
    declared = notebook_runs.notebook_parameters(path)
    missing = sorted(set(grid) - set(declared))
    if missing:
        raise NLIError(f"{path.name} does not declare {', '.join(missing)}; its parameters: {', '.join(declared)}")
    base_params = dict(base_params or {})
    notebook_runs.check_params(base_params, [path])
    out_dir = Path(out_dir) if out_dir else notebook_runs.new_run_dir("sweep")
    rows = []
    for i, point in enumerate(points, 1):
        echo(f"[{i}/{len(points)}] {path.name} " + " ".join(f"{k}={v}" for k, v in point.items()), flush=True)
        run_dir = out_dir / f"run-{i:02d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        run = notebook_runs.run_notebook(path, run_dir, {**base_params, **point}, declared, timeout=timeout,
                                         kernel_name=kernel_name)
        echo(f"      {run.status} in {run.seconds:.0f}s" + (f": {run.error}" if run.error else ""), flush=True)
        rows.append({"run": f"run-{i:02d}", **point, "status": run.status, "seconds": run.seconds,
                     **{f"{split}_accuracy": acc for split, acc in (run.accuracy or {}).items()},
                     "error": run.error, "notebook": run.output, "job_dir": run.job_dir})
    results = pd.DataFrame(rows)
    results.attrs.update(metric=DEFAULT_HYPERTUNE_METRIC, goal="maximize", parameters=list(grid))
    out_dir.mkdir(parents=True, exist_ok=True)
    results.to_csv(out_dir / "sweep.csv", index=False)
    return results


def best_trial(results: pd.DataFrame, metric: str | None = None, goal: str | None = None) -> pd.Series:
    """The finished row with the best metric (a local sweep's or a tuning job's results)."""
    metric = metric or results.attrs.get("metric", DEFAULT_HYPERTUNE_METRIC)
    goal = goal or results.attrs.get("goal", "maximize")
    done = results[results.get("state", results.get("status")).isin(["SUCCEEDED", "ok"])]
    done = done[done[metric].notna()] if metric in done else done.iloc[0:0]
    if done.empty:
        raise NLIError(f"no finished run reported {metric}: look at the state/status and error columns")
    return done.loc[done[metric].idxmax() if goal == "maximize" else done[metric].idxmin()]
