"""environment.yml, pyproject.toml and constraints.txt must tell the same story.

environment.yml is a Workbench user's environment: the package with its runtime extras (RUNTIME_EXTRAS), every
requirement of those pinned as constraints.txt pins it, and none of the test toolchain ([dev]), which `make venv`
or `pip install -e '.[dev]' -c constraints.txt` installs. There is no conda here: the YAML is parsed.
"""

import re
import tomllib

import nbformat
import yaml
from packaging.requirements import Requirement

from tests.helpers import ROOT

RUNTIME_EXTRAS = ("smoke", "notebooks", "vertex", "practice")
KERNEL = "Python (nli-workbench)"  # the display name README registers and every notebook asks for


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonical(name)] = version
    return pins


def extras() -> dict[str, list[Requirement]]:
    """Each extra's own requirements, without its references to other extras (nli-helpers[...])."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs if not r.startswith("nli-helpers")]
            for name, reqs in project["optional-dependencies"].items()}


def pyproject_requirements(*names: str) -> list[Requirement]:
    """The base requirements plus those of the named extras (all extras when none are named)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for name, extra in extras().items():
        if not names or name in names:
            reqs += extra
    return reqs


def environment_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


def environment_pins() -> dict[str, str]:
    return {canonical(r.split("==")[0]): r.split("==")[1] for r in environment_pip() if "==" in r}


def test_environment_pins_equal_the_constraints():
    pins, env = constraints(), environment_pins()
    assert {name: pins.get(name) for name in env} == env


def test_environment_installs_every_other_package_at_the_constraints_too():
    assert environment_pip()[0] == "-c constraints.txt"  # what the runtime extras pull in, not only the 28 named
    assert (ROOT / "constraints.txt").is_file()


def test_environment_installs_the_package_with_its_runtime_extras_not_dev():
    editable = [r for r in environment_pip() if r.startswith("-e ")]
    assert editable == [f"-e .[{','.join(RUNTIME_EXTRAS)}]", "-e ./localcloud"], editable


def test_every_runtime_dependency_is_pinned_in_environment_and_constraints():
    env, pins = environment_pins(), constraints()
    for req in pyproject_requirements(*RUNTIME_EXTRAS):
        name = canonical(req.name)
        assert name in env, f"{name} is a runtime requirement in pyproject.toml but not pinned in environment.yml"
        assert env[name] == pins[name] and req.specifier.contains(pins[name]), (name, pins[name], req.specifier)


def test_every_pyproject_dependency_is_pinned_in_constraints():
    pins = constraints()
    for req in pyproject_requirements():  # dev and bench too: make venv installs them under constraints.txt
        name = canonical(req.name)
        assert name in pins, f"{name} is in pyproject.toml but not in constraints.txt"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} violates pyproject's {req.specifier}"


def test_no_dev_tool_in_the_workbench_environment():
    runtime = {canonical(r.name) for r in pyproject_requirements(*RUNTIME_EXTRAS)}
    dev_only = {canonical(r.name) for r in extras()["dev"]} - runtime
    assert {"pytest", "nbval", "playwright"} <= dev_only
    assert "gcp-storage-emulator" in runtime  # practice mode (notebooks 04 and 05) runs in the Workbench environment
    assert not dev_only & set(environment_pins()), "the test toolchain belongs to [dev], not environment.yml"


def test_dev_installs_every_other_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    others = set(project["optional-dependencies"]) - {"dev"}
    [ref] = [Requirement(r) for r in project["optional-dependencies"]["dev"] if r.startswith("nli-helpers")]
    assert set(ref.extras) == others  # make venv runs the notebooks, the benchmarks and the tests


def test_the_tested_pins_the_issue_asks_for():
    pins = constraints()
    assert pins["torch"] == "2.13.0"
    assert pins["fsspec"] == "2026.9.0"


def test_every_torch_pin_in_the_instructions_is_the_tested_one():
    # README and environment.yml tell Workbench users which torch to install, by hand for the CUDA 12.6 build.
    pin = constraints()["torch"]
    for name in ("README.md", "environment.yml"):
        text = (ROOT / name).read_text()
        assert set(re.findall(r"torch==([\w.+]+)", text)) == {pin}, name


def test_the_notebooks_name_the_kernel_the_readme_registers():
    readme = (ROOT / "README.md").read_text()
    assert f'--name nli-workbench --display-name "{KERNEL}"' in readme
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        set_up = [c.source for c in nbformat.read(path, as_version=4).cells
                  if c.cell_type == "markdown" and c.source.startswith("## Set up")]
        assert set_up and f"**{KERNEL}**" in set_up[0], f"{path.name}: its Set up section should name the kernel"


def test_pyproject_uses_ranges_not_pins_for_torch():
    torch_req = next(r for r in pyproject_requirements() if r.name == "torch")
    assert "==" not in str(torch_req.specifier), "a pinned torch would replace Vertex's CUDA build"


def test_the_practice_extra_installs_what_build_sdist_runs():
    # localcloud.image.build_sdist runs `python -m build`: practice mode (nli-helpers[practice]) must have it.
    assert "build" in {canonical(r.name) for r in extras()["practice"]}
