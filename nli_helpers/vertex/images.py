"""Which image a Vertex AI job runs: the trainer image docker/Dockerfile builds (its name, the GPUs
its torch runs, the commands that build it), and the prebuilt PyTorch images, which cannot run
this package (`prebuilt_image_problem` says why).

    >>> uri = trainer_image_uri("my-project", "us-central1")  # where docker/README.md pushes it
    >>> print(trainer_image_build_commands(uri))               # Cloud Build, or local Docker
    >>> image_gpu_problem("NVIDIA_B200", "cu126")              # a GPU its torch cannot run
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from nli_helpers.config import __version__

from .errors import VertexError

# The CUDA builds of the pinned torch (2.13) and the GPU architectures each has kernels for, from
# RELEASE.md's compatibility and CUDA support matrices; no cu128 after 2.11 (RFC pytorch#178665).
# Driver floors: NVIDIA's minor-version compatibility table.
TORCH_CUDA_SOURCE = ("pytorch/pytorch RELEASE.md (2.13 row, #187075; CUDA support matrix, "
                     "#182849/#197555); pytorch/FBGEMM#5976; "
                     "docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html")


@dataclass(frozen=True)
class TorchCudaBuild:
    tag: str  # the wheel index's name: https://download.pytorch.org/whl/<tag>
    cuda: str
    architectures: tuple[tuple[int, int], ...]  # compute capabilities with kernels (SASS)
    ptx: bool  # the newest one also ships PTX
    min_driver: int  # the NVIDIA driver's major version
    status: str  # PyTorch's word for it


TORCH_CUDA_BUILDS: dict[str, TorchCudaBuild] = {
    "cu126": TorchCudaBuild("cu126", "12.6.3",
                            ((5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)),
                            False, 525, "legacy (Maxwell to Hopper)"),
    "cu130": TorchCudaBuild("cu130", "13.0.2", ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)),
                            True, 580, "stable, the PyPI default"),
    "cu132": TorchCudaBuild("cu132", "13.2.1", ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)),
                            True, 580, "experimental"),
}
# docker/Dockerfile's ARG TORCH_CUDA (a test keeps them equal). Vertex documents no driver version:
# cu126 asks least of it (>= 525) and runs every Vertex GPU up to Hopper; Blackwell needs cu130.
DEFAULT_TORCH_CUDA = "cu126"

# Vertex AI's accelerator types and their compute capability:
# https://developer.nvidia.com/cuda-gpus, https://developer.nvidia.com/cuda-legacy-gpus
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "NVIDIA_TESLA_K80": (3, 7), "NVIDIA_TESLA_P4": (6, 1), "NVIDIA_TESLA_P100": (6, 0),
    "NVIDIA_TESLA_V100": (7, 0), "NVIDIA_TESLA_T4": (7, 5), "NVIDIA_L4": (8, 9),
    "NVIDIA_TESLA_A100": (8, 0), "NVIDIA_A100_80GB": (8, 0), "NVIDIA_H100_80GB": (9, 0),
    "NVIDIA_H100_MEGA_80GB": (9, 0), "NVIDIA_H200_141GB": (9, 0), "NVIDIA_B200": (10, 0),
    "NVIDIA_GB200": (10, 0), "NVIDIA_RTX_PRO_6000": (12, 0),
}
ARM_ONLY_GPUS = {"NVIDIA_GB200"}  # a4x machines are aarch64 hosts; the image is x86-64 only


def runs_on(build: TorchCudaBuild, capability: tuple[int, int]) -> bool:
    """Has `build` a kernel for this compute capability? A cubin for X.y runs on X.z, z >= y; PTX
    runs on any newer GPU (CUDA C++ Programming Guide, "Binary/PTX Compatibility")."""
    if any(a[0] == capability[0] and a[1] <= capability[1] for a in build.architectures):
        return True
    return build.ptx and max(build.architectures) <= capability


def image_gpu_problem(accelerator_type: str | None,
                      torch_cuda: str = DEFAULT_TORCH_CUDA) -> str | None:
    """Why the trainer image (torch built for `torch_cuda`) cannot run on this GPU, or None."""
    if torch_cuda not in TORCH_CUDA_BUILDS:
        return (f"torch has no {torch_cuda} build for this release: PyTorch publishes "
                f"{', '.join(TORCH_CUDA_BUILDS)} ({TORCH_CUDA_SOURCE})")
    if not accelerator_type:
        return None
    if accelerator_type not in GPU_COMPUTE_CAPABILITY:
        return (f"{accelerator_type} is not a GPU the trainer image knows; it knows "
                f"{', '.join(GPU_COMPUTE_CAPABILITY)}")
    if accelerator_type in ARM_ONLY_GPUS:
        return (f"{accelerator_type} machines are Arm (aarch64) hosts and the trainer image is "
                "built for x86-64: choose an x86 GPU machine (a3, a4, a2, g2 or n1)")
    build, capability = TORCH_CUDA_BUILDS[torch_cuda], GPU_COMPUTE_CAPABILITY[accelerator_type]
    if runs_on(build, capability):
        return None
    fits = [tag for tag, b in TORCH_CUDA_BUILDS.items() if runs_on(b, capability)]
    cc = ".".join(map(str, capability))
    hint = (f"rebuild the image with --substitutions=_TORCH_CUDA={fits[0]} (docker/README.md)"
            if fits else "no CUDA build of this torch runs it: choose another GPU")
    return (f"the trainer image's torch ({torch_cuda}, kernels for compute capability "
            f"{', '.join(f'{a}.{b}' for a, b in build.architectures)}) cannot run "
            f"{accelerator_type} (compute capability {cc}): {hint}")


def image_torch_cuda(image_uri: str) -> str | None:
    """The torch CUDA build a trainer image's tag names (`...:0.1.0-cu126`), else None."""
    found = re.search(r":[^/]*-(cu\d+)$", image_uri)
    return found.group(1) if found else None


