"""Run the trainer on Vertex AI: build the job from a `TrainConfig`, check it, submit it, watch it, fetch its outputs.

The job runs `python -m nli_helpers.task` with `cfg.to_cli_args()` (through `python -m nli_helpers.launch --`,
which starts torchrun, when the job has more than one training process), on one of two kinds of worker:

* python package on a prebuilt PyTorch training container: `build_sdist()` -> `stage_package()` ->
  `python_package_worker_pools(cfg, machine, package_uri)`; the image is chosen from `PREBUILT_PYTORCH_IMAGES`
  to match your torch, and there is none for a torch newer than the table: then use
* a custom container built from docker/Dockerfile (torch exactly as constraints.txt pins it):
  `container_worker_pools(cfg, machine, image_uri)`.

    >>> machine = Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1)
    >>> init_vertex("my-project", "us-central1", "gs://my-staging-bucket")
    >>> pools = container_worker_pools(make_config("full"), machine, "us-central1-docker.pkg.dev/my-project/nli/trainer:1")
    >>> preflight(region="us-central1", staging_bucket="gs://my-staging-bucket", machine=machine, image_uri=...)
    >>> print(estimate_cost(machine.machine_type, machine.accelerator_type, machine.accelerator_count, hours=3))
    >>> job = submit_custom_job(pools, base_output_dir="gs://my-staging-bucket/nli-jobs/run-1", spot=True)
    >>> watch_job(job)                          # progress until it ends; raises JobFailedError with the logs link
    >>> metrics = fetch_outputs(job, "runs/vertex-run-1")

Multi-worker: `Machine(..., replica_count=N)` gives a chief pool (1 replica) and a worker pool (N-1); pass
`reduction_server=ReductionServer(replica_count=K)` for Google's Reduction Server pool (workerpool2, GPUs only), and
price every pool with `estimate_job_cost(pools, hours)`.

Vertex gives the job base_output_dir/model/, /checkpoints/ and /logs/ as AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR; the job args carry no --job-dir, so the trainer writes to AIP_MODEL_DIR. With
NLI_VERTEX_API_ENDPOINT set (the tests' and CI's local fake of Vertex), `init_vertex` talks to that endpoint.
google-cloud-aiplatform is imported only when a function needs it (the trainer image does not carry it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions
from google.auth.exceptions import GoogleAuthError
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from nli_helpers import pricing, storage
from nli_helpers.config import ConfigError, NLIError, TrainConfig, make_config, resolve_profile
from nli_helpers.pricing import CostEstimate, PricingError, accelerator_problem, estimate_cost

if TYPE_CHECKING:
    from google.cloud.aiplatform import CustomJob

__all__ = ["Machine", "ReductionServer", "Check", "VertexError", "PreflightError", "JobFailedError",
           "NoPrebuiltImageError", "build_sdist", "stage_package", "prebuilt_image_uri", "newest_prebuilt_image_uri",
           "image_torch_version", "torch_minor", "local_torch_version", "package_torch_requirement", "PrebuiltImage",
           "prebuilt_image", "prebuilt_image_problem", "trainer_image_uri", "job_config", "prebuilt_images_table",
           "trainer_image_build_commands", "bucket_location_check", "job_args",
           "python_package_worker_pools", "container_worker_pools", "pools_table", "preflight", "estimate_cost",
           "CostEstimate", "estimate_job_cost", "JobCostEstimate", "init_vertex", "submit_custom_job", "watch_job",
           "logs_url", "fetch_outputs"]

TASK_MODULE = "nli_helpers.task"
LAUNCH_MODULE = "nli_helpers.launch"  # reads CLUSTER_SPEC and starts torchrun on each replica (multi-process jobs)
API_ENDPOINT_ENV = "NLI_VERTEX_API_ENDPOINT"
# Workerpool2 of a Reduction Server job: Google's reducer image on CPU machines; n1-highcpu-16 is what Google's
# samples use (a VM's egress bandwidth grows with its vCPUs, and reducers need bandwidth, not memory).
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
POOL_ROLES = ("chief", "workers", "reduction server", "evaluators")
PACKAGE_PREFIX = "nli-packages"
TERMINAL_STATES = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
CREDENTIALS_HELP = ("no Google Cloud credentials found: run `gcloud auth application-default login` (on a "
                    "Workbench notebook the VM's service account is used), or set GOOGLE_APPLICATION_CREDENTIALS")

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
# Multi- and dual-region bucket locations, and the region-name prefixes / regions they contain.
BUCKET_MULTI_REGIONS = {"US": ("us-", "northamerica-"), "EU": ("europe-",), "ASIA": ("asia-",),
                        "NAM4": ("us-central1", "us-east1"), "EUR4": ("europe-north1", "europe-west4"),
                        "ASIA1": ("asia-northeast1", "asia-northeast2")}


class VertexError(NLIError):
    """A Vertex AI step failed in a way the user can fix; the message says how."""


class PreflightError(VertexError):
    """One or more preflight checks failed: the job was not submitted."""


class JobFailedError(VertexError):
    """The job ended FAILED, CANCELLED or EXPIRED."""


class NoPrebuiltImageError(VertexError):
    """No prebuilt PyTorch training image matches this torch version."""


@dataclass(frozen=True)
class Machine:
    """What each replica runs on, and how many replicas (the first is the chief)."""

    machine_type: str = "n1-standard-8"
    accelerator_type: str | None = "NVIDIA_TESLA_T4"
    accelerator_count: int = 1
    replica_count: int = 1

    def machine_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"machine_type": self.machine_type}
        if self.accelerator_type and self.accelerator_count:
            spec.update(accelerator_type=self.accelerator_type, accelerator_count=self.accelerator_count)
        return spec

    @property
    def has_gpu(self) -> bool:
        return bool(self.accelerator_type and self.accelerator_count)

    @property
    def processes(self) -> int:
        """Training processes of the job: one per GPU (one per machine without GPUs), on every replica."""
        return self.replica_count * (self.accelerator_count if self.has_gpu else 1)

    @property
    def multi_process(self) -> bool:
        """More than one training process (replicas, or GPUs per replica): the job must start through torchrun."""
        return self.replica_count > 1 or (self.has_gpu and self.accelerator_count > 1)


@dataclass(frozen=True)
class ReductionServer:
    """Workerpool2: reducers that aggregate the GPU nodes' NCCL all-reduce traffic (they run Google's image)."""

    replica_count: int = 1
    machine_type: str = REDUCTION_SERVER_MACHINE_TYPE
    image_uri: str = REDUCTION_SERVER_IMAGE

    def worker_pool(self) -> dict:
        return {"machine_spec": {"machine_type": self.machine_type}, "replica_count": self.replica_count,
                "container_spec": {"image_uri": self.image_uri}}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    message: str

    def __str__(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.message}"


# -- the package and the image ---------------------------------------------------------------------------------
def build_sdist(out_dir: str | Path | None = None, project_dir: str | Path | None = None) -> Path:
    """Run `python -m build --sdist` on the project and return the .tar.gz path."""
    project = Path(project_dir) if project_dir else Path(__file__).resolve().parents[1]
    if not (project / "pyproject.toml").is_file():
        raise VertexError(f"no pyproject.toml in {project}: build_sdist needs the project's source checkout")
    out = Path(out_dir) if out_dir else project / "dist"
    # A Jupyter kernel sets FORCE_COLOR, and `build` then wraps the file name in ANSI codes: ask for none, strip any.
    env = {**{k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}, "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(project)],
                          capture_output=True, text=True, env=env)
    built = re.findall(r"Successfully built (\S+\.tar\.gz)", re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout))
    if proc.returncode or not built:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise VertexError(f"`python -m build --sdist` failed (is `build` installed? pip install build):\n{tail}")
    return out / built[-1]


def stage_package(sdist: str | Path, staging_bucket: str) -> str:
    """Upload the sdist under gs://STAGING/nli-packages/<content hash>/ and return its gs:// URI."""
    sdist = Path(sdist)
    if not sdist.is_file():
        raise VertexError(f"package {sdist} does not exist: build it with vertex.build_sdist()")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()[:12]  # same build, same URI: re-staging is harmless
    return storage.upload(sdist, f"{staging_bucket.rstrip('/')}/{PACKAGE_PREFIX}/{digest}/{sdist.name}")[0]


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


