"""Build the trainer's sdist and install it the way docker/Dockerfile builds the trainer image.

The image is Python with the pinned torch, then `pip install <sdist>[smoke,vertex]` under
constraints.txt, running `python -m nli_helpers.vertex.entry ARGS`. This module repeats that here,
so a broken package fails before a cloud job does (notebook 03, tests/test_packaging.py and the
local Vertex fake use it):

    >>> sdist = build_sdist("runs/package/dist")
    >>> sdist_members(sdist)                        # [(path inside the sdist, bytes), ...]
    >>> venv = image_venv(sdist)                    # pinned torch, then the sdist; cached
    >>> run_task(venv.python, make_config("smoke", job_dir="runs/package/job"), cwd="runs/package")
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
import time
from dataclasses import asdict, dataclass
from email.parser import Parser
from pathlib import Path

from filelock import FileLock, Timeout
from packaging.requirements import Requirement

from nli_helpers import storage
from nli_helpers.config import NLIError, TrainConfig, cache_dir, make_config

from .launch import ENTRY_MODULE

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
# What a container would not have: the checkout on the path, the notebook's venv, the data file;
# and a Jupyter kernel's colour switches, which put ANSI codes into the output parsed here.
HOST_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "NLI_REAL_DATA", "FORCE_COLOR",
                 "CLICOLOR_FORCE")
# What docker/Dockerfile installs besides torch, but the benchmarks' [bench]: the smoke model, and
# cloudml-hypertune and google-cloud-storage that the Vertex AI entry point uses.
IMAGE_EXTRAS = "smoke,vertex"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
KEEP_IMAGE_VENVS = 2  # the one just built and the one before it: about 4 GB
TIMEOUT_S = 1800


class PackagingError(NLIError):
    """Creating the venv, installing the sdist or running it failed (the message holds the tail)."""


@dataclass(frozen=True)
class Install:
    """What `pip install` did: the distributions it installed (name-version), and in how long."""

    installed: tuple[str, ...]
    seconds: float


def constraints_file(constraints: str | Path | None = None) -> Path:
    path = Path(constraints) if constraints else CONSTRAINTS
    if not path.is_file():
        raise PackagingError(f"no constraints file at {path}: run this from the project's checkout "
                             "(constraints.txt holds the tested pins)")
    return path


def pinned_torch(constraints: str | Path | None = None) -> str:
    """The torch version constraints.txt pins, e.g. '2.13.0'."""
    found = re.search(r"^torch==(\S+)$", constraints_file(constraints).read_text(), re.M)
    if not found:
        raise PackagingError(f"{constraints_file(constraints)} pins no torch==VERSION")
    return found.group(1)


PACKAGE_PREFIX = "nli-packages"


def build_sdist(out_dir: str | Path | None = None, project_dir: str | Path | None = None) -> Path:
    """Run `python -m build --sdist` on the project and return the .tar.gz path."""
    project = Path(project_dir) if project_dir else Path(__file__).resolve().parents[2]
    if not (project / "pyproject.toml").is_file():
        raise PackagingError(f"no pyproject.toml in {project}: build_sdist needs the project's "
                             "source checkout")
    out = Path(out_dir) if out_dir else project / "dist"
    # A Jupyter kernel sets FORCE_COLOR, and `build` then wraps the file name in ANSI codes.
    env = {**{k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")},
           "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out),
                           str(project)], capture_output=True, text=True, env=env)
    built = re.findall(r"Successfully built (\S+\.tar\.gz)",
                       re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout))
    if proc.returncode or not built:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise PackagingError("`python -m build --sdist` failed (is `build` installed? pip install "
                             f"build):\n{tail}")
    return out / built[-1]


def stage_package(sdist: str | Path, staging_bucket: str) -> str:
    """Upload the sdist under gs://STAGING/nli-packages/<content hash>/ and return its gs:// URI."""
    sdist = Path(sdist)
    if not sdist.is_file():
        raise PackagingError(f"package {sdist} does not exist: build it with "
                             "packaging.build_sdist()")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()[:12]  # same build, same URI
    uri = f"{staging_bucket.rstrip('/')}/{PACKAGE_PREFIX}/{digest}/{sdist.name}"
    return storage.upload(sdist, uri)[0]


def sdist_members(sdist: str | Path) -> list[tuple[str, int]]:
    """(path inside the package, size in bytes) of every file in the sdist, less its top folder."""
    with tarfile.open(sdist) as tar:
        return sorted((m.name.split("/", 1)[1], m.size) for m in tar.getmembers()
                      if m.isfile() and "/" in m.name)


def sdist_requirements(sdist: str | Path) -> list[Requirement]:
    """What the sdist asks pip for: its PKG-INFO's Requires-Dist, without extras-only ones."""
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers()
                      if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        info = Parser().parsestr(tar.extractfile(member).read().decode())
    requirements = [Requirement(line) for line in info.get_all("Requires-Dist") or []]
    return [r for r in requirements if not (r.marker and "extra" in str(r.marker))]


def _pip(python: Path, *args: str,
         constraints: str | Path | None = None) -> subprocess.CompletedProcess:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-c",
               str(constraints_file(constraints)), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=clean_env())
    if proc.returncode:
        raise PackagingError(f"`pip install {' '.join(args)}` failed:\n"
                             f"{proc.stderr.strip()[-3000:]}")
    return proc


