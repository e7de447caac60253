"""The shape of the code: one-way layers and no import circles (import-linter), no module over 400 lines, and one
I/O path (fsspec, through `files`).

The contracts live in pyproject.toml ([tool.importlinter]); `make lint` runs the same `lint-imports`.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.helpers import ROOT

MAX_MODULE_LINES = 400  # every module, no exemptions
PACKAGES = ("nli_helpers", "localcloud")
# What only the platform module (nli_helpers/vertex/) may name: Vertex AI's environment contract.
PLATFORM_WORDS = re.compile(r"AIP_|CLOUD_ML_|CLUSTER_SPEC|hypertune", re.IGNORECASE)


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=root, capture_output=True,
                          text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_contracts_catch_an_upward_import_and_a_circle(tmp_path):
    """The checker itself: a copy of the package where `config` imports `train` breaks the layers and the acyclic
    contract, so a green run above means something."""
    for name in ("pyproject.toml", *PACKAGES, "tests"):
        source = ROOT / name
        if source.is_dir():
            subprocess.run(["cp", "-r", str(source), str(tmp_path / name)], check=True)
        else:
            (tmp_path / name).write_text(source.read_text())
    config = tmp_path / "nli_helpers" / "config.py"
    config.write_text(config.read_text() + textwrap.dedent("""
        def _upward():
            from nli_helpers import train  # noqa: F401
    """))
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "nli_helpers.config is not allowed to import nli_helpers.train" in result.stdout
    assert "3 kept, 2 broken" in result.stdout  # the layers and the circle (config -> train -> ... -> config)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_its_line_budget(package):
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / package).rglob("*.py")}
    assert sizes, f"no modules found under {package}"
    too_long = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"split these along their jobs (at most {MAX_MODULE_LINES} lines a module): {too_long}"


def test_no_trainer_file_names_the_platform_contract():
    """Vertex AI's environment, its tuning report and its cluster spec live in nli_helpers/vertex/ only: the
    trainer takes `should_stop`, callbacks and a Platform, and knows no environment variable of Vertex AI's."""
    named = {f"{p.name}:{i}": line.strip() for p in (ROOT / "nli_helpers").glob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if PLATFORM_WORDS.search(line)}
    assert named == {}, named


def test_every_package_module_is_placed_in_a_layer():
    """A new module must be given its row in the layers contract, or the contract would not see its imports."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    placed = {name.strip() for row in layers["layers"] for name in row.replace(":", "|").split("|")}
    modules = {p.stem if p.name != "__init__.py" else p.parent.name for p in (ROOT / "nli_helpers").glob("*")
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert modules - placed == set(), f"add these to a row of [tool.importlinter] layers: {modules - placed}"
    assert placed - modules == set(), f"these rows name modules that do not exist: {placed - modules}"


def test_the_loop_imports_at_most_five_siblings():
    """train.py reads in one sitting: what it needs from the package comes from five modules at most (config,
    distributed, checkpoint, step, which holds the pieces of a step and --torch_compile's, and tracking, the
    log). Cloud Storage never reaches it: checkpoints and TensorBoard write through `files`."""
    tree = ast.parse((ROOT / "nli_helpers" / "train.py").read_text())
    siblings = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
    siblings |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.level == 1 and node.module is None for alias in node.names}
    assert len(siblings - {None}) <= 5, f"train.py imports {sorted(siblings - {None})}"


def imported_packages(path: Path) -> set[str]:
    """The top-level names of what a module imports from outside the package, function-level imports included."""
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return {name.split(".")[0] for name in names}


def test_one_io_path_for_local_files_and_cloud_storage():
    """Local paths and gs:// take the same fsspec calls, through `files` only (paths, copies, checks, and the
    readers of each file format); no other trainer module names a Cloud Storage client (gcsfs, google.cloud). `files` names
    gcsfs inside the function that makes a gs:// file system (its requests' retries, bounded and said), so a local run
    never imports it (tests/test_task.py runs one and looks)."""
    trainer = sorted((ROOT / "nli_helpers").glob("*.py"))
    assert {p.stem for p in trainer} >= {"files", "checkpoint", "run", "data"}
    uses = {p.stem: imported_packages(p) for p in trainer}
    assert sorted(name for name, packages in uses.items() if "fsspec" in packages) == ["files"]
    assert {name: packages & {"gcsfs", "google"} for name, packages in uses.items()
            if packages & {"gcsfs", "google"}} == {"files": {"gcsfs"}}


def test_the_package_version_is_the_one_pyproject_gives():
    import nli_helpers

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == nli_helpers.__version__


def test_a_trainer_process_on_vertex_imports_nothing_of_the_submission_side():
    """The image runs `python -m nli_helpers.vertex.entry` on every process: the checks, prices, image tables, pools
    and jobs modules are the notebook's side, and would only slow every rank's start."""
    code = ("import sys, nli_helpers.vertex.entry, nli_helpers.vertex.launch; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('nli_helpers.vertex'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == ["nli_helpers.vertex", "nli_helpers.vertex.entry", "nli_helpers.vertex.environment",
                                     "nli_helpers.vertex.launch"]