def trainer_image_uri(project: str, region: str, *, repository: str = "nli", image: str = "trainer",
                      tag: str | None = None) -> str:
    """Where docker/README.md pushes the trainer image: REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG.

    The tag defaults to the package version: rebuild and push after you change the code (or pass another tag).
    """
    from . import __version__

    if not project:
        raise VertexError("trainer_image_uri needs the project id: pass project=..., or set GOOGLE_CLOUD_PROJECT")
    return f"{region}-docker.pkg.dev/{project}/{repository}/{image}:{tag or __version__}"


def trainer_image_build_commands(image_uri: str) -> str:
    """The shell commands that build docker/Dockerfile and push it as `image_uri` (run from the repository root):
    with Cloud Build (no Docker engine needed, e.g. from Workbench), or with a local Docker engine."""
    host = image_uri.split("/", 1)[0]
    repository = image_uri.split("/")[2] if host.endswith("-docker.pkg.dev") and image_uri.count("/") >= 3 else None
    create = (f"gcloud artifacts repositories create {repository} --repository-format=docker "
              f"--location={host.removesuffix('-docker.pkg.dev')}   # once\n") if repository else ""
    return (f"{create}gcloud builds submit --config docker/cloudbuild.yaml --substitutions=_IMAGE={image_uri} .\n"
            f"# or, with a local Docker engine:\n"
            f"gcloud auth configure-docker {host}   # once\n"
            f"docker build -f docker/Dockerfile -t {image_uri} . && docker push {image_uri}")


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


