"""Every command the docs tell a user to run exists: each `python -m MODULE` of this project and each `python SCRIPT.py`
answers `--help` with a usage, each `make TARGET` is a rule of the Makefile, each notebook and parameter file a
papermill line names is there. The commands are read from the code in README.md, notebooks/README.md,
docker/README.md, benchmarks/README.md (fenced blocks and `inline code`) and the comments of notebooks/params/*.yaml,
so a doc cannot advertise a command that does not exist (as `python -m nli_helpers.notebook_runs --params` once did).
Each flag a documented trainer command line passes is one the trainer's parser has (its flags are TrainConfig's
Hugging Face names: a doc still typing `--job-dir` or `--epochs` fails here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = [ROOT / "README.md", ROOT / "notebooks" / "README.md", ROOT / "docker" / "README.md",
        ROOT / "benchmarks" / "README.md", *sorted((ROOT / "notebooks" / "params").glob("*.yaml"))]
OWN_PACKAGES = ("nli_helpers", "localcloud")


def code_in(path: Path) -> list[str]:
    """The code a doc shows: fenced blocks and inline spans of Markdown, the comment lines of a YAML file."""
    text = path.read_text()
    if path.suffix == ".yaml":
        return [line.lstrip("# ") for line in text.splitlines() if line.startswith("#")]
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M))
    return fenced + inline


def documented(pattern: str) -> list[str]:
    found = {match for path in DOCS for snippet in code_in(path) for match in re.findall(pattern, snippet)}
    return sorted(found)


MODULES = [m for m in documented(r"python3? -m ([A-Za-z_][\w.]*)") if m.startswith(OWN_PACKAGES)]
SCRIPTS = documented(r"python3? ((?:benchmarks|docker)/[\w/]+\.py)")
TARGETS = documented(r"(?:^|[\s;(&|])make (?:[A-Z_]+=\S+ )*([a-z][\w-]*)")
NOTEBOOK_RUNS = documented(r"papermill [^\n]*?(notebooks/[\w/]+\.(?:ipynb|yaml))")


def trainer_flags() -> list[str]:
    """The flags on the trainer's documented command lines (`python -m nli_helpers.task ...`, the Vertex AI entry
    point's, `nli-train`), continuation lines joined and comments left out."""
    command = re.compile(r"(?:python3? -m nli_helpers\.(?:task|vertex\.entry)|nli-train)\b([^#]*)")
    found = {flag for path in DOCS for snippet in code_in(path) for line in snippet.replace("\\\n", " ").splitlines()
             if (m := command.search(line)) for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", m.group(1))}
    return sorted(found)


TRAINER_FLAGS = trainer_flags()


def test_the_docs_name_the_commands_this_test_checks():
    # The extraction itself: if it found nothing, every test below would pass on nothing.
    assert {"nli_helpers.task", "nli_helpers.vertex.launch", "localcloud"} <= set(MODULES), MODULES
    assert {"demo", "test", "train-smoke", "bench", "gpu-check", "image-check"} <= set(TARGETS), TARGETS
    assert "benchmarks/gpu_check.py" in SCRIPTS and NOTEBOOK_RUNS
    assert {"--help", "--profile", "--output_dir", "--config"} <= set(TRAINER_FLAGS), TRAINER_FLAGS


@pytest.mark.parametrize("module", MODULES)
def test_each_documented_module_answers_help(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), (
        f"the docs say `python -m {module}`, but `--help` gives no usage: {proc.stdout[-500:]}{proc.stderr[-1500:]}")


@pytest.mark.parametrize("flag", TRAINER_FLAGS)
def test_each_flag_of_a_documented_trainer_command_exists(flag):
    from nli_helpers.config import build_parser

    options = {o for action in build_parser()._actions for o in action.option_strings}
    assert flag in options, f"the docs pass `{flag}` to the trainer, which has no such flag (`--help` lists them)"


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_documented_script_answers_help(script):
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-1500:]


@pytest.fixture(scope="module")
def make_targets() -> set[str]:
    """The Makefile's rules, from make's own database (-p) without running any recipe (-q on the empty target)."""
    proc = subprocess.run(["make", "-pRrq", ":"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    return set(re.findall(r"^([a-z][\w-]*):", proc.stdout, re.M))


@pytest.mark.parametrize("target", TARGETS)
def test_each_documented_make_target_exists(target, make_targets):
    assert target in make_targets, f"the docs say `make {target}`, and the Makefile has no such target"


@pytest.mark.parametrize("path", NOTEBOOK_RUNS)
def test_each_notebook_and_parameter_file_a_papermill_line_names_exists(path):
    assert (ROOT / path).is_file(), f"a papermill command in the docs names {path}, which is not there"