def trainer_image_uri(project: str, region: str, *, repository: str = "nli", image: str = "trainer",
                      tag: str | None = None, torch_cuda: str = DEFAULT_TORCH_CUDA) -> str:
    """Where docker/README.md pushes the trainer image: REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG
    The tag names the package version and torch CUDA build (`0.1.0-cu126`), so preflight can tell
    which GPUs the image runs on: rebuild and push after you change the code."""
    if not project:
        raise VertexError("trainer_image_uri needs the project id: pass project=..., or set "
                          "GOOGLE_CLOUD_PROJECT")
    tag = tag or f"{__version__}-{torch_cuda}"
    return f"{region}-docker.pkg.dev/{project}/{repository}/{image}:{tag}"


def trainer_image_build_commands(image_uri: str) -> str:
    """The shell commands that build docker/Dockerfile and push it as `image_uri`, from the
    repository root: with Cloud Build (no Docker engine needed), or with a local Docker engine."""
    host = image_uri.split("/", 1)[0]
    is_registry = host.endswith("-docker.pkg.dev") and image_uri.count("/") >= 3
    repository = image_uri.split("/")[2] if is_registry else None
    create = (f"gcloud artifacts repositories create {repository} --repository-format=docker "
              f"--location={host.removesuffix('-docker.pkg.dev')}   # once\n") if repository else ""
    cuda = image_torch_cuda(image_uri) or DEFAULT_TORCH_CUDA
    return (f"{create}gcloud builds submit --config docker/cloudbuild.yaml "
            f"--substitutions=_IMAGE={image_uri},_TORCH_CUDA={cuda} .\n"
            f"# or, with a local Docker engine:\n"
            f"gcloud auth configure-docker {host}   # once\n"
            f"docker build -f docker/Dockerfile --build-arg TORCH_CUDA={cuda} -t {image_uri} . "
            f"&& docker push {image_uri}")


# The prebuilt PyTorch training images, the only ones a python-package job may run on (REST
# PythonPackageSpec.executorImageUri), newest first; all Python 3.10, only `:latest` supported.
IMAGES_SOURCE = ("https://docs.cloud.google.com/vertex-ai/docs/training/pre-built-containers (now "
                 "also filed under docs.cloud.google.com/gemini-enterprise-agent-platform/"
                 "machine-learning/training/pre-built-containers)")
IMAGES_TABLE_DATE = "2026-11-22"


@dataclass(frozen=True)
class PrebuiltImage:
    torch: str  # major.minor
    python: str
    gpu_image: str
    cpu_image: str
    end_of_availability: str  # ISO date