# -- worker pools ------------------------------------------------------------------------------------------------
def job_config(profile: str = "auto", *, verbose: bool = False, **overrides: Any) -> TrainConfig:
    """`make_config` for a Vertex AI job. A job cannot read this machine's files, so on `smoke` its data is the
    sample the package carries unless you name one (a gs:// URI): $NLI_REAL_DATA, which `make_config` takes on
    smoke, is a local file. The smoke model, MiniLM, is in the trainer image (docker/Dockerfile installs [smoke])."""
    name, _ = resolve_profile(profile)
    if name == "smoke" and not overrides.get("data"):
        overrides["data"] = "sample"
    return make_config(name, verbose=verbose, **overrides)


def job_args(cfg: TrainConfig) -> list[str]:
    """The trainer's arguments, without --job-dir (on Vertex the trainer writes to AIP_MODEL_DIR), and with
    --resume=auto unless the config names a checkpoint: Vertex restarts a replica with the same command after VM
    maintenance or a Spot preemption, and the restarted trainer must continue from its newest checkpoint in
    AIP_CHECKPOINT_DIR, not start over (the trainer also assumes it there when AIP_CHECKPOINT_DIR is set)."""
    return dataclasses.replace(cfg, job_dir=None, resume=cfg.resume or "auto").to_cli_args()


def python_package_worker_pools(cfg: TrainConfig, machine: Machine, package_uri: str, *,
                                executor_image_uri: str | None = None, region: str = "us-central1",
                                reduction_server: ReductionServer | None = None) -> list[dict]:
    """Worker pools that pip-install the staged sdist on a prebuilt PyTorch image and run the task module.

    A multi-process job (several replicas or GPUs) runs `python -m nli_helpers.launch -- ARGS` instead, which
    reads CLUSTER_SPEC and starts torchrun: Vertex's own RANK / WORLD_SIZE count nodes, not processes.
    """
    image = executor_image_uri or prebuilt_image_uri(local_torch_version(), gpu=machine.has_gpu, region=region)
    module, args = _entry(cfg, machine)
    code = {"executor_image_uri": image, "package_uris": [package_uri], "python_module": module, "args": args}
    return _pools(machine, "python_package_spec", code, reduction_server)


def container_worker_pools(cfg: TrainConfig, machine: Machine, image_uri: str, *,
                           reduction_server: ReductionServer | None = None) -> list[dict]:
    """Worker pools that run a custom image whose ENTRYPOINT is `python -m nli_helpers.task` (docker/Dockerfile).

    A multi-process job overrides the ENTRYPOINT with `python -m nli_helpers.launch` (args `-- ARGS`).
    """
    module, args = _entry(cfg, machine)
    code = {"image_uri": image_uri, "args": args}
    if module == LAUNCH_MODULE:
        code = {"image_uri": image_uri, "command": ["python", "-m", LAUNCH_MODULE], "args": args}
    return _pools(machine, "container_spec", code, reduction_server)


def _entry(cfg: TrainConfig, machine: Machine) -> tuple[str, list[str]]:
    if machine.multi_process:
        return LAUNCH_MODULE, ["--", *job_args(cfg)]
    return TASK_MODULE, job_args(cfg)


