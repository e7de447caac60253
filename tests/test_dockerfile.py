"""docker/Dockerfile, checked without a Docker engine: it parses, its base image carries the pinned torch, it
installs under constraints.txt without touching torch, and its entry point is the package's task module."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def test_the_parser_joins_continuations_and_rejects_typos():
    steps = parse_dockerfile("# c\nFROM a\nRUN x \\\n  # note\n  && y\n")
    assert [(name, args.split()) for name, args in steps] == [("FROM", ["a"]), ("RUN", ["x", "&&", "y"])]
    with pytest.raises(ValueError, match="unknown Dockerfile instruction 'RUNN'"):
        parse_dockerfile("FROM a\nRUNN x\n")


def test_base_image_is_pinned_pytorch_with_the_constrained_torch(steps):
    froms = [args for name, args in steps if name == "FROM"]
    assert len(froms) == 1 and steps[0][0] == "FROM"
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-(runtime|devel)(@sha256:[0-9a-f]{64})?",
                         froms[0])
    assert match, f"base image {froms[0]} is not a pinned official pytorch/pytorch tag"
    assert match.group(1) == _torch_pin(), "the base image's torch must be the torch constraints.txt pins"


def test_pip_installs_the_package_under_the_constraints_and_keeps_torch(steps):
    sources = [src for name, args in steps if name == "COPY"
               for src in [w for w in args.split() if not w.startswith("--")][:-1]]  # the last word is the target
    assert {"constraints.txt", "pyproject.toml", "README.md", "nli_helpers"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context (the repository root)"
    installs = [shlex.split(args) for name, args in steps if name == "RUN" and "pip install" in args]
    assert len(installs) == 1
    words = installs[0]
    after_install = words[words.index("install") + 1:words.index("&&") if "&&" in words else None]
    assert words[words.index("-c") + 1] == "constraints.txt"
    assert any(w == "." or w.startswith(".[") for w in after_install), "the package itself must be installed"
    assert not any(w.startswith("torch") for w in after_install), "pip must keep the base image's torch"
    assert "torch.__version__" in " ".join(words), "the build should fail if torch changed anyway"


def test_entry_point_runs_the_task_module_of_the_package(steps):
    (entrypoint,) = [args for name, args in steps if name == "ENTRYPOINT"]
    command = json.loads(entrypoint)  # exec form, so Vertex's args are appended as they are
    assert command[:2] == ["python", "-m"]
    module = command[2]
    spec = importlib.util.find_spec(module)
    assert spec is not None and Path(spec.origin).is_relative_to(ROOT / "nli_helpers")
    assert "def main(" in Path(spec.origin).read_text() and '__name__ == "__main__"' in Path(spec.origin).read_text()
