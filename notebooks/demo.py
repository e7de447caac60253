"""Run the notebooks headless with papermill, each given only the parameters it declares.

    python notebooks/demo.py --params notebooks/params/smoke.yaml     # all, into runs/demo-<time>/
    python notebooks/demo.py --params notebooks/params/smoke.yaml --out runs/mine \
        notebooks/02_finetune_local.ipynb                               # one, into runs/mine/

This is what `make demo` runs. papermill injects every name of the files it is given, declared or
not (it only warns "Passed unknown parameter"), and the parameter files serve every notebook: an
undeclared name would stand in a notebook's injected cell, unused. So each notebook gets the names
its parameters cell declares (`papermill.inspect_notebook`), the later file winning as papermill's
later `-f` does; that YAML is kept beside the executed copy. One process runs them all, as
`papermill -f PARAMS NOTEBOOK OUT --cwd notebooks` would one by one: papermill's import is paid
once, not once a notebook. It stops at the first notebook that fails, naming its cell.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from pathlib import Path

import papermill
import yaml

NOTEBOOKS = Path(__file__).resolve().parent


def merged(param_files: list[str | Path]) -> dict:
    """The parameter files as one dict, a later file winning."""
    values: dict = {}
    for path in param_files:
        values.update(yaml.safe_load(Path(path).read_text()) or {})
    return values


def declared(notebook: str | Path, values: dict) -> dict:
    """The `values` whose names the notebook's parameters cell declares."""
    names = papermill.inspect_notebook(str(notebook))
    return {name: value for name, value in values.items() if name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run, in order (default: notebooks/[0-9][0-9]_*.ipynb)")
    parser.add_argument("--params", nargs="*", default=[], type=Path,
                        help="papermill parameter files; a later file wins")
    parser.add_argument("--out", type=Path,
                        help="where the executed copies go (default: runs/demo-<time>)")
    args = parser.parse_args(argv)
    missing = [str(path) for path in [*args.notebooks, *args.params] if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    notebooks = args.notebooks or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    out = args.out or NOTEBOOKS.parent / "runs" / f"demo-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    values = merged(args.params)
    logging.getLogger("papermill").setLevel(logging.ERROR)  # papermill's CLI --log-level ERROR
    for notebook in notebooks:
        start = time.monotonic()
        print(f"{notebook.name} ...", flush=True)
        parameters = declared(notebook, values)
        (out / f"{notebook.stem}.yaml").write_text(yaml.safe_dump(parameters, sort_keys=False))
        try:
            papermill.execute_notebook(notebook, out / notebook.name, parameters=parameters,
                                       cwd=notebook.resolve().parent, progress_bar=False)
        except papermill.PapermillExecutionError as e:
            print(f"{notebook.name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}\n"
                  f"the executed copy, with the traceback: {out / notebook.name}", file=sys.stderr)
            return 1
        print(f"  ok in {time.monotonic() - start:.0f}s", flush=True)
    print(f"executed notebooks: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