def _pools(machine: Machine, code_key: str, code: dict, reduction_server: ReductionServer | None) -> list[dict]:
    # Vertex wants exactly one replica in pool 0 (the chief); further replicas go in pool 1, reducers in pool 2.
    pool = {"machine_spec": machine.machine_spec(), code_key: code}
    pools = [{**pool, "replica_count": 1}]
    if machine.replica_count > 1:
        pools.append({**pool, "replica_count": machine.replica_count - 1})
    if reduction_server is not None:
        if len(pools) < 2:
            raise VertexError("a Reduction Server reduces traffic between training nodes: set replica_count >= 2 "
                              "(a chief and at least one worker), or drop reduction_server")
        pools.append(reduction_server.worker_pool())
    return pools


def pools_table(worker_pool_specs: list[dict]) -> list[dict]:
    """One row per worker pool (role, replicas, machine, GPUs, what it runs): for a quick look before submitting."""
    rows = []
    for i, pool in enumerate(worker_pool_specs):
        spec, code = pool.get("machine_spec", {}), pool.get("python_package_spec") or pool.get("container_spec", {})
        runs = code.get("python_module") or " ".join(code.get("command", [])) or "(image entry point)"
        rows.append({"pool": f"workerpool{i}", "role": POOL_ROLES[i], "replicas": pool.get("replica_count", 0),
                     "machine": spec.get("machine_type"), "gpus": f"{spec['accelerator_count']} x "
                     f"{spec['accelerator_type']}" if spec.get("accelerator_type") else "-",
                     "image": code.get("executor_image_uri") or code.get("image_uri"), "runs": runs,
                     "args": " ".join(code.get("args", []))})
    return rows


# -- preflight -----------------------------------------------------------------------------------------------------
def preflight(*, region: str, staging_bucket: str, machine: Machine, cfg: TrainConfig | None = None,
              sdist: str | Path | None = None, executor_image_uri: str | None = None, image_uri: str | None = None,
              labels: dict[str, str] | None = None, reduction_server: ReductionServer | None = None,
              raise_on_failure: bool = True, verbose: bool = True) -> list[Check]:
    """Check a job before it costs money. Python-package path: pass `sdist`; custom container: pass `image_uri`."""
    checks = [_check_bucket(staging_bucket, region), _check_machine(machine)]
    if reduction_server is not None:
        checks.append(_check_reduction_server(reduction_server, machine, custom_container=bool(image_uri)))
    if image_uri:
        checks.append(_check_container_image(image_uri, region))
    else:
        checks.append(_check_sdist(sdist))
        checks.append(_check_prebuilt_image(executor_image_uri, machine, region))
    if cfg is not None:
        checks.append(_check_data(cfg))
        checks.append(_check_batch(cfg, machine))
    if labels:
        checks.append(_check_labels(labels))
    if verbose:
        print("\n".join(map(str, checks)))
    failed = [c for c in checks if c.status == "fail"]
    if failed and raise_on_failure:
        raise PreflightError("preflight failed, nothing was submitted:\n  - " + "\n  - ".join(
            f"{c.name}: {c.message}" for c in failed))
    return checks


def bucket_location_check(location: str, region: str) -> Check:
    """Is a bucket in `location` usable by a job in `region`? Regional and same: ok; containing multi-region: warn."""
    loc, name = location.upper(), "bucket location"
    if loc == region.upper():
        return Check(name, "ok", f"{loc} is the job's region")
    create = f"create one there: gcloud storage buckets create gs://BUCKET --location={region}"
    if region.startswith(BUCKET_MULTI_REGIONS.get(loc, ())):
        return Check(name, "warn", f"{loc} contains {region}: custom jobs work, but some Vertex services require a "
                     f"bucket in the job's region; {create}")
    return Check(name, "fail", f"the bucket is in {loc} but the job runs in {region}: {create}")


def _check_bucket(staging_bucket: str, region: str) -> Check:
    bucket_name, _ = storage.split_gcs_uri(staging_bucket)
    try:
        bucket = storage.get_client().lookup_bucket(bucket_name)
    except (NLIError, api_exceptions.GoogleAPIError, GoogleAuthError) as err:
        return Check("staging bucket", "fail", f"cannot read gs://{bucket_name}: {err}")
    if bucket is None:
        return Check("staging bucket", "fail", f"gs://{bucket_name} does not exist: create it in the job's region "
                     f"with `gcloud storage buckets create gs://{bucket_name} --location={region}`")
    where = bucket_location_check(bucket.location or "", region)
    return dataclasses.replace(where, name="staging bucket", message=f"gs://{bucket_name}: {where.message}")