PREBUILT_PYTORCH_IMAGES: dict[str, PrebuiltImage] = {image.torch: image for image in (
    PrebuiltImage("2.4", "3.10", "pytorch-gpu.2-4.py310", "pytorch-xla.2-4.py310", "2026-07-24"),
    PrebuiltImage("2.3", "3.10", "pytorch-gpu.2-3.py310", "pytorch-xla.2-3.py310", "2026-04-24"),
    PrebuiltImage("2.2", "3.10", "pytorch-gpu.2-2.py310", "pytorch-xla.2-2.py310", "2026-01-30"),
    PrebuiltImage("2.1", "3.10", "pytorch-gpu.2-1.py310", "pytorch-xla.2-1.py310", "2025-10-04"),
)}


def package_torch_requirement() -> SpecifierSet:
    """The torch versions this package accepts, from its installed metadata. The floor is
    transformers 5's: `import_utils.is_torch_available` disables PyTorch below 2.6."""
    for line in importlib.metadata.requires("nli-helpers") or []:
        requirement = Requirement(line)
        if requirement.name == "torch" and not requirement.marker:
            return requirement.specifier
    raise VertexError("the installed nli-helpers declares no torch requirement: reinstall it "
                      "(pip install -e .)")


def registry_host(region: str) -> str:
    """The Artifact Registry multi-region serving prebuilt images nearest `region`."""
    if region.startswith(("europe-", "me-", "africa-")):
        return "europe-docker.pkg.dev"
    if region.startswith(("asia-", "australia-")):
        return "asia-docker.pkg.dev"
    return "us-docker.pkg.dev"


def newest_prebuilt_image_uri(*, gpu: bool = True, region: str = "us-central1") -> str:
    """The newest prebuilt PyTorch training image (what the python-package path would use), from
    the multi-region nearest `region`."""
    newest = next(iter(PREBUILT_PYTORCH_IMAGES.values()))  # the table lists the newest first
    name = newest.gpu_image if gpu else newest.cpu_image
    return f"{registry_host(region)}/vertex-ai/training/{name}:latest"


def prebuilt_image(image_uri: str) -> PrebuiltImage | None:
    """The table's entry for a prebuilt image URI (any registry host, `:latest`), else None."""
    host, _, rest = image_uri.partition("/")
    name, _, tag = rest.removeprefix("vertex-ai/training/").partition(":")
    hosts = ("us-docker.pkg.dev", "europe-docker.pkg.dev", "asia-docker.pkg.dev")
    if host not in hosts or tag != "latest":
        return None
    return next((img for img in PREBUILT_PYTORCH_IMAGES.values()
                 if name in (img.gpu_image, img.cpu_image)), None)


def _image_problems(image: PrebuiltImage, today: str | None = None) -> list[str]:
    # Vertex pip-installs the sdist over the image's torch: pip keeps a torch outside the package's
    # range (transformers then disables it) or pulls a second multi-GB one on every replica.
    problems = []
    wanted = package_torch_requirement()
    if not wanted.contains(f"{image.torch}.0"):
        problems.append(f"its torch {image.torch} is outside this package's torch{wanted} "
                        "(transformers 5 disables PyTorch below 2.6), so pip would pull a second "
                        "multi-GB torch from PyPI on every replica")
    if image.end_of_availability < (today or time.strftime("%Y-%m-%d")):
        problems.append(f"it reached its end of availability on {image.end_of_availability} "
                        f"(table of {IMAGES_TABLE_DATE})")
    return problems


def prebuilt_image_problem(executor_image_uri: str, *, today: str | None = None) -> str | None:
    """Why the python-package path cannot run this package on that image, or None when it can."""
    container = ("Use the custom container instead: build docker/Dockerfile, push it, and pass "
                 "image_uri= (vertex.container_worker_pools; notebook 03 shows how)")
    image = prebuilt_image(executor_image_uri)
    if image is None:
        return (f"{executor_image_uri} is not a prebuilt Vertex AI training image (with the "
                ":latest tag): Vertex accepts only those for a python package (see "
                f"{IMAGES_SOURCE}). {container}")
    problems = _image_problems(image, today)
    if not problems:
        return None
    return f"{executor_image_uri} cannot run this package: {'; '.join(problems)}. {container}"
