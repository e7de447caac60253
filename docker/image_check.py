"""`make image-check`: resolve every install step of docker/Dockerfile against the real registries, for the image's
platform (Linux x86-64, CPython 3.11, Debian 12), and fail if any pinned artefact does not exist there.

What this machine reaches, it checks: Debian's package index for the apt packages (a private apt state under a
temporary folder, nothing of this machine's apt is touched) and PyPI for the package and every pin of
constraints.txt (`pip install --dry-run --report`, this machine's pip configuration and local indexes switched
off). What it cannot reach (Docker Hub, PyTorch's wheel index, Google's apt repository) it says so, checks the name
against the table the evidence supports, and prints the evidence.

    python docker/image_check.py            # the report; exit 1 when a step fails
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nli_helpers.vertex.images import DEFAULT_TORCH_CUDA, TORCH_CUDA_BUILDS, TORCH_CUDA_SOURCE  # noqa: E402

DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
PYPI = "https://pypi.org/simple"
DEBIAN = "http://deb.debian.org/debian"
# Where each artefact this machine cannot reach is shown to exist.
EVIDENCE = {
    "base": "docker-library/official-images library/python: 'Tags: 3.11.14-slim-bookworm, 3.11-slim-bookworm', "
            "Architectures include amd64",
    "torch": f"PyTorch's CUDA builds of torch 2.13: {TORCH_CUDA_SOURCE}",
    "google-apt": "Vertex AI distributed-training page, Reduction Server: 'deb https://packages.cloud.google.com/apt "
                  "google-fast-socket main' and 'apt install -y google-reduction-server'; the same lines in "
                  "GoogleCloudPlatform/vertex-ai-samples Dockerfiles",
}


@dataclass
class Result:
    status: str  # OK, FAIL or UNREACHABLE (exists per the evidence, not checked from here)
    step: str
    detail: str


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


def build_args(steps) -> dict[str, str]:
    return dict(a.split("=", 1) for name, a in steps if name == "ARG" and "=" in a)


def run_commands(steps) -> list[str]:
    """Every shell command of every RUN, split at `&&`, in order."""
    return [c.strip() for name, args in steps if name == "RUN" for c in args.split("&&")]


def base_image(steps) -> tuple[str, str, str]:
    """(python minor, Debian suite, the FROM text) of a python:X.Y-slim-SUITE base."""
    (image,) = [args for name, args in steps if name == "FROM"]
    found = re.fullmatch(r"python:(\d+\.\d+)-slim-(\w+)(@sha256:[0-9a-f]{64})?", image)
    if not found:
        raise ValueError(f"FROM {image}: not a python:X.Y-slim-SUITE tag of Docker's official images")
    return found.group(1), found.group(2), image


def check_base(steps) -> list[Result]:
    minor, suite, image = base_image(steps)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    results = [Result("UNREACHABLE", f"FROM {image}", f"Docker Hub is not reachable from here; {EVIDENCE['base']}")]
    if (here, platform.system(), platform.machine()) != (minor, "Linux", "x86_64"):
        results.append(Result("FAIL", "platform", f"this check resolves for the image's platform natively: run it "
                              f"with Python {minor} on Linux x86-64 (here: Python {here}, {platform.machine()})"))
    return results


def check_torch_build(steps) -> list[Result]:
    tag = build_args(steps).get("TORCH_CUDA", "")
    cloudbuild = yaml.safe_load((ROOT / "docker" / "cloudbuild.yaml").read_text())
    default = (cloudbuild.get("substitutions") or {}).get("_TORCH_CUDA")
    step = f"torch from https://download.pytorch.org/whl/{tag}"
    if tag not in TORCH_CUDA_BUILDS:
        return [Result("FAIL", step, f"torch 2.13 has no {tag or 'unnamed'} build: PyTorch publishes "
                       f"{', '.join(TORCH_CUDA_BUILDS)} ({TORCH_CUDA_SOURCE})")]
    results = [Result("UNREACHABLE", step, f"CUDA {TORCH_CUDA_BUILDS[tag].cuda} build, "
                      f"{TORCH_CUDA_BUILDS[tag].status}; PyTorch's index is not reachable from here; "
                      f"{EVIDENCE['torch']}")]
    if tag != DEFAULT_TORCH_CUDA or default != tag:
        results.append(Result("FAIL", "TORCH_CUDA default", f"Dockerfile {tag}, cloudbuild.yaml {default}, "
                              f"nli_helpers.vertex.DEFAULT_TORCH_CUDA {DEFAULT_TORCH_CUDA}: they must agree"))
    return results


def apt_installs(steps) -> list[tuple[str, bool]]:
    """(package, after a third-party apt source was added) for every `apt-get install` of the image."""
    packages, third_party = [], False
    for command in run_commands(steps):
        if "sources.list.d" in command and "deb " in command:
            third_party = True
        words = shlex.split(command)
        if words[:2] == ["apt-get", "install"]:
            packages += [(w, third_party) for w in words[2:] if not w.startswith("-")]
    return packages


def debian_candidates(suite: str, packages: list[str], work: Path) -> dict[str, str | None]:
    """The candidate version of each package in Debian SUITE main for amd64, from Debian's own index, read with a
    private apt state under `work` (this machine's apt lists and sources are not used)."""
    (work / "lists" / "partial").mkdir(parents=True)
    (work / "cache" / "archives" / "partial").mkdir(parents=True)
    (work / "parts").mkdir()
    (work / "sources.list").write_text(f"deb {DEBIAN} {suite} main\ndeb {DEBIAN} {suite}-updates main\n")
    (work / "status").write_text("")
    options = [f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Etc::SourceList={work / 'sources.list'}",
               f"-oDir::Etc::SourceParts={work / 'parts'}", f"-oDir::Cache={work / 'cache'}",
               f"-oDir::State::status={work / 'status'}", "-oAPT::Architecture=amd64",
               "-oAPT::Architectures=amd64", "-oDebug::NoLocking=1"]
    subprocess.run(["apt-get", *options, "-qq", "update"], check=True, capture_output=True, text=True)
    found = {}
    for package in packages:
        policy = subprocess.run(["apt-cache", *options, "policy", package], capture_output=True, text=True).stdout
        candidate = re.search(r"Candidate: (\S+)", policy)
        found[package] = candidate.group(1) if candidate and candidate.group(1) != "(none)" else None
    return found


def check_apt(steps, work: Path) -> list[Result]:
    _, suite, _ = base_image(steps)
    installs = apt_installs(steps)
    try:
        found = debian_candidates(suite, [p for p, _ in installs], work / "apt")
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        return [Result("FAIL", f"apt: Debian {suite}", f"could not read Debian's index: {detail.strip()[:300]}")]
    results = []
    for package, third_party in installs:
        if found[package]:
            results.append(Result("OK", f"apt {package}", f"Debian {suite} amd64 has {found[package]}"))
        elif third_party:
            results.append(Result("UNREACHABLE", f"apt {package}", f"not in Debian {suite}: from Google's apt "
                                  f"repository, not reachable from here; {EVIDENCE['google-apt']}"))
        else:
            results.append(Result("FAIL", f"apt {package}", f"Debian {suite} amd64 has no package {package}"))
    return results


def pip_environment() -> dict[str, str]:
    """This process's environment without pip's settings: no local index, find-links or constraint file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def check_pip(steps, work: Path) -> list[Result]:
    """The package install step (`pip install -c constraints.txt ".[extras]"`), resolved against PyPI alone."""
    (command,) = [c for c in run_commands(steps) if c.startswith("pip install -c")]
    extras = re.search(r'"\.(\[[\w,]+\])"', command).group(1)
    wheels, source = work / "wheel", work / "source"  # a copy: building in the checkout would leave build/ there
    shutil.copytree(ROOT / "nli_helpers", source / "nli_helpers", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(source)], check=True, capture_output=True, env=pip_environment())
    (wheel,) = wheels.glob("nli_helpers-*.whl")
    report, cert = work / "report.json", "/etc/ssl/certs/ca-certificates.crt"
    resolve = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         str(report), "--index-url", PYPI, *(["--cert", cert] if Path(cert).exists() else []),
         "-c", str(ROOT / "constraints.txt"), f"{wheel}{extras}"],
        capture_output=True, text=True, env=pip_environment())
    step = f"pip install -c constraints.txt .{extras}"
    if resolve.returncode:
        return [Result("FAIL", step, f"PyPI cannot resolve it: {resolve.stderr.strip()[-600:]}")]
    missing = re.findall(r"does not provide the extra '(\w+)'", resolve.stderr)
    if missing:
        return [Result("FAIL", step, f"the package has no extra {', '.join(missing)} (pyproject.toml)")]
    installed = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    pins = {k.lower().replace("_", "-"): v for k, v in pins.items()}
    off = [f"{n} {v} (pinned {pins[n]})" for n, v in installed.items() if n in pins and pins[n] != v]
    if off:
        return [Result("FAIL", step, f"resolved off the pins: {', '.join(off)}")]
    unpinned = sorted(n for n in installed if n not in pins and n != "nli-helpers")
    return [Result("OK", step, f"PyPI resolves all {len(installed)} distributions for CPython "
                   f"{sys.version_info[0]}.{sys.version_info[1]} on Linux x86-64; every pinned one at its pin "
                   f"(torch {installed.get('torch')} here is PyPI's CUDA 13.0 build: the image installs the "
                   f"TORCH_CUDA build first and pip keeps it)"
                   + (f"; not in constraints.txt: {', '.join(unpinned)}" if unpinned else ""))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", type=Path, default=DOCKERFILE)
    parser.add_argument("--skip-network", action="store_true", help="only the checks that need no registry")
    args = parser.parse_args(argv)
    steps = parse_dockerfile(args.dockerfile.read_text())
    results = check_base(steps) + check_torch_build(steps)
    if not args.skip_network:
        with tempfile.TemporaryDirectory(prefix="image-check-") as work:
            results += check_apt(steps, Path(work)) + check_pip(steps, Path(work))
    for r in results:
        print(f"{r.status:<11} {r.step}: {r.detail}")
    failed = [r for r in results if r.status == "FAIL"]
    print(f"\nimage-check: {len(results) - len(failed)} of {len(results)} steps exist "
          f"({sum(r.status == 'UNREACHABLE' for r in results)} on the evidence printed, not reachable from here)"
          + (f"; {len(failed)} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