def make_container_venv(path: str | Path, *, torch_index_url: str | None = None,
                        constraints: str | Path | None = None) -> Path:
    """A fresh venv holding only the pinned torch, as the trainer image starts; returns its python.
    `torch_index_url`: where torch comes from (https://download.pytorch.org/whl/cpu: CPU only)."""
    path = Path(path)
    if path.exists():
        raise PackagingError(f"{path} already exists: pick a new folder, the point is a fresh "
                             "venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    python = path / "bin" / "python"
    index = ["--index-url", torch_index_url] if torch_index_url else []
    _pip(python, "--quiet", *index, f"torch=={pinned_torch(constraints)}", constraints=constraints)
    return python


def install_sdist(python: str | Path, sdist: str | Path, *, extras: str = "",
                  constraints: str | Path | None = None) -> Install:
    """`pip install <sdist>[extras]` into that python under the constraints, as the image does."""
    start = time.perf_counter()
    requirement = f"{sdist}[{extras}]" if extras else str(sdist)
    proc = _pip(Path(python), requirement, constraints=constraints)
    done = re.findall(r"^Successfully installed (.+)$", proc.stdout, re.M)
    return Install(tuple(done[-1].split()) if done else (), time.perf_counter() - start)


@dataclass(frozen=True)
class ImageVenv:
    """A venv built as docker/Dockerfile builds the trainer image."""

    python: Path
    torch: str         # the torch version installed before the sdist
    install: Install   # what `pip install <sdist>[extras]` did when the venv was built
    reused: bool       # built earlier from the same sdist content, extras, constraints and Python


def sdist_digest(sdist: str | Path, *extra: bytes) -> str:
    """A hash of the sdist's files (names and bytes, not timestamps: two builds of one tree agree)
    and `extra`."""
    digest = hashlib.sha256()
    with tarfile.open(sdist) as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            digest.update(member.name.split("/", 1)[-1].encode() + b"\0"
                          + tar.extractfile(member).read())
    for part in extra:
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def image_venv(sdist: str | Path, *, extras: str = IMAGE_EXTRAS, torch_index_url: str | None = None,
               constraints: str | Path | None = None, rebuild: bool = False) -> ImageVenv:
    """The venv the trainer image would be: the pinned torch, then `pip install <sdist>[extras]`.

    Built once per sdist content, extras, constraints, Python and torch index under
    cache_dir()/image-venv/, then reused (`rebuild=True` builds again). A lock keeps two processes
    from building one venv at once; a build that did not finish is thrown away. Each is about 2 GB
    (torch), and every code change makes a new one: building one deletes all but the newest
    KEEP_IMAGE_VENVS.
    """
    sdist, constraints = Path(sdist), constraints_file(constraints)
    if not sdist.is_file():
        raise PackagingError(f"package {sdist} does not exist: build it with "
                             "packaging.build_sdist()")
    key = sdist_digest(sdist, extras.encode(), constraints.read_bytes(), sys.version.encode(),
                       (torch_index_url or "").encode())
    folder = cache_dir() / "image-venv" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        record = folder / "image.json"
        if record.is_file() and not rebuild:
            built = json.loads(record.read_text())
            return ImageVenv(folder / "venv" / "bin" / "python", built["torch"],
                             Install(tuple(built["install"]["installed"]),
                                     built["install"]["seconds"]), reused=True)
        shutil.rmtree(folder, ignore_errors=True)
        python = make_container_venv(folder / "venv", torch_index_url=torch_index_url,
                                     constraints=constraints)
        torch = installed_version(python, "torch", cwd=folder)
        install = install_sdist(python, sdist, extras=extras, constraints=constraints)
        record.write_text(json.dumps({"sdist": sdist.name, "extras": extras, "torch": torch,
                                      "install": asdict(install)}, indent=1))
    remove_image_venvs(keep=KEEP_IMAGE_VENVS)
    return ImageVenv(python, torch, install, reused=False)


def remove_image_venvs(keep: int = 0) -> int:
    """Delete the cached image venvs but the `keep` most recently built, and what killed builds
    left (a build under way holds its lock and is left alone); returns how many went."""
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


def installed_version(python: str | Path, dist: str, *, cwd: str | Path) -> str:
    """The version of distribution `dist` installed in that python ('' when absent)."""
    proc = run_module(python, "pip", ["show", dist], cwd=cwd)
    found = re.search(r"^Version: (\S+)$", proc.stdout, re.M)
    return found.group(1) if found else ""


def check_run_config(profile: str = "smoke", *, extras: str = IMAGE_EXTRAS, verbose: bool = False,
                     **overrides) -> TrainConfig:
    """`make_config` for a check run of the installed package (notebook 03), except that `smoke`
    without a model named trains `tiny-random` when `extras` leave out [smoke] (the MiniLM)."""
    cfg = make_config(profile, verbose=verbose, **overrides)
    if (cfg.profile == "smoke" and overrides.get("model_name") is None
            and "smoke" not in extras.split(",")):
        cfg = make_config("smoke", **{**overrides, "model_name": "tiny-random"})
    return cfg


def run_task(python: str | Path, cfg: TrainConfig, *,
             cwd: str | Path) -> subprocess.CompletedProcess:
    """Run the installed trainer on `cfg` (with its job_dir set); offline on the smoke profile."""
    if not cfg.job_dir:
        raise PackagingError("set cfg.job_dir: the run's model and metrics.json go there")
    env = OFFLINE_ENV if cfg.profile == "smoke" else {}
    proc = run_module(python, ENTRY_MODULE, [*cfg.to_cli_args(), "--no-progress"], cwd=cwd,
                      env=env)
    if proc.returncode:
        raise PackagingError(f"the installed trainer exited {proc.returncode}:\n"
                             f"{proc.stderr.strip()[-3000:]}")
    return proc
