"""What an executed notebook must not show, read from the copies `make demo` writes (CI's rehearsal runs it):

    python tests/executed_notebooks.py runs/demo-<time>/      # exit 1, one line a finding

- an ANSI escape: a library's coloured table or a traceback's colours, which JupyterLab renders but a saved or
  printed notebook shows as noise;
- a raw float, ten or more decimals (`0.3333333333333333`): a number printed unformatted (not one quoted in a line
  a library wrote);
- a parameter papermill injected that the notebook's parameters cell does not declare.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[")
# A float printed as Python's repr; one inside quotes is a string some file holds (hypertune's JSON line, shown as is).
RAW_FLOAT = re.compile(r"(?<![\w.\"'])\d+\.\d{10,}(?![\w.])")


def output_texts(cell: dict) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            texts.append("".join(output["text"]))
        texts += ["".join(value) for kind, value in output.get("data", {}).items() if kind == "text/plain"]
        texts += output.get("traceback", [])
    return texts


def assigned(cell: dict) -> set[str]:
    """The names a cell assigns: `seed = 42` (papermill's injected cell), `seed: int = 42` (a parameters cell)."""
    tree = ast.parse("".join(cell["source"]))
    targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in tree.body if isinstance(node, ast.AnnAssign)]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def findings(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    tagged = {tag: cell for cell in cells for tag in cell.get("metadata", {}).get("tags", [])}
    found = []
    if "injected-parameters" in tagged:
        stray = assigned(tagged["injected-parameters"]) - assigned(tagged.get("parameters", {"source": ""}))
        found += [f"{path.name}: papermill injected {name}, which its parameters cell does not declare"
                  for name in sorted(stray)]
    for number, cell in enumerate(cells):
        for text in output_texts(cell):
            if ANSI.search(text):
                found.append(f"{path.name} cell {number}: an ANSI escape in its output: {text[:120]!r}")
            found += [f"{path.name} cell {number}: a raw float {raw} in its output"
                      for raw in RAW_FLOAT.findall(text)[:1]]
    return found


if __name__ == "__main__":
    problems = [line for folder in sys.argv[1:] for path in sorted(Path(folder).glob("*.ipynb"))
                for line in findings(path)]
    print("\n".join(problems) or "executed notebooks: no ANSI escapes, raw floats or undeclared parameters")
    sys.exit(1 if problems else 0)