def _check_machine(machine: Machine) -> Check:
    problem = accelerator_problem(machine.machine_type, machine.accelerator_type, machine.accelerator_count)
    if problem is None and machine.replica_count < 1:
        problem = f"replica_count={machine.replica_count} must be >= 1"
    gpus = f" + {machine.accelerator_count} x {machine.accelerator_type}" if machine.accelerator_type else " (no GPU)"
    return Check("machine", "fail" if problem else "ok", problem or f"{machine.machine_type}{gpus} "
                 f"x {machine.replica_count} replica(s)")


def _check_reduction_server(server: ReductionServer, machine: Machine, *, custom_container: bool) -> Check:
    name = "reduction server"
    if not machine.has_gpu:
        return Check(name, "fail", "Reduction Server speeds up NCCL all-reduce between GPU nodes, and NCCL needs "
                     "GPUs: give the training pools an accelerator_type and accelerator_count, or drop the "
                     "Reduction Server pool (CPU replicas use gloo, which it does not serve)")
    if machine.replica_count < 2:
        return Check(name, "fail", "a single training node has no traffic between nodes to reduce: set "
                     "replica_count >= 2, or drop the Reduction Server pool")
    problem = accelerator_problem(server.machine_type, None, 0)
    if problem or server.replica_count < 1:
        return Check(name, "fail", f"reducers run on CPU machines without GPUs ({REDUCTION_SERVER_MACHINE_TYPE} is "
                     f"the usual choice), at least one replica: {problem or f'replica_count={server.replica_count}'}")
    summary = f"{server.replica_count} x {server.machine_type} running {server.image_uri}"
    if custom_container:
        return Check(name, "ok", f"{summary}; the training image must carry Google's NCCL plugin (the "
                     "google-reduction-server package): docker/Dockerfile installs it, an image of your own must too, "
                     "or NCCL ignores the reducers")
    return Check(name, "ok", summary)


def _check_sdist(sdist: str | Path | None) -> Check:
    if sdist is None or not Path(sdist).is_file() or not str(sdist).endswith(".tar.gz"):
        return Check("package", "fail", f"no built sdist at {sdist}: build it with vertex.build_sdist()")
    return Check("package", "ok", f"{Path(sdist).name} ({Path(sdist).stat().st_size / 1e3:.0f} kB)")


def _check_prebuilt_image(executor_image_uri: str | None, machine: Machine, region: str) -> Check:
    if executor_image_uri is None:
        try:
            executor_image_uri = prebuilt_image_uri(local_torch_version(), gpu=machine.has_gpu, region=region)
        except NoPrebuiltImageError as err:
            return Check("image/torch", "fail", str(err))
    problem = prebuilt_image_problem(executor_image_uri)
    if problem:
        return Check("image/torch", "fail", problem)
    image = prebuilt_image(executor_image_uri)
    return Check("image/torch", "ok", f"{executor_image_uri}: torch {image.torch}, Python {image.python}")


def _check_container_image(image_uri: str, region: str) -> Check:
    if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?/\S+", image_uri):
        return Check("image/torch", "fail", f"image_uri={image_uri!r} is not an image reference: expected "
                     "REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG (vertex.trainer_image_uri)")
    host = image_uri.split("/", 1)[0]
    if host.endswith("-docker.pkg.dev") and not host.startswith((f"{region}-", "us-", "europe-", "asia-")):
        return Check("image/torch", "warn", f"{image_uri} lives in {host.removesuffix('-docker.pkg.dev')}, the job "
                     f"runs in {region}: every replica pulls it across regions (slower, egress charges)")
    return Check("image/torch", "ok", f"custom container {image_uri}: torch and CUDA come from the image "
                 "(docker/Dockerfile: the torch of constraints.txt, a CUDA 12.x build)")


def _check_data(cfg: TrainConfig) -> Check:
    if cfg.data and not storage.is_gcs_uri(cfg.data) and Path(cfg.data).expanduser().exists():
        return Check("data", "fail", f"data={cfg.data} is a local path the Vertex worker cannot see: upload it with "
                     "storage.upload(path, 'gs://BUCKET/data/...') and pass the gs:// URI (or data='sample')")
    return Check("data", "ok", f"data={cfg.data or 'the profile default'}")


