"""The parameters a notebook declares, out of papermill parameter files: what `make demo` gives it.

    python notebooks/params/declared.py notebooks/04_submit_vertex.ipynb \
        notebooks/params/smoke.yaml                         # prints YAML, for papermill -f

papermill injects every name of the files it is given, declared or not (it only warns "Passed
unknown parameter"), and the names serve six notebooks: an undeclared one would stand in a
notebook's injected cell, unused. The later file wins, as papermill's later `-f` does.
`papermill.inspect_notebook` reads the parameters cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import papermill
import yaml


def declared(notebook: str | Path, param_files: list[str | Path]) -> dict:
    names = papermill.inspect_notebook(str(notebook))
    merged: dict = {}
    for path in param_files:
        merged.update(yaml.safe_load(Path(path).read_text()) or {})
    return {name: value for name, value in merged.items() if name in names}


if __name__ == "__main__":
    print(yaml.safe_dump(declared(sys.argv[1], sys.argv[2:]), sort_keys=False), end="")
