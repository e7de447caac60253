"""Check a Vertex AI job before it costs money: the bucket and its region, the machine and its
GPUs, the image, the data, the batch and the labels. One error lists every problem; a warning is
something to read, not a stop.

    >>> preflight(region="us-central1", staging_bucket="gs://b", machine=machine, cfg=cfg,
    ...           image_uri=image_uri)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from nli_helpers import files
from nli_helpers.config import TrainConfig
from nli_helpers.vertex.pricing import accelerator_problem

from .errors import PreflightError
from .images import (
    DEFAULT_TORCH_CUDA,
    TORCH_CUDA_BUILDS,
    image_gpu_problem,
    image_torch_cuda,
    prebuilt_image,
    prebuilt_image_problem,
    registry_host,
)
from .pools import REDUCTION_SERVER_MACHINE_TYPE, Machine, ReductionServer

# Multi- and dual-region bucket locations, and the region-name prefixes / regions they contain.
BUCKET_MULTI_REGIONS = {"US": ("us-", "northamerica-"), "EU": ("europe-",), "ASIA": ("asia-",),
                        "NAM4": ("us-central1", "us-east1"),
                        "EUR4": ("europe-north1", "europe-west4"),
                        "ASIA1": ("asia-northeast1", "asia-northeast2")}


# "For a3-highgpu-1g, a3-highgpu-2g, and a3-highgpu-4g machine types, you must create instances by
# using Spot VMs or Flex-start VMs" (SPOT_OR_FLEX_START_SOURCE, Limitations, A3 High). Vertex AI's
# "Configure compute resources" page lists the three without that rule: a warning, not a stop.
SPOT_OR_FLEX_START_ONLY = ("a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g")
SPOT_OR_FLEX_START_SOURCE = ("https://docs.cloud.google.com/ai-hypercomputer/docs/create/"
                             "create-mig-with-a3-high-mega")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    message: str

    def __str__(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.message}"


def preflight(*, region: str, staging_bucket: str, machine: Machine, image_uri: str,
              cfg: TrainConfig | None = None, labels: dict[str, str] | None = None,
              reduction_server: ReductionServer | None = None, spot: bool = False,
              egress: bool = False, raise_on_failure: bool = True,
              verbose: bool = True, serving: bool = False) -> list[Check]:
    """Check a job of the trainer image `image_uri` (on Spot VMs with `spot`) before it costs
    money. `egress=True` says the job reaches the internet, so it may read the hub. `serving=True`
    checks a model's serving instead: a prediction machine, the image in the model's region."""
    checks = [_check_bucket(staging_bucket, region),
              _check_serving_machine(machine) if serving else _check_machine(machine, spot),
              _check_image(image_uri, region, machine, serving)]
    if reduction_server is not None:
        checks.append(_check_reduction_server(reduction_server, machine))
    if cfg is not None:
        checks.append(_check_input("data", cfg.data or "sample", "sample", egress))
        checks.append(_check_input("model_name_or_path", cfg.model_name_or_path or "minilm-l6",
                                   "minilm-l6", egress))
        checks.append(_check_batch(cfg, machine))
    if labels:
        checks.append(_check_labels(labels))
    if verbose:
        print("\n".join(map(str, checks)))
    failed = [c for c in checks if c.status == "fail"]
    if failed and raise_on_failure:
        raise PreflightError("preflight failed, nothing was submitted:\n  - "
                             + "\n  - ".join(f"{c.name}: {c.message}" for c in failed))
    return checks


def bucket_location_check(location: str, region: str) -> Check:
    """Is a bucket in `location` usable by a job in `region`? The same region: ok; a multi-region
    that contains it: warn; else fail."""
    loc, name = location.upper(), "bucket location"
    if loc == region.upper():
        return Check(name, "ok", f"{loc} is the job's region")
    create = f"create one there: gcloud storage buckets create gs://BUCKET --location={region}"
    if region.startswith(BUCKET_MULTI_REGIONS.get(loc, ())):
        return Check(name, "warn", f"{loc} contains {region}: custom jobs work, but some Vertex "
                     f"services require a bucket in the job's region; {create}")
    return Check(name, "fail", f"the bucket is in {loc} but the job runs in {region}: {create}")


def _check_bucket(staging_bucket: str, region: str) -> Check:
    bucket_name = staging_bucket.removeprefix("gs://").split("/")[0]
    try:
        fs, _ = files.filesystem(f"gs://{bucket_name}")
        bucket = fs.info(bucket_name)  # the bucket's metadata, its location included
    except FileNotFoundError:
        return Check("staging bucket", "fail", f"gs://{bucket_name} does not exist: create it in "
                     f"the job's region with `gcloud storage buckets create gs://{bucket_name} "
                     f"--location={region}`")
    except Exception as err:  # NLIError without credentials; gcsfs's HttpError, a refused bucket
        return Check("staging bucket", "fail", f"cannot read gs://{bucket_name}: {err}")
    where = bucket_location_check(bucket.get("location", ""), region)
    return dataclasses.replace(where, name="staging bucket",
                               message=f"gs://{bucket_name}: {where.message}")


def _check_machine(machine: Machine, spot: bool) -> Check:
    problem = accelerator_problem(machine.machine_type, machine.accelerator_type,
                                  machine.accelerator_count)
    if problem is None and machine.replica_count < 1:
        problem = f"replica_count={machine.replica_count} must be >= 1"
    gpus = (f" + {machine.accelerator_count} x {machine.accelerator_type}"
            if machine.accelerator_type else " (no GPU)")
    shown = f"{machine.machine_type}{gpus} x {machine.replica_count} replica(s)"
    if problem is None and machine.machine_type in SPOT_OR_FLEX_START_ONLY and not spot:
        return Check("machine", "warn", f"{shown}: Compute Engine offers {machine.machine_type} "
                     "only as Spot or Flex-start VMs, so on demand the job may be refused or wait "
                     f"for capacity; run it on Spot (spot=True) or take a3-highgpu-8g "
                     f"({SPOT_OR_FLEX_START_SOURCE})")
    return Check("machine", "fail" if problem else "ok", problem or shown)


def _check_reduction_server(server: ReductionServer, machine: Machine) -> Check:
    name = "reduction server"
    if not machine.has_gpu:
        return Check(name, "fail", "Reduction Server speeds up NCCL all-reduce between GPU nodes, "
                     "and NCCL needs GPUs: give the training pools an accelerator_type and "
                     "accelerator_count, or drop the Reduction Server pool (CPU replicas use gloo, "
                     "which it does not serve)")
    if machine.replica_count < 2:
        return Check(name, "fail", "a single training node has no traffic between nodes to "
                     "reduce: set replica_count >= 2, or drop the Reduction Server pool")
    problem = accelerator_problem(server.machine_type, None, 0)
    if problem or server.replica_count < 1:
        problem = problem or f"replica_count={server.replica_count}"
        return Check(name, "fail", "reducers run on CPU machines without GPUs "
                     f"({REDUCTION_SERVER_MACHINE_TYPE} is the usual choice), at least one "
                     f"replica: {problem}")
    return Check(name, "ok", f"{server.replica_count} x {server.machine_type} running "
                 f"{server.image_uri}; the training image must carry Google's NCCL plugin (the "
                 "google-reduction-server package): docker/Dockerfile installs it, an image of "
                 "your own must too, or NCCL ignores the reducers")


# The machine series Vertex AI serves predictions on, from the configure-compute page
# (https://cloud.google.com/vertex-ai/docs/predictions/configure-compute), which lists no
# n1-highcpu-2.
SERVING_SERIES = ("e2", "n1", "n2", "n2d", "c2", "c2d", "c3", "a2", "a3", "a4", "a4x", "g2", "g4")


def _check_serving_machine(machine: Machine) -> Check:
    if machine.machine_type.split("-")[0] not in SERVING_SERIES or (
            machine.machine_type == "n1-highcpu-2"):
        return Check("machine", "fail", f"{machine.machine_type} does not serve predictions: take "
                     "one of the configure-compute page's, such as n1-standard-2 or e2-standard-2")
    return _check_machine(machine, spot=False)


def registry_location(image_uri: str) -> str | None:
    """The Artifact Registry location of an image (a region or us/europe/asia), else None."""
    host = image_uri.split("/", 1)[0]
    return host.removesuffix("-docker.pkg.dev") if host.endswith("-docker.pkg.dev") else None


def _check_image(image_uri: str, region: str, machine: Machine, serving: bool = False) -> Check:
    if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?/\S+", image_uri):
        return Check("image/torch", "fail", f"image_uri={image_uri!r} is not an image reference: "
                     "expected REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG "
                     "(vertex.trainer_image_uri)")
    if serving and registry_location(image_uri) != region:  # custom container requirements page
        return Check("image/torch", "fail", f"{image_uri}: a serving image must be in Artifact "
                     f"Registry in the model's region, {region}, not in another region or a "
                     "multi-region (vertex.trainer_image_uri(project, region) names it)")
    if prebuilt_image(image_uri) and (problem := prebuilt_image_problem(image_uri)):
        return Check("image/torch", "fail", problem)  # no prebuilt image runs this package
    cuda = image_torch_cuda(image_uri)
    problem = image_gpu_problem(machine.accelerator_type, cuda or DEFAULT_TORCH_CUDA)
    if problem:
        return Check("image/torch", "fail", problem)
    notes = []
    if machine.has_gpu and cuda is None:
        notes.append("its tag names no torch CUDA build (trainer_image_uri tags it, e.g. "
                     f"0.1.0-cu126): taken as docker/Dockerfile's default {DEFAULT_TORCH_CUDA}")
    build = TORCH_CUDA_BUILDS[cuda or DEFAULT_TORCH_CUDA]
    if machine.has_gpu and build.min_driver >= 580:
        notes.append(f"a {build.tag} build needs an NVIDIA driver >= {build.min_driver}, and "
                     "Vertex AI documents no driver version for its training VMs: if the job "
                     "cannot see its GPUs, rebuild with cu126")
    where = registry_location(image_uri)  # a region, or the multi-region nearest the job's is near
    if where and where != region and f"{where}-docker.pkg.dev" != registry_host(region):
        notes.append(f"it lives in {where}, the job runs in {region}: every replica pulls it "
                     "across regions (slower, egress charges)")
    if notes:
        return Check("image/torch", "warn", f"{image_uri}: " + "; ".join(notes))
    gpu = f", which runs {machine.accelerator_type}" if machine.has_gpu else ""
    return Check("image/torch", "ok",
                 f"custom container {image_uri}: torch {build.tag} (CUDA {build.cuda}){gpu}")


# "Vertex AI won't be able to reach resources outside the perimeter" (VPC Service Controls,
# https://cloud.google.com/vertex-ai/docs/general/vpc-service-controls); a peered network without
# a NAT has no internet either. So a job reads from the hub only where its user says it can.
def _check_input(field: str, value: str, in_image: str, egress: bool) -> Check:
    """A job reads its data and model from gs:// or the image; from the hub only with `egress`;
    never from this machine, whose files it cannot see."""
    what = "model" if field == "model_name_or_path" else "data"
    stage = f"vertex.stage_{what}(cfg, 'gs://BUCKET', folder) uploads it"
    if value == in_image:
        return Check(what, "ok", f"{field}={value}: in the trainer image")
    if files.is_gcs_uri(value):
        try:
            fs, path = files.filesystem(value)
            found = fs.exists(path)
        except Exception as err:  # NLIError without credentials; gcsfs's HttpError, a refusal
            return Check(what, "fail", f"{field}={value}: {err}")
        if not found:
            return Check(what, "fail", f"{field}={value} does not exist: upload the {what} first "
                         f"({stage})")
        return Check(what, "ok", f"{field}={value}")
    path = Path(value).expanduser()
    if path.exists():
        return Check(what, "fail", f"{field}={value} is a local path the Vertex worker cannot "
                     f"see: {stage} and passes the gs:// URI")
    if path.suffix or value.startswith((".", "/", "~")):
        return Check(what, "fail", f"{field}={value} is neither a path here nor a gs:// URI or a "
                     f"hub name: pass the gs:// URI of the {what}")
    hub = (f"{field}={value}: the job downloads it from the Hugging Face hub at start, in every "
           f"replica and trial; {stage} once")
    if egress:
        return Check(what, "warn", hub)
    return Check(what, "fail", f"{hub}, or pass egress=True to preflight where the job reaches the "
                 "internet (behind VPC Service Controls it cannot)")


RECIPE_GLOBAL_BATCH = 32  # the full profile's batch, for which its learning rate was tuned


def _check_batch(cfg: TrainConfig, machine: Machine) -> Check:
    """The global batch grows with the processes: one per GPU of every replica."""
    size = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * machine.processes
    line = (f"{size} pairs per optimizer step = {machine.processes} process(es) x "
            f"{cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps} accumulation")
    if cfg.profile == "full" and size != RECIPE_GLOBAL_BATCH:
        return Check("batch", "warn", f"{line}: the reference recipe trains at a global batch of "
                     f"{RECIPE_GLOBAL_BATCH} (lr 2e-5 was tuned for it); set "
                     "per_device_train_batch_size or retune learning_rate")
    return Check("batch", "ok", line)


def _check_labels(labels: dict[str, str]) -> Check:
    bad = [k for k, v in labels.items() if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)
           or not re.fullmatch(r"[a-z0-9_-]{0,63}", v)]
    if bad:
        return Check("labels", "fail", f"invalid label(s) {', '.join(bad)}: keys start with a "
                     "lowercase letter; keys and values use only lowercase letters, digits, '_' "
                     "and '-', at most 63 characters")
    return Check("labels", "ok", ", ".join(f"{k}={v}" for k, v in labels.items()))
