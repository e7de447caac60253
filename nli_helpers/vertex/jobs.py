"""Submit a Vertex AI custom job, watch it, find its logs, and fetch its outputs.

    >>> cloud = init_vertex("my-project", "us-central1", "gs://my-staging-bucket")
    >>> job = submit_custom_job(pools, base_output_dir="gs://my-staging-bucket/nli-jobs/run-1")
    >>> watch_job(job)                  # a line per state; JobFailedError with the logs link
    >>> metrics = fetch_outputs(job, "runs/vertex-run-1")

With NLI_VERTEX_API_ENDPOINT set (the local stand-in of Vertex), `init_vertex` talks to that
endpoint. google-cloud-aiplatform is imported only when needed: it takes seconds to import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from google.api_core import exceptions as api_exceptions
from google.auth.exceptions import GoogleAuthError

from nli_helpers import files
from nli_helpers.files import CREDENTIALS_HELP

from .errors import JobFailedError, NotSubmitted, VertexError
from .images import trainer_image_uri
from .pools import SPOT_CHECKPOINT_EVERY_MINUTES, spot_worker_pools, training_replicas

if TYPE_CHECKING:
    from google.cloud.aiplatform import CustomJob

API_ENDPOINT_ENV = "NLI_VERTEX_API_ENDPOINT"
CLOUDS = ("practice", "google")  # where a notebook's jobs go: the local stand-ins, or your project
# What `python -m localcloud` (or a notebook in practice mode) sets: never beside cloud="google".
PRACTICE_ENV = ("STORAGE_EMULATOR_HOST", API_ENDPOINT_ENV)
TERMINAL_STATES = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                   "JOB_STATE_EXPIRED")


def check_cloud(cloud: str) -> str:
    """`cloud` itself, or one error: "practice" (free, on this machine) or "google" (billed). Google
    with the stand-ins' variables set would send the notebook's storage calls to the emulator."""
    if cloud not in CLOUDS:
        raise VertexError(f"cloud={cloud!r} is unknown: use 'practice' (the local stand-ins, free) "
                          "or 'google' (your Google Cloud project, billed)")
    stray = [name for name in PRACTICE_ENV if os.environ.get(name)]
    if cloud == "google" and stray:
        raise VertexError(f"cloud='google', but {', '.join(stray)} point at the local stand-ins "
                          "(python -m localcloud sets them): start JupyterLab without it, or use "
                          "cloud='practice'")
    return cloud


def confirm_submit(cloud: str, yes: bool, flag: str, what: str) -> None:
    """Nothing is billed without the user's word: in practice mode go on; on Google Cloud stop
    here with NotSubmitted unless the notebook's `flag` parameter is True."""
    if check_cloud(cloud) == "practice" or yes:
        return
    raise NotSubmitted(f"{what} would bill your Google Cloud project (the cost is printed above). "
                       f"To submit it, set {flag} = True in the parameters cell and run from here.")


@dataclass(frozen=True)
class VertexSettings:
    """Where jobs go, as `init_vertex` resolved it: what a notebook prints and passes on."""

    project: str
    region: str
    staging_bucket: str
    endpoint: str
    image_uri: str  # the image you named, else trainer_image_uri(project, region)


def init_vertex(project: str | None = None, region: str = "us-central1",
                staging_bucket: str | None = None, *, image_uri: str | None = None,
                credentials=None, api_endpoint: str | None = None,
                api_transport: str = "rest") -> VertexSettings:
    """Point the aiplatform SDK at a project, region and staging bucket.

    A setting left at None comes from the environment: $GOOGLE_CLOUD_PROJECT (else your gcloud
    default), $NLI_STAGING_BUCKET, $NLI_VERTEX_API_ENDPOINT (else the region's endpoint). A
    plain-HTTP endpoint can only be a local stand-in, so it gets anonymous credentials.
    """
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    api_endpoint = (api_endpoint or os.environ.get(API_ENDPOINT_ENV)
                    or f"{region}-aiplatform.googleapis.com")
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
    staging_bucket = staging_bucket or os.environ.get("NLI_STAGING_BUCKET")
    if credentials is None and is_stand_in(api_endpoint):
        credentials = AnonymousCredentials()
    if credentials is None:
        try:
            credentials, default_project = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except DefaultCredentialsError as err:
            raise VertexError(CREDENTIALS_HELP) from err
        project = project or default_project
    if not project:
        raise VertexError("no Google Cloud project: pass project=..., set GOOGLE_CLOUD_PROJECT, or "
                          "run `gcloud config set project PROJECT_ID`")
    if not staging_bucket or not files.is_gcs_uri(staging_bucket):
        raise VertexError(f"staging_bucket={staging_bucket!r}: Vertex needs a gs://BUCKET in the "
                          "job's region to stage packages and keep outputs: pass "
                          "staging_bucket=..., or set NLI_STAGING_BUCKET; create one with `gcloud "
                          f"storage buckets create gs://BUCKET --location={region}`")
    from google.cloud import aiplatform

    # The SDK keeps settings between calls: always pass the endpoint, or a stand-in's would stick.
    aiplatform.init(project=project, location=region, staging_bucket=staging_bucket,
                    credentials=credentials, api_endpoint=api_endpoint, api_transport=api_transport)
    # A stand-in's job has no Console page: drop the SDK's "View Custom Job: https://console..."
    sdk_log = logging.getLogger("google.cloud.aiplatform.jobs")
    sdk_log.removeFilter(no_console_links)
    if is_stand_in(api_endpoint):
        sdk_log.addFilter(no_console_links)
    return VertexSettings(project, region, staging_bucket, api_endpoint,
                          image_uri or trainer_image_uri(project, region))