def _check_batch(cfg: TrainConfig, machine: Machine) -> Check:
    from .train import batch_line  # torch: imported only when a config is checked

    try:
        line = batch_line(cfg, machine.processes)
        return Check("batch", "warn" if "warning:" in line else "ok", line.replace("\n", "; "))
    except ConfigError as err:
        return Check("batch", "fail", f"{err} (the job has {machine.processes} training processes: one per GPU "
                     "of every replica)")


def _check_labels(labels: dict[str, str]) -> Check:
    bad = [k for k, v in labels.items() if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)
           or not re.fullmatch(r"[a-z0-9_-]{0,63}", v)]
    if bad:
        return Check("labels", "fail", f"invalid label(s) {', '.join(bad)}: keys start with a lowercase letter; keys "
                     "and values use only lowercase letters, digits, '_' and '-', at most 63 characters")
    return Check("labels", "ok", ", ".join(f"{k}={v}" for k, v in labels.items()))


# -- cost of every pool ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobCostEstimate:
    """The cost of a whole job: one `CostEstimate` per worker pool, summed."""

    pools: tuple[tuple[str, CostEstimate], ...]

    @property
    def per_hour(self) -> float:
        return sum(est.per_hour for _, est in self.pools)

    @property
    def total(self) -> float:
        return sum(est.total for _, est in self.pools)

    def __str__(self) -> str:
        hours = self.pools[0][1].hours
        lines = [f"about ${self.total:.2f} = ${self.per_hour:.4f}/h x {hours:g} h, over every pool:"]
        for name, est in self.pools:
            lines.append(f"  {name}: {est.replica_count} x ({est.machine_type} ${est.machine_per_hour:.4f}/h"
                         f"{pricing.gpu_text(est)}) = ${est.per_hour:.4f}/h")
        lines.append(max((est.sources for _, est in self.pools), key=len))
        return "\n".join(lines)


def estimate_job_cost(worker_pool_specs: list[dict], hours: float = 1.0) -> JobCostEstimate:
    """Price every worker pool of a job (chief, workers, reduction server) for `hours` from the table in pricing.py."""
    parts = []
    for i, pool in enumerate(worker_pool_specs):
        spec = pool.get("machine_spec", {})
        if not pool.get("replica_count"):
            continue
        try:
            est = estimate_cost(spec["machine_type"], spec.get("accelerator_type"), spec.get("accelerator_count", 0),
                                replica_count=pool["replica_count"], hours=hours)
        except PricingError as err:
            raise PricingError(f"workerpool{i} ({POOL_ROLES[i]}): {err}") from err
        parts.append((f"workerpool{i} ({POOL_ROLES[i]})", est))
    if not parts:
        raise PricingError("no worker pool with replicas to price")
    return JobCostEstimate(tuple(parts))


# -- submit, watch, fetch -------------------------------------------------------------------------------------------
def _aiplatform():
    try:
        from google.cloud import aiplatform
    except ImportError as err:
        raise VertexError("google-cloud-aiplatform is not installed: pip install 'nli-helpers[vertex]'") from err
    return aiplatform


def init_vertex(project: str | None, region: str, staging_bucket: str | None, *, credentials=None,
                api_endpoint: str | None = None, api_transport: str = "rest") -> str:
    """Point the aiplatform SDK at a project, region and staging bucket (REST, as in the tests); return the endpoint.

    `project=None` takes $GOOGLE_CLOUD_PROJECT, else your gcloud default. `api_endpoint=None` takes
    $NLI_VERTEX_API_ENDPOINT (the local fake in CI), else the region's Vertex AI endpoint. A plain-HTTP endpoint
    can only be a local fake, so it gets anonymous credentials, as the storage emulator does.
    """
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    api_endpoint = api_endpoint or os.environ.get(API_ENDPOINT_ENV) or f"{region}-aiplatform.googleapis.com"
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if credentials is None and api_endpoint.startswith("http://"):
        credentials = AnonymousCredentials()
    if credentials is None:
        try:
            credentials, default_project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except DefaultCredentialsError as err:
            raise VertexError(CREDENTIALS_HELP) from err
        project = project or default_project
    if not project:
        raise VertexError("no Google Cloud project: pass project=..., set GOOGLE_CLOUD_PROJECT, or run "
                          "`gcloud config set project PROJECT_ID`")
    if not staging_bucket or not storage.is_gcs_uri(staging_bucket):
        raise VertexError(f"staging_bucket={staging_bucket!r}: Vertex needs a gs://BUCKET in the job's region to stage "
                          f"packages; create one with `gcloud storage buckets create gs://BUCKET --location={region}`")
    # The SDK keeps settings between calls: always pass the endpoint, or a test's fake endpoint would stick.
    _aiplatform().init(project=project, location=region, staging_bucket=staging_bucket, credentials=credentials,
                       api_endpoint=api_endpoint, api_transport=api_transport)
    return api_endpoint


