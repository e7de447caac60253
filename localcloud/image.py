"""The trainer image's stand-in: docker/Dockerfile's packages in a venv on this machine's Python, and the trainer's
sdist, run outside the checkout as the image runs it.

The image is python:3.11 with the torch constraints.txt pins (its cu126 CUDA build there, the CPU build here when
PyTorch's CPU index answers) and `pip install .[smoke,vertex]` under constraints.txt. `image_venv` builds exactly that
from the project's sdist, cached by the sdist's content, so it is built once and reused until the package changes:
notebook 03 runs the trainer in it, and the Vertex AI fake's jobs run there.

    >>> sdist = build_sdist("runs/package/dist")  # python -m build --sdist
    >>> venv = image_venv(sdist)                    # pinned torch, then the sdist; cached
    >>> run_module(venv.python, "nli_helpers.vertex.entry", ["--profile=smoke", ...], cwd="runs/package",
    ...            env=OFFLINE_ENV)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import urllib.request
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from filelock import FileLock, Timeout
from packaging.requirements import Requirement

from nli_helpers.config import NLIError, cache_dir

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
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
    project = Path(project_dir) if project_dir else Path(__file__).resolve().parents[1]
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


# The image name the tests register with their fakes (the notebooks use vertex.trainer_image_uri's).
TRAINER_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/trainer:test"
# What docker/Dockerfile installs besides torch, but the benchmarks' [bench]: the smoke model, and cloudml-hypertune
# and google-cloud-storage that the Vertex AI entry point uses.
IMAGE_EXTRAS = "smoke,vertex"
KEEP_IMAGE_VENVS = 2  # the one just built and the one before it: about 4 GB
# PyTorch's CPU-only wheels, as the Makefile's TORCH_CPU_INDEX (https://pytorch.org/get-started/locally/: "--index-url
# https://download.pytorch.org/whl/cpu"): PyPI's default Linux torch is the CUDA 13.0 build with several GB of
# nvidia-* wheels, which a stand-in that never sees a GPU does not need.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_lock = threading.Lock()
_sdist: Path | None = None


def project_sdist(folder: Path) -> Path:
    """The project's sdist, built (into `folder`) once per process, and again if its folder has been removed since
    (a LocalCloud removes its own when it stops)."""
    global _sdist
    with _lock:
        if _sdist is None or not _sdist.is_file():
            _sdist = build_sdist(folder)
        return _sdist


def trainer_image_python(sdist: Path) -> Path:
    """The python of the image stand-in built from this sdist (with the [smoke,vertex] extras, as the Dockerfile does)."""
    return image_venv(sdist).python


def pinned_torch(constraints: str | Path = CONSTRAINTS) -> str:
    """The torch version constraints.txt pins, e.g. '2.13.0'."""
    found = re.search(r"^torch==(\S+)$", Path(constraints).read_text(), re.M)
    if not found:
        raise PackagingError(f"{constraints} pins no torch==VERSION")
    return found.group(1)


def torch_index(index: str = TORCH_CPU_INDEX) -> list[str]:
    """pip's `--index-url` for torch, as `make venv` chooses it: PyTorch's CPU index on Linux without an NVIDIA GPU
    when it answers; else none (PyPI's default build, or a local wheel)."""
    if sys.platform != "linux" or shutil.which("nvidia-smi"):
        return []
    try:
        urllib.request.urlopen(index + "/torch/", timeout=10).close()
    except OSError:
        return []
    return ["--index-url", index]


def _pip(python: Path, constraints: Path, *requirement: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "-c",
                           str(constraints), *requirement], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=clean_env())
    if proc.returncode:
        raise PackagingError(f"`pip install {' '.join(requirement)}` failed:\n{proc.stderr.strip()[-3000:]}")


@dataclass(frozen=True)
class ImageVenv:
    """A venv built as docker/Dockerfile builds the trainer image."""

    python: Path
    torch: str     # the torch version installed before the sdist
    reused: bool   # built earlier from the same sdist content, extras, constraints and Python


def sdist_digest(sdist: str | Path, *extra: bytes) -> str:
    """A hash of the sdist's files (names and bytes, not timestamps: two builds of one tree agree) and `extra`."""
    digest = hashlib.sha256()
    with tarfile.open(sdist) as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            digest.update(member.name.split("/", 1)[-1].encode() + b"\0" + tar.extractfile(member).read())
    for part in extra:
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def image_venv(sdist: str | Path, *, extras: str = IMAGE_EXTRAS, constraints: str | Path = CONSTRAINTS,
               rebuild: bool = False) -> ImageVenv:
    """The venv the trainer image would be: the pinned torch, then `pip install <sdist>[extras]`.

    Built once per sdist content, extras, constraints and Python under cache_dir()/image-venv/, then reused
    (`rebuild=True` builds again). A lock keeps two processes from building one venv at once; a build that did not
    finish is thrown away. Each is about 2 GB (torch), and every code change makes a new one: building one deletes all
    but the newest KEEP_IMAGE_VENVS.
    """
    sdist, constraints = Path(sdist), Path(constraints)
    key = sdist_digest(sdist, extras.encode(), constraints.read_bytes(), sys.version.encode())
    folder = cache_dir() / "image-venv" / key
    python, record = folder / "venv" / "bin" / "python", folder / "image.json"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if record.is_file() and not rebuild:
            return ImageVenv(python, json.loads(record.read_text())["torch"], reused=True)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder / "venv")], check=True, capture_output=True)
        _pip(python, constraints, *torch_index(), f"torch=={pinned_torch(constraints)}")
        _pip(python, constraints, f"{sdist}[{extras}]")
        torch = installed_version(python, "torch", cwd=folder)
        record.write_text(json.dumps({"sdist": sdist.name, "extras": extras, "torch": torch}))
    remove_image_venvs(keep=KEEP_IMAGE_VENVS)
    return ImageVenv(python, torch, reused=False)


def remove_image_venvs(keep: int = 0) -> int:
    """Delete the cached image venvs but the `keep` most recently built, and what killed builds left (a build under
    way holds its lock and is left alone); returns how many went."""
    built, leftovers = [], []
    for folder in (p for p in (cache_dir() / "image-venv").glob("*") if p.is_dir()):
        record = folder / "image.json"
        if record.is_file():
            built.append((record.stat().st_mtime, folder))
            continue
        try:
            with FileLock(str(folder) + ".lock", timeout=0):
                leftovers.append(folder)
        except Timeout:
            pass
    old = [folder for _, folder in sorted(built)]
    old = old[:-keep] if keep else old
    for folder in old + leftovers:
        shutil.rmtree(folder, ignore_errors=True)
        Path(str(folder) + ".lock").unlink(missing_ok=True)
    return len(old) + len(leftovers)


def installed_version(python: str | Path, dist: str, *, cwd: str | Path) -> str:
    """The version of distribution `dist` installed in that python ('' when absent)."""
    proc = run_module(python, "pip", ["show", dist], cwd=cwd)
    found = re.search(r"^Version: (\S+)$", proc.stdout, re.M)
    return found.group(1) if found else ""
