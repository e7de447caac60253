"""Which image a Vertex AI job runs: the prebuilt PyTorch training images (none can run this package, and why),
and the trainer image docker/Dockerfile builds, with its name and the commands that build and push it.

    >>> prebuilt_image_problem(newest_prebuilt_image_uri())     # why the python-package path cannot run
    >>> trainer_image_uri("my-project", "us-central1")          # where docker/README.md pushes the image
    >>> print(trainer_image_build_commands(uri))                 # Cloud Build, or a local Docker engine
    >>> image_gpu_problem("NVIDIA_B200", "cu126")                # a GPU the image's torch has no kernels for
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from nli_helpers.config import __version__

from .errors import NoPrebuiltImageError, VertexError

# -- the trainer image's torch build and the GPUs it can run ----------------------------------------------------
# PyTorch's CUDA builds of the pinned torch (2.13), and the GPU architectures each carries kernels for: the 2.13 row
# of RELEASE.md's "Release Compatibility Matrix" (pytorch/pytorch#187075: stable CUDA 12.6 and 13.0, experimental
# 13.2) and its "PyTorch CUDA Support Matrix" for Linux x86 (pytorch/pytorch#182849, which #197555 says holds for
# 2.12-2.14). No cu128 after 2.11 (RFC pytorch/pytorch#178665 "Deprecate CUDA 12.8"; pytorch/FBGEMM#5976: "torch-2.13
# has cu126=108 and cu130=108 wheels but cu128=0"). Driver floors: NVIDIA's minor-version compatibility table
# (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): CUDA 12.x ">= 525",
# CUDA 13.x ">= 580". `ptx`: the newest architecture also ships PTX, which the driver compiles for newer GPUs.
TORCH_CUDA_SOURCE = ("pytorch/pytorch RELEASE.md (2.13 row, #187075; CUDA support matrix, #182849/#197555); "
                     "pytorch/FBGEMM#5976; docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html")


@dataclass(frozen=True)
class TorchCudaBuild:
    tag: str  # the wheel index's name: https://download.pytorch.org/whl/<tag>
    cuda: str
    architectures: tuple[tuple[int, int], ...]  # compute capabilities with kernels (SASS)
    ptx: bool  # the newest one also ships PTX
    min_driver: int  # the NVIDIA driver's major version
    status: str  # PyTorch's word for it


TORCH_CUDA_BUILDS: dict[str, TorchCudaBuild] = {
    "cu126": TorchCudaBuild("cu126", "12.6.3", ((5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)),
                            False, 525, "legacy (Maxwell to Hopper)"),
    "cu130": TorchCudaBuild("cu130", "13.0.2", ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)),
                            True, 580, "stable, the PyPI default"),
    "cu132": TorchCudaBuild("cu132", "13.2.1", ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)),
                            True, 580, "experimental"),
}
# The image's default (docker/Dockerfile's ARG TORCH_CUDA; a test keeps the two equal). Vertex AI documents no
# driver version for its training VMs: CUDA 12.6 asks the least of the driver (>= 525) and has kernels for every
# GPU Vertex trains on up to Hopper (P4, P100, V100, T4, L4, A100, H100, H200); Blackwell needs cu130.
DEFAULT_TORCH_CUDA = "cu126"

# Vertex AI's accelerator types (aiplatform_v1.AcceleratorType) and their compute capability, from NVIDIA's tables
# (https://developer.nvidia.com/cuda-gpus, https://developer.nvidia.com/cuda-legacy-gpus).
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "NVIDIA_TESLA_K80": (3, 7), "NVIDIA_TESLA_P4": (6, 1), "NVIDIA_TESLA_P100": (6, 0),
    "NVIDIA_TESLA_V100": (7, 0), "NVIDIA_TESLA_T4": (7, 5), "NVIDIA_L4": (8, 9), "NVIDIA_TESLA_A100": (8, 0),
    "NVIDIA_A100_80GB": (8, 0), "NVIDIA_H100_80GB": (9, 0), "NVIDIA_H100_MEGA_80GB": (9, 0),
    "NVIDIA_H200_141GB": (9, 0), "NVIDIA_B200": (10, 0), "NVIDIA_GB200": (10, 0), "NVIDIA_RTX_PRO_6000": (12, 0),
}
# GB200 machines (a4x) are Arm (aarch64) hosts; the trainer image is built for x86-64 only.
ARM_ONLY_GPUS = {"NVIDIA_GB200"}


def runs_on(build: TorchCudaBuild, capability: tuple[int, int]) -> bool:
    """Has `build` a kernel for a GPU of this compute capability? A cubin for X.y runs on X.z for z >= y; PTX for
    an older architecture is compiled by the driver for any newer one (CUDA C++ Programming Guide, "Binary
    Compatibility" and "PTX Compatibility")."""
    if any(a[0] == capability[0] and a[1] <= capability[1] for a in build.architectures):
        return True
    return build.ptx and max(build.architectures) <= capability


def image_gpu_problem(accelerator_type: str | None, torch_cuda: str = DEFAULT_TORCH_CUDA) -> str | None:
    """Why the trainer image (torch built for `torch_cuda`) cannot run on this GPU, or None when it can."""
    if torch_cuda not in TORCH_CUDA_BUILDS:
        return (f"torch has no {torch_cuda} build for this release: PyTorch publishes "
                f"{', '.join(TORCH_CUDA_BUILDS)} ({TORCH_CUDA_SOURCE})")
    if not accelerator_type:
        return None
    if accelerator_type not in GPU_COMPUTE_CAPABILITY:
        return (f"{accelerator_type} is not a GPU the trainer image knows; it knows "
                f"{', '.join(GPU_COMPUTE_CAPABILITY)}")
    if accelerator_type in ARM_ONLY_GPUS:
        return (f"{accelerator_type} machines are Arm (aarch64) hosts and the trainer image is built for x86-64: "
                "choose an x86 GPU machine (a3, a4, a2, g2 or n1)")
    build, capability = TORCH_CUDA_BUILDS[torch_cuda], GPU_COMPUTE_CAPABILITY[accelerator_type]
    if runs_on(build, capability):
        return None
    fits = [tag for tag, b in TORCH_CUDA_BUILDS.items() if runs_on(b, capability)]
    cc = ".".join(map(str, capability))
    hint = (f"rebuild the image with --substitutions=_TORCH_CUDA={fits[0]} (docker/README.md)" if fits
            else "no CUDA build of this torch runs it: choose another GPU")
    return (f"the trainer image's torch ({torch_cuda}, kernels for compute capability "
            f"{', '.join(f'{a}.{b}' for a, b in build.architectures)}) cannot run {accelerator_type} "
            f"(compute capability {cc}): {hint}")


def image_torch_cuda(image_uri: str) -> str | None:
    """The torch CUDA build a trainer image's tag names (`...:0.1.0-cu126`), else None."""
    found = re.search(r":[^/]*-(cu\d+)$", image_uri)
    return found.group(1) if found else None

# The prebuilt PyTorch *training* images, torch major.minor -> PrebuiltImage, read on 2026-11-22 from IMAGES_SOURCE
# ("Prebuilt containers for custom training"): 2.4 is the newest PyTorch listed there, each "GPU only (CUDA 12.x)"
# or "CPU only", Python 3.10, only the `:latest` tag supported. A python-package job runs on one of these: Vertex
# pip-installs the sdist over the image's torch (REST PythonPackageSpec.executorImageUri: "You must use an image
# from this list"). None of them can run this package (`prebuilt_image_problem`), which is why the custom container
# (docker/Dockerfile) is the default path.
IMAGES_SOURCE = ("https://docs.cloud.google.com/vertex-ai/docs/training/pre-built-containers (now also filed under "
                 "docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/training/pre-built-containers)")
IMAGES_TABLE_DATE = "2026-11-22"


@dataclass(frozen=True)
class PrebuiltImage:
    torch: str  # major.minor
    python: str
    gpu_image: str
    cpu_image: str
    end_of_availability: str  # ISO date


PREBUILT_PYTORCH_IMAGES: dict[str, PrebuiltImage] = {
    "2.4": PrebuiltImage("2.4", "3.10", "pytorch-gpu.2-4.py310", "pytorch-xla.2-4.py310", "2026-07-24"),
    "2.3": PrebuiltImage("2.3", "3.10", "pytorch-gpu.2-3.py310", "pytorch-xla.2-3.py310", "2026-04-24"),
    "2.2": PrebuiltImage("2.2", "3.10", "pytorch-gpu.2-2.py310", "pytorch-xla.2-2.py310", "2026-01-30"),
    "2.1": PrebuiltImage("2.1", "3.10", "pytorch-gpu.2-1.py310", "pytorch-xla.2-1.py310", "2025-10-04"),
}


def torch_minor(version: str) -> str:
    """'2.13.0+cu130' -> '2.13'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def local_torch_version() -> str:
    """The torch you develop and test with here."""
    return importlib.metadata.version("torch")


def package_torch_requirement() -> SpecifierSet:
    """The torch versions this package accepts, from its own installed metadata (pyproject's `torch>=...`).

    The floor is transformers' own: transformers 5 disables PyTorch below 2.6 at import
    (`transformers.utils.import_utils.is_torch_available`), so pyproject asks for torch>=2.6 and
    tests/test_vertex.py checks that the two agree.
    """
    for line in importlib.metadata.requires("nli-helpers") or []:
        requirement = Requirement(line)
        if requirement.name == "torch" and not requirement.marker:
            return requirement.specifier
    raise VertexError("the installed nli-helpers declares no torch requirement: reinstall it (pip install -e .)")


def registry_host(region: str) -> str:
    """The Artifact Registry multi-region serving prebuilt images nearest `region`."""
    if region.startswith(("europe-", "me-", "africa-")):
        return "europe-docker.pkg.dev"
    if region.startswith(("asia-", "australia-")):
        return "asia-docker.pkg.dev"
    return "us-docker.pkg.dev"


def prebuilt_image_uri(torch_version: str, *, gpu: bool = True, region: str = "us-central1") -> str:
    """The prebuilt Vertex AI PyTorch training image for this torch's major.minor, or NoPrebuiltImageError."""
    minor = torch_minor(torch_version)
    if minor not in PREBUILT_PYTORCH_IMAGES:
        raise NoPrebuiltImageError(
            f"no prebuilt Vertex AI PyTorch training image for torch {minor} (the table, read {IMAGES_TABLE_DATE} "
            f"from {IMAGES_SOURCE}, has {', '.join(PREBUILT_PYTORCH_IMAGES)}). Use the custom-container path: build "
            "docker/Dockerfile (the torch constraints.txt pins) and pass image_uri=...")
    image = PREBUILT_PYTORCH_IMAGES[minor]
    return f"{registry_host(region)}/vertex-ai/training/{image.gpu_image if gpu else image.cpu_image}:latest"


def newest_prebuilt_image_uri(*, gpu: bool = True, region: str = "us-central1") -> str:
    """The newest prebuilt PyTorch training image in the table (what the python-package path would have to use)."""
    return prebuilt_image_uri(max(PREBUILT_PYTORCH_IMAGES, key=lambda v: tuple(map(int, v.split(".")))),
                              gpu=gpu, region=region)


def prebuilt_image(image_uri: str) -> PrebuiltImage | None:
    """The table's entry for a prebuilt image URI (any registry host, `:latest`), else None."""
    host, _, rest = image_uri.partition("/")
    name, _, tag = rest.removeprefix("vertex-ai/training/").partition(":")
    if host not in ("us-docker.pkg.dev", "europe-docker.pkg.dev", "asia-docker.pkg.dev") or tag != "latest":
        return None
    return next((img for img in PREBUILT_PYTORCH_IMAGES.values() if name in (img.gpu_image, img.cpu_image)), None)


def image_torch_version(image_uri: str) -> str | None:
    """The torch major.minor of a prebuilt image URI from the table, else None."""
    image = prebuilt_image(image_uri)
    return image.torch if image else None


def prebuilt_image_problem(executor_image_uri: str, *, today: str | None = None) -> str | None:
    """Why the python-package path cannot run this package on that image, or None when it can.

    Vertex pip-installs the sdist over the image's torch. When the image's torch is outside the package's range,
    pip either keeps it (and transformers disables PyTorch at import: the job fails after the GPUs started) or, as
    with today's `torch>=2.6`, downloads a second multi-GB CUDA build of torch from PyPI on every replica at every
    start, whose CUDA the image's drivers may not run. Neither is a job worth paying for.
    """
    container = ("Use the custom container instead: build docker/Dockerfile, push it, and pass image_uri= "
                 "(vertex.container_worker_pools; notebook 03 shows how)")
    image = prebuilt_image(executor_image_uri)
    if image is None:
        return (f"{executor_image_uri} is not a prebuilt Vertex AI training image (with the :latest tag): Vertex "
                f"accepts only those for a python package (see {IMAGES_SOURCE}). {container}")
    problems = []
    wanted = package_torch_requirement()
    if not wanted.contains(f"{image.torch}.0"):
        problems.append(f"its torch {image.torch} is outside this package's torch{wanted} (transformers 5 disables "
                        "PyTorch below 2.6), so pip would pull a second multi-GB torch from PyPI on every replica")
    if image.end_of_availability < (today or time.strftime("%Y-%m-%d")):
        problems.append(f"it reached its end of availability on {image.end_of_availability} (table of "
                        f"{IMAGES_TABLE_DATE})")
    if not problems:
        return None
    return f"{executor_image_uri} cannot run this package: {'; '.join(problems)}. {container}"


def prebuilt_images_table() -> list[dict]:
    """One row per prebuilt PyTorch training image (GPU variants): its torch and Python, end of availability, and
    why it cannot run this package (`prebuilt_image_problem`), for a look before choosing the path."""
    rows = []
    for image in PREBUILT_PYTORCH_IMAGES.values():
        problem = prebuilt_image_problem(f"us-docker.pkg.dev/vertex-ai/training/{image.gpu_image}:latest")
        reason = problem.split(" cannot run this package: ", 1)[-1].split(". Use the custom container")[0] if problem else ""
        rows.append({"image": image.gpu_image, "torch": image.torch, "python": image.python,
                     "end of availability": image.end_of_availability, "runs this package": problem is None,
                     "why not": reason})
    return rows


def trainer_image_uri(project: str, region: str, *, repository: str = "nli", image: str = "trainer",
                      tag: str | None = None, torch_cuda: str = DEFAULT_TORCH_CUDA) -> str:
    """Where docker/README.md pushes the trainer image: REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG.

    The tag defaults to the package version and the torch CUDA build (`0.1.0-cu126`), so preflight can tell which
    GPUs the image runs on: rebuild and push after you change the code (or pass another tag).
    """
    if not project:
        raise VertexError("trainer_image_uri needs the project id: pass project=..., or set GOOGLE_CLOUD_PROJECT")
    return f"{region}-docker.pkg.dev/{project}/{repository}/{image}:{tag or f'{__version__}-{torch_cuda}'}"


def trainer_image_build_commands(image_uri: str) -> str:
    """The shell commands that build docker/Dockerfile and push it as `image_uri` (run from the repository root):
    with Cloud Build (no Docker engine needed, e.g. from Workbench), or with a local Docker engine."""
    host = image_uri.split("/", 1)[0]
    repository = image_uri.split("/")[2] if host.endswith("-docker.pkg.dev") and image_uri.count("/") >= 3 else None
    create = (f"gcloud artifacts repositories create {repository} --repository-format=docker "
              f"--location={host.removesuffix('-docker.pkg.dev')}   # once\n") if repository else ""
    cuda = image_torch_cuda(image_uri) or DEFAULT_TORCH_CUDA
    return (f"{create}gcloud builds submit --config docker/cloudbuild.yaml "
            f"--substitutions=_IMAGE={image_uri},_TORCH_CUDA={cuda} .\n"
            f"# or, with a local Docker engine:\n"
            f"gcloud auth configure-docker {host}   # once\n"
            f"docker build -f docker/Dockerfile --build-arg TORCH_CUDA={cuda} -t {image_uri} . "
            f"&& docker push {image_uri}")