TENSORBOARD_RESOURCE = re.compile(r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+")


def check_vertex_tensorboard(tensorboard: str, service_account: str | None) -> None:
    """A Vertex AI TensorBoard resource streams the job's AIP_TENSORBOARD_LOG_DIR into TensorBoard in the console.

    Create one with `aiplatform.Tensorboard.create(display_name=...)` and pass its resource name
    (projects/P/locations/L/tensorboards/ID) as `tensorboard=` to `submit_custom_job` or
    `tuning.submit_tuning_job`. Vertex AI requires such a job to run as a service account that may write to the
    staging bucket and use Vertex AI (roles/storage.objectAdmin, roles/aiplatform.user); see
    https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training
    """
    if not TENSORBOARD_RESOURCE.fullmatch(tensorboard):
        raise VertexError(f"tensorboard={tensorboard!r} is not a Vertex AI TensorBoard resource name: expected "
                          "projects/PROJECT/locations/REGION/tensorboards/ID (aiplatform.Tensorboard.create(...))")
    if not service_account:
        raise VertexError("attaching a Vertex AI TensorBoard needs service_account=...: the job writes its logs "
                          "as that account (grant it roles/storage.objectAdmin on the bucket and "
                          "roles/aiplatform.user)")


def training_replicas(worker_pool_specs: list[dict]) -> int:
    """How many replicas train (the chief pool and the workers pool; not reducers or evaluators)."""
    return sum(int(pool.get("replica_count", 0)) for pool in worker_pool_specs[:2])


def submit_custom_job(worker_pool_specs: list[dict], *, base_output_dir: str, display_name: str | None = None,
                      service_account: str | None = None, labels: dict[str, str] | None = None, spot: bool = False,
                      restart_job_on_worker_restart: bool | None = None, timeout_s: int | None = None,
                      tensorboard: str | None = None) -> CustomJob:
    """Create the CustomJob and return at once (watch it with `watch_job`).

    `restart_job_on_worker_restart=None` turns it on for a job of several training replicas: when Vertex restarts
    one replica (maintenance, Spot preemption), the others are restarted too, because torchrun's fixed rendezvous
    cannot take a single new node back; every replica then resumes from the newest checkpoint. `spot=True` runs on
    Spot VMs (preemptible, cheaper). `tensorboard`: a Vertex AI TensorBoard resource to stream the job's scalars to
    (`check_vertex_tensorboard`).
    """
    if tensorboard:
        check_vertex_tensorboard(tensorboard, service_account)
    if restart_job_on_worker_restart is None:
        restart_job_on_worker_restart = training_replicas(worker_pool_specs) > 1
    aiplatform = _aiplatform()
    from google.cloud.aiplatform.compat.types import custom_job as custom_job_types

    strategy = custom_job_types.Scheduling.Strategy.SPOT if spot else None
    try:
        job = aiplatform.CustomJob(display_name=display_name or f"nli-{time.strftime('%Y%m%d-%H%M%S')}",
                                   worker_pool_specs=worker_pool_specs, base_output_dir=base_output_dir, labels=labels)
        job.submit(service_account=service_account, restart_job_on_worker_restart=restart_job_on_worker_restart,
                   scheduling_strategy=strategy, timeout=timeout_s, tensorboard=tensorboard)
    except GoogleAuthError as err:
        raise VertexError(f"{CREDENTIALS_HELP} ({err})") from err
    except api_exceptions.PermissionDenied as err:
        raise VertexError(f"permission denied creating the job: grant your account roles/aiplatform.user (and "
                          f"iam.serviceAccountUser on {service_account or 'the job service account'}): {err.message}") from err
    except api_exceptions.GoogleAPICallError as err:
        raise VertexError(f"Vertex AI refused the job ({err.code}): {err.message}. Is the API enabled? "
                          "gcloud services enable aiplatform.googleapis.com") from err
    print(f"submitted {job.resource_name}\nlogs: {logs_url(job)}")
    return job


def logs_url(job: CustomJob) -> str:
    """The Cloud Logging page with this job's logs."""
    parts = job.resource_name.split("/")  # projects/P/locations/L/customJobs/ID
    query = f'resource.type="ml_job"\nresource.labels.job_id="{parts[-1]}"'
    from urllib.parse import quote

    return f"https://console.cloud.google.com/logs/query;query={quote(query, safe='')}?project={parts[1]}"


WATCH_TIMEOUT_S = 3 * 24 * 3600.0  # longer than any recipe here; shorter than forever
QUEUED_NOTICE_S = 300.0
QUOTAS_HELP = ("Vertex AI keeps a job queued while the project lacks custom-training quota for it "
               "(https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service#queue): check "
               "'Custom model training {gpu} per region' for {region} at "
               "https://console.cloud.google.com/iam-admin/quotas?project={project} and request more, pick another "
               "region or GPU, or cancel it with job.cancel()")


def watch_job(job: CustomJob | str, *, poll_s: float = 30.0, timeout_s: float | None = WATCH_TIMEOUT_S,
              queued_notice_s: float = QUEUED_NOTICE_S, progress: bool = True) -> str:
    """Poll until the job ends; return its final state, or raise JobFailedError / VertexError on timeout.

    A job that stays JOB_STATE_QUEUED longer than `queued_notice_s` gets one line saying why (quota) and what to
    do. `timeout_s=None` waits for ever; on a timeout the job keeps running and the error says how to watch again.
    """
    from tqdm.auto import tqdm

    if isinstance(job, str):
        job = _aiplatform().CustomJob.get(job)
    start, last, queued_since, told = time.monotonic(), None, None, False
    with tqdm(total=None, bar_format="{desc} [{elapsed}]", disable=not progress) as bar:
        while True:
            state = job.state.name  # each read fetches the job again
            if state != last:
                bar.write(f"{job.display_name}: {state}")
                last = state
                queued_since = time.monotonic() if state == "JOB_STATE_QUEUED" else None
            bar.set_description_str(f"{job.display_name}: {state}")
            if state in TERMINAL_STATES:
                break
            if queued_since is not None and not told and time.monotonic() - queued_since >= queued_notice_s:
                bar.write(f"{job.display_name} is still queued after {time.monotonic() - queued_since:.0f} s: "
                          + queued_help(job))
                told = True
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                why = f" ({queued_help(job)})" if state == "JOB_STATE_QUEUED" else ""
                raise VertexError(f"{job.resource_name} is still {state} after {timeout_s:g} s{why}; it keeps running: "
                                  f"watch_job('{job.resource_name}') again, or cancel it with job.cancel()")
            time.sleep(poll_s)
    if state != "JOB_STATE_SUCCEEDED":
        raise JobFailedError(f"{job.resource_name} ended {state}: {job.error.message or 'no error message'}; "
                             f"logs: {logs_url(job)}")
    return state


def queued_help(job) -> str:
    """What a queued job waits for, with the quota page of its project and the GPU it asked for."""
    from google.cloud.aiplatform.compat.types import accelerator_type

    _, project, _, region, *_ = job.resource_name.split("/")
    spec = job.job_spec.worker_pool_specs[0].machine_spec if job.job_spec.worker_pool_specs else None
    gpu = accelerator_type.AcceleratorType(spec.accelerator_type).name if spec and spec.accelerator_count else "CPU"
    return QUOTAS_HELP.format(gpu=gpu.replace("_", " ") + (" GPUs" if gpu != "CPU" else " vCPUs"), region=region,
                              project=project)


def fetch_outputs(job_or_base_output_dir: CustomJob | str, local_dir: str | Path) -> dict:
    """Download base_output_dir/model (model, metrics.json, ...) into `local_dir`; return the metrics."""
    base = job_or_base_output_dir
    if not isinstance(base, str):
        base = base.job_spec.base_output_directory.output_uri_prefix
    model_uri = f"{base.rstrip('/')}/model"
    if not storage.exists(f"{model_uri}/metrics.json"):
        raise VertexError(f"no metrics.json under {model_uri}: the job did not finish training; see its logs")
    storage.download(model_uri, local_dir)
    return json.loads((Path(local_dir) / "metrics.json").read_text())