def is_stand_in(api_endpoint: str | None) -> bool:
    """A plain-HTTP endpoint can only be a local stand-in (practice mode): Vertex AI's are HTTPS."""
    return (api_endpoint or "").startswith("http://")


def no_console_links(record: logging.LogRecord) -> bool:
    return "console.cloud.google.com" not in record.getMessage()


@contextlib.contextmanager
def api_errors(service_account: str | None = None):
    """Turn the Google API errors of creating a job into one VertexError that says what to do."""
    try:
        yield
    except GoogleAuthError as err:
        raise VertexError(f"{CREDENTIALS_HELP} ({err})") from err
    except api_exceptions.PermissionDenied as err:
        account = service_account or "the job service account"
        raise VertexError("permission denied creating the job: grant your account "
                          "roles/aiplatform.user (and iam.serviceAccountUser on "
                          f"{account}): {err.message}") from err
    except api_exceptions.GoogleAPICallError as err:
        raise VertexError(f"Vertex AI refused the job ({err.code}): {err.message}. Is the API "
                          "enabled? gcloud services enable aiplatform.googleapis.com") from err


# A job's timeout, in the hours its cost estimate expects: Vertex AI's default is 7 days
# (CustomJobSpec's scheduling.timeout), which a hung rendezvous or NCCL call bills in full.
TIMEOUT_PER_EXPECTED_HOUR = 2


def submit_custom_job(worker_pool_specs: list[dict], *, base_output_dir: str,
                      display_name: str | None = None, service_account: str | None = None,
                      labels: dict[str, str] | None = None, spot: bool = False,
                      restart_job_on_worker_restart: bool | None = None,
                      expected_hours: float = 1.0, timeout_s: int | None = None,
                      tensorboard: str | None = None) -> CustomJob:
    """Create the CustomJob and return at once (watch it with `watch_job`). Vertex AI stops it
    after `timeout_s`, by default TIMEOUT_PER_EXPECTED_HOUR x `expected_hours` (the hours you
    priced with `estimate_job_cost`).

    `restart_job_on_worker_restart=None` turns it on for several training replicas: torchrun's
    fixed rendezvous cannot take back one restarted node, so all restart and resume from the
    newest checkpoint. `spot=True` runs on Spot VMs and checkpoints every few minutes
    (`spot_worker_pools`). `tensorboard`: a Vertex AI TensorBoard resource
    (projects/P/locations/L/tensorboards/ID) to stream scalars to; it needs `service_account`,
    as which the job writes them.
    """
    from google.cloud import aiplatform
    from google.cloud.aiplatform.compat.types import custom_job as custom_job_types

    if restart_job_on_worker_restart is None:
        restart_job_on_worker_restart = training_replicas(worker_pool_specs) > 1
    strategy = custom_job_types.Scheduling.Strategy.SPOT if spot else None
    if spot:
        spot_pools = spot_worker_pools(worker_pool_specs)
        if spot_pools != worker_pool_specs:
            print(f"Spot VMs: the trainer also checkpoints every {SPOT_CHECKPOINT_EVERY_MINUTES} "
                  "minutes (set checkpoint_every_minutes in the config to choose)")
        worker_pool_specs = spot_pools
    timeout_s = timeout_s or int(TIMEOUT_PER_EXPECTED_HOUR * expected_hours * 3600)
    with api_errors(service_account):
        job = aiplatform.CustomJob(
            display_name=display_name or f"nli-{time.strftime('%Y%m%d-%H%M%S')}",
            worker_pool_specs=worker_pool_specs, base_output_dir=base_output_dir, labels=labels)
        job.submit(service_account=service_account,
                   restart_job_on_worker_restart=restart_job_on_worker_restart,
                   scheduling_strategy=strategy, timeout=timeout_s, tensorboard=tensorboard)
    print(f"submitted {job.resource_name}; Vertex AI stops it after {timeout_s / 3600:g} h "
          f"(timeout_s)\nlogs: {logs_where(job)}")
    return job


def logs_where(job: CustomJob) -> str:
    """Where the job's logs are: Cloud Logging, or, in practice mode, the local stand-in."""
    from google.cloud.aiplatform import initializer

    if is_stand_in(initializer.global_config.api_endpoint):
        return "kept by the local stand-in (practice mode; on Google Cloud, Cloud Logging)"
    return logs_url(job)


