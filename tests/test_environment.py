"""environment.yml, pyproject.toml and constraints.txt must tell the same story."""

import re

import tomllib
import yaml
from packaging.requirements import Requirement

from tests.helpers import ROOT


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonical(name)] = version
    return pins


def pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra if not r.startswith("nli-helpers")]
    return reqs


def environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return {canonical(r.split("==")[0]): r.split("==")[1] for r in pip if "==" in r}


def test_environment_pins_equal_the_constraints():
    pins, env = constraints(), environment_pins()
    assert {name: pins.get(name) for name in env} == env


def test_every_pyproject_dependency_is_pinned_in_environment_and_constraints():
    env, pins = environment_pins(), constraints()
    for req in pyproject_requirements():
        name = canonical(req.name)
        assert name in env, f"{name} is in pyproject.toml but not environment.yml"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} violates pyproject's {req.specifier}"


def test_the_tested_pins_the_issue_asks_for():
    pins = constraints()
    assert pins["torch"] == "2.13.0"
    assert pins["fsspec"] == "2026.9.0"


def test_pyproject_uses_ranges_not_pins_for_torch():
    torch_req = next(r for r in pyproject_requirements() if r.name == "torch")
    assert "==" not in str(torch_req.specifier), "a pinned torch would replace Vertex's CUDA build"


def test_the_vertex_extra_installs_what_build_sdist_runs():
    # vertex.build_sdist runs `python -m build`: a user who installed only nli-helpers[vertex] must have it.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "build" in {canonical(Requirement(r).name) for r in extras["vertex"]}
