"""Build the trainer's sdist, the package docker/Dockerfile installs into the trainer image, and run
the installed trainer outside the checkout, as the image does:

    >>> sdist = build_sdist("runs/package/dist")
    >>> run_module(python, "nli_helpers.vertex.entry", ["--profile=smoke", ...],
    ...            cwd="runs/package", env=OFFLINE_ENV)

The image's local stand-in (a venv with the pinned torch, then the sdist) is localcloud/image.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

from nli_helpers.config import NLIError

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
# What a container would not have: the checkout on the path, the notebook's venv, the data file;
# and a Jupyter kernel's colour switches, which put ANSI codes into the output parsed here.
HOST_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "NLI_REAL_DATA", "FORCE_COLOR",
                 "CLICOLOR_FORCE")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TIMEOUT_S = 1800


class PackagingError(NLIError):
    """Creating the venv, installing the sdist or running it failed (the message holds the tail)."""


def build_sdist(out_dir: str | Path | None = None, project_dir: str | Path | None = None) -> Path:
    """Run `python -m build --sdist` on the project and return the .tar.gz path."""
    project = Path(project_dir) if project_dir else Path(__file__).resolve().parents[2]
    if not (project / "pyproject.toml").is_file():
        raise PackagingError(f"no pyproject.toml in {project}: build_sdist needs the project's "
                             "source checkout")
    out = Path(out_dir) if out_dir else project / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out),
                           str(project)], capture_output=True, text=True, env=clean_env())
    built = re.findall(r"Successfully built (\S+\.tar\.gz)", proc.stdout)
    if proc.returncode or not built:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise PackagingError("`python -m build --sdist` failed (is `build` installed? pip install "
                             f"build):\n{tail}")
    return out / built[-1]


def sdist_requirements(sdist: str | Path) -> list[Requirement]:
    """What the sdist asks pip for: its PKG-INFO's Requires-Dist, without extras-only ones."""
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers()
                      if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        info = Parser().parsestr(tar.extractfile(member).read().decode())
    requirements = [Requirement(line) for line in info.get_all("Requires-Dist") or []]
    return [r for r in requirements if not (r.marker and "extra" in str(r.marker))]


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what a container would not have, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in HOST_ONLY_ENV}, "NO_COLOR": "1",
            **(extra or {})}


def run_module(python: str | Path, module: str, args: list[str], *, cwd: str | Path,
               env: dict[str, str] | None = None,
               timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    """`python -m module ARGS` in `cwd` (outside the checkout: the installed copy is imported)."""
    return subprocess.run([str(python), "-m", module, *args], cwd=cwd, env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout)