def logs_url(job: CustomJob) -> str:
    """The Cloud Logging page with this job's logs."""
    parts = job.resource_name.split("/")  # projects/P/locations/L/customJobs/ID
    query = f'resource.type="ml_job"\nresource.labels.job_id="{parts[-1]}"'
    from urllib.parse import quote

    return (f"https://console.cloud.google.com/logs/query;query={quote(query, safe='')}"
            f"?project={parts[1]}")


WATCH_TIMEOUT_S = 3 * 24 * 3600.0  # longer than any recipe here; shorter than forever
QUEUED_NOTICE_S = 300.0
QUOTAS_HELP = ("Vertex AI keeps a job queued while the project lacks custom-training quota for it "
               "(https://docs.cloud.google.com/vertex-ai/docs/training/"
               "understanding-training-service#queue): check 'Custom model training {gpu} per "
               "region' for {region} at "
               "https://console.cloud.google.com/iam-admin/quotas?project={project} and request "
               "more, pick another region or GPU, or cancel it with job.cancel()")


def watch_job(job: CustomJob | str, *, poll_s: float = 30.0,
              timeout_s: float | None = WATCH_TIMEOUT_S,
              queued_notice_s: float = QUEUED_NOTICE_S) -> str:
    """Poll until the job ends, printing a line per state; return its final state, or raise
    JobFailedError (VertexError on timeout, the job still running). A job queued longer than
    `queued_notice_s` gets one line saying why (quota) and what to do. `timeout_s=None` waits for
    ever."""
    if isinstance(job, str):
        from google.cloud import aiplatform

        job = aiplatform.CustomJob.get(job)
    start, last, queued_since = time.monotonic(), None, None
    while True:
        state = job.state.name  # each read fetches the job again
        if state != last:
            print(f"{job.display_name}: {state}", flush=True)
            last, queued_since = state, time.monotonic() if state == "JOB_STATE_QUEUED" else None
        if state in TERMINAL_STATES:
            break
        if queued_since is not None and time.monotonic() - queued_since >= queued_notice_s:
            print(f"{job.display_name} is still queued after "
                  f"{time.monotonic() - queued_since:.0f} s: {queued_help(job)}", flush=True)
            queued_since = None  # said once
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            why = f" ({queued_help(job)})" if state == "JOB_STATE_QUEUED" else ""
            raise VertexError(f"{job.resource_name} is still {state} after {timeout_s:g} s{why}; "
                              f"it keeps running: watch_job('{job.resource_name}') again, or "
                              "cancel it with job.cancel()")
        time.sleep(poll_s)
    if state != "JOB_STATE_SUCCEEDED":
        raise JobFailedError(f"{job.resource_name} ended {state}: "
                             f"{job.error.message or 'no error message'}; logs: {logs_where(job)}")
    return state


def queued_help(job) -> str:
    """What a queued job waits for, with the quota page of its project and the GPU it asked for."""
    from google.cloud.aiplatform.compat.types import accelerator_type

    _, project, _, region, *_ = job.resource_name.split("/")
    spec = (job.job_spec.worker_pool_specs[0].machine_spec
            if job.job_spec.worker_pool_specs else None)
    gpu = (accelerator_type.AcceleratorType(spec.accelerator_type).name
           if spec and spec.accelerator_count else "CPU")
    return QUOTAS_HELP.format(gpu=gpu.replace("_", " ") + (" GPUs" if gpu != "CPU" else " vCPUs"),
                              region=region, project=project)


def fetch_outputs(job_or_base_output_dir: CustomJob | str, local_dir: str | Path) -> dict:
    """Download base_output_dir/model (model, metrics.json, ...) into `local_dir`; return the
    metrics."""
    base = job_or_base_output_dir
    if not isinstance(base, str):
        base = base.job_spec.base_output_directory.output_uri_prefix
    fs, model = files.filesystem(f"{base.rstrip('/')}/model")
    if not fs.exists(f"{model}/metrics.json"):
        raise VertexError(f"no metrics.json under gs://{model}: the job did not finish training; "
                          "see its logs")
    fs.get(f"{model}/", f"{local_dir}/", recursive=True)
    return json.loads((Path(local_dir) / "metrics.json").read_text())


# What notebook 07 labels its endpoints with, so that a leftover one can be found and removed.
TUTORIAL_LABELS = {"tutorial": "nli-workbench"}


def remove_endpoints(labels: dict[str, str] = TUTORIAL_LABELS) -> list[str]:
    """Undeploy and delete every endpoint carrying `labels` in aiplatform.init's project and region:
    what an interrupted deploy may have left billing by the hour. Returns their names."""
    from google.cloud import aiplatform

    query = " AND ".join(f'labels.{key}="{value}"' for key, value in labels.items())
    removed = []
    for endpoint in aiplatform.Endpoint.list(filter=query):
        endpoint.delete(force=True)  # undeploys its models first: a deployed model bills
        removed.append(endpoint.resource_name)
    return removed
