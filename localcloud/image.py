"""The trainer image's stand-in: docker/Dockerfile's packages in a venv on this machine's Python.

The image is python:3.11 with the torch constraints.txt pins (its cu126 CUDA build there, the CPU build here when
PyTorch's CPU index answers) and `pip install .[smoke,vertex]` under constraints.txt. `image_venv` builds exactly that
from the project's sdist, cached by the sdist's content, so it is built once and reused until the package changes:
notebook 03 runs the trainer in it, and the Vertex AI fake's jobs run there.

    >>> sdist = nli_helpers.vertex.build_sdist("runs/package/dist")
    >>> venv = image_venv(sdist)                    # pinned torch, then the sdist; cached
    >>> packaging.run_module(venv.python, "nli_helpers.vertex.entry", ["--profile=smoke", ...],
    ...                      cwd="runs/package", env=packaging.OFFLINE_ENV)
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from nli_helpers.config import cache_dir
from nli_helpers.vertex import packaging
from nli_helpers.vertex.packaging import (
    CONSTRAINTS,
    TIMEOUT_S,
    PackagingError,
    clean_env,
    run_module,
)

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
            _sdist = packaging.build_sdist(folder)
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
