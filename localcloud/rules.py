"""The rules by which localcloud/vertex.py runs a custom job, each as a Vertex AI page documents it.

Each rule quotes the sentence it models; what the pages leave open, and the fake's own choices, are
said so. Pages read 2026-11-23. Google also files Vertex AI as "Gemini Enterprise Agent Platform"
(same API); where only that copy of a page could be read whole, its wording ("Agent Platform") is
quoted as found. AGENT stands for
https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/training/

* TRAINING_SERVICE:
  https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service (read up to
  "Non-zero exits"; whole as AGENT + understanding-training-service)
* SPOT: https://docs.cloud.google.com/vertex-ai/docs/training/use-spot-vms (read as AGENT +
  use-spot-vms)
* SCHEDULING:
  https://docs.cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec#Scheduling (read as
  the same proto comments in the SDK, google.cloud.aiplatform_v1.types.Scheduling, and Google's
  client reference)
* PACKAGE_SPEC: google.cloud.aiplatform_v1.types.PythonPackageSpec, the proto comments of
  CustomJobSpec's page
* PREBUILT: https://docs.cloud.google.com/vertex-ai/docs/training/pre-built-containers

1. Queue (TRAINING_SERVICE, "Queue a new job"): "if your Google Cloud project does not have
   sufficient remaining custom training quotas for your job, then Vertex AI keeps the job queued
   until you have sufficient quotas." (`FakeVertex(gpu_quota={"NVIDIA_L4": 0})`, `set_quota`.)
2. Images. PACKAGE_SPEC on executor_image_uri: "You must use an image from this list" (only
   `:latest` tags, PREBUILT): anything else is refused on create, with a 400. A container pool runs
   an image registered with `register_image(uri, python)`; an unknown image fails the job (the pull
   fails).
3. Installing a python package (PACKAGE_SPEC, python_module: "The Python module name to run after
   installing the packages"). pip keeps an installed distribution that satisfies a requirement and
   replaces one that does not; the fake reads the sdist's own Requires-Dist against the image's
   torch (PREBUILT) and, where pip would replace it (with the newest CUDA build on PyPI, on every
   replica at every start), fails the job saying so. No published image (torch <= 2.4) suits this
   package (torch >= 2.6), so a python-package job never trains.
4. Success (TRAINING_SERVICE): "A training job completes successfully when its primary replica exits
   with exit code 0. At that point, Vertex AI shuts down all the other running workers."
5. VM maintenance (TRAINING_SERVICE, "Restart workers during the training job"): "When the VM
   running a worker is subjected to VM maintenance, Vertex AI restarts the worker on another VM."
   `preempt(job, replica, kind="maintenance")` stops the replica as a container stop does (SIGTERM
   to its first process, SIGKILL to all after the grace period; `hard=True` kills at once) and
   starts it again with the same hostname, command and environment. The page gives no limit to these
   restarts and no grace period: the fake sets no limit and stops with its `grace_s` (30 s by
   default, a Spot VM's: rule 6).
6. Spot preemption. The two pages give a preempted job two limits (both read again 2026-11-27):
   SPOT ("Preemption handling"): "When Spot VMs are preempted, the serverless training job fails
   with a `STOCKOUT` error and Compute Engine tries to restart the job up to six times."
   TRAINING_SERVICE ("Handle common errors", the row "Insufficient capacity in your region (Compute
   Engine stockout)"): "A stockout happens when Compute Engine is at capacity for your selected CPU
   or GPU in your region. It is unrelated to your project quota. When this happens, Agent Platform
   attempts to restart the job up to three times." The fake follows the table, the lower number: a
   job that survives the fake's restarts then survives Vertex's whichever page is right (a stand-in
   more lenient than the service would hide failures), and the table's row is also the one that
   gives the message (SPOT names the error, not its message). So `preempt(job, replica,
   kind="spot")`, allowed only for a job with scheduling.strategy SPOT, stops that replica as in
   rule 5, then every other one, and starts the WHOLE job again; the fourth preemption ends it
   FAILED with that row's message: "Resources are insufficient in region: REGION_NAME. Try a
   different region or use a different accelerator." Grace period: Compute Engine's preemption
   process sends "a preemption notice to the instance in the form of an ACPI G2 Soft Off signal"
   and, "If the instance does not stop after 30 seconds", "an ACPI G3 Mechanical Off signal"
   (https://cloud.google.com/compute/docs/instances/preemptible#preemption-process, read as quoted
   in a public repository; Vertex documents none of its own).
7. Non-zero exits (TRAINING_SERVICE): "If any worker exits with a non-zero exit code, Vertex AI
   restarts that worker immediately in the same VM." and "If a worker fails due to a common error,
   it is treated as a permanent error, and Agent Platform shuts down the entire job." The table of
   common errors ("Handle common errors") lists "User code exception", whose message is "The replica
   REPLICA_NAME exited with a non-zero status of EXIT_CODE . Termination reason: REASON .", with the
   note: "If the job encountered exit codes that could be transient, Agent Platform tries to restart
   the job up to three times." Those codes: SIGABRT "ExitCode 6" and "ExitCode 134 (custom
   containers)", SIGSEGV "ExitCode 11" and "ExitCode 139 (custom containers)". So a transient code
   stops every replica and restarts the whole job, at most three times, then the job ends FAILED;
   any other non-zero exit ends it FAILED at once. The message is the template and nothing more
   (what the replica printed stays in its log: `replica_log`, the job's `log`). REASON's values are
   not documented; the fake writes "Error", as the messages of real jobs quoted in public
   repositories do. The page's other branch ("non-permanent error (any error not listed in the
   common errors)": up to five restarts per worker, then up to three whole-job retries) has no
   trigger here: every exit of user code is in the table.
8. `restart_job_on_worker_restart` (SCHEDULING): "Restarts the entire CustomJob if a worker gets
   restarted. This feature can be used by distributed training jobs that are not resilient to
   workers leaving and joining a job." A worker restarted by rule 5 restarts every training replica
   (SIGTERM, grace, SIGKILL, start).
9. `scheduling.timeout` (SCHEDULING): "The maximum job running time. The default is 7 days." The
   fake counts from JOB_STATE_RUNNING across restarts. The page does not say how such a job ends.
   The fake CANCELS it, with a message of its own, as the predecessor service documents ("If the
   training job is still running after this duration, AI Platform Training cancels it. The duration
   is measured from when the job enters the `RUNNING` state", Scheduling.maxRunningTime of the ml v1
   API, read in clients generated from its discovery document) and as a Vertex user saw ("After 7
   days it gets cancelled", https://github.com/tensorflow/tfx/issues/6223). A job that sets no
   timeout gets the fake's safety limit, JOB_TIMEOUT_S (not Vertex's 7 days), and then ends FAILED
   saying it is the fake's limit.
10. CLOUD_ML_PROJECT_ID holds the project NUMBER. No Vertex page listing the training containers'
    variables was found; the SDK reads it so (google/cloud/aiplatform/initializer.py:
    `project_number = ... os.environ.get("CLOUD_ML_PROJECT_ID")`, then converts the number to the
    project id; https://github.com/googleapis/python-aiplatform/issues/852: "there is a way to get
    project number from the Vertex environment"). The fake's numbers: `project_number`.

11. TensorBoard (CustomJobSpec.tensorboard, the proto comment): "The name of a Vertex AI Tensorboard resource
    to which this CustomJob will upload Tensorboard logs. Format:
    projects/{project}/locations/{location}/tensorboards/{tensorboard}"; the SDK's CustomJob.submit:
    "`service_account` is required with provided `tensorboard`." A name of another form, or no service account,
    is refused on create with a 400 (what Vertex answers there is not documented: the message is the fake's).

Deliberately not modelled: Reduction Server pools (Google's image, which serves NCCL between GPUs)
are accepted and noted in the job log, not started; machine specs are recorded, not honoured
(everything runs on this CPU); internal errors and their retries; the job's state while Vertex
restarts it (the fake keeps JOB_STATE_RUNNING).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from google.cloud.aiplatform_v1.types import AcceleratorType, CustomJob, JobState, Scheduling

from localcloud.image import sdist_requirements
from localcloud.replica import Replica, stop_all

# Rule 2: the PyTorch rows of the prebuilt training images table (PREBUILT, read 2026-11-22): name -> (torch, Python).
PUBLISHED_PYTORCH_IMAGES = {
    "pytorch-gpu.2-4.py310": ("2.4.1", "3.10"), "pytorch-xla.2-4.py310": ("2.4.1", "3.10"),
    "pytorch-gpu.2-3.py310": ("2.3.1", "3.10"), "pytorch-xla.2-3.py310": ("2.3.1", "3.10"),
    "pytorch-gpu.2-2.py310": ("2.2.2", "3.10"), "pytorch-xla.2-2.py310": ("2.2.2", "3.10"),
    "pytorch-gpu.2-1.py310": ("2.1.2", "3.10"), "pytorch-xla.2-1.py310": ("2.1.2", "3.10"),
}
PREBUILT_HOSTS = ("us-docker.pkg.dev", "europe-docker.pkg.dev", "asia-docker.pkg.dev")
DEFAULT_ENTRYPOINT = ["python", "-m", "nli_helpers.vertex.entry"]  # docker/Dockerfile's ENTRYPOINT
TRANSIENT_EXIT_CODES = {"container_spec": {134, 139}, "python_package_spec": {6, 11}}  # rule 7
MAX_JOB_RETRIES, MAX_SPOT_RESTARTS = 3, 3  # rules 7 and 6 (the lower of rule 6's two numbers)
SPOT_GRACE_S = 30.0  # rule 6
JOB_TIMEOUT_S = 900.0  # rule 9: the fake's safety limit for a job that sets no scheduling.timeout
TERMINAL = {JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED}
PREEMPTION_KINDS = ("spot", "maintenance")  # rules 6 and 5


def published_image(uri: str) -> tuple[str, str] | None:
    """(torch version, Python version) of a prebuilt training image URI, or None if it is not one (rule 2)."""
    host, _, path = uri.partition("/")
    name, _, tag = path.removeprefix("vertex-ai/training/").partition(":")
    if host not in PREBUILT_HOSTS or not path.startswith("vertex-ai/training/") or tag != "latest":
        return None
    return PUBLISHED_PYTORCH_IMAGES.get(name)


def pip_keeps_torch(sdist: Path, image_torch: str) -> tuple[bool, str]:
    """Rule 3: would `pip install SDIST` keep the image's torch? And the sdist's torch requirement, as text."""
    torch = next((r for r in sdist_requirements(sdist) if r.name == "torch"), None)
    if torch is None:
        return True, "no torch requirement"
    return torch.specifier.contains(image_torch, prereleases=True), str(torch)


# -- what Vertex checks on create ----------------------------------------------------------------------------------
def server_side_problem(proto: CustomJob) -> str | None:
    """The rules Vertex checks on create that the SDK does not."""
    pools = proto.job_spec.worker_pool_specs
    if not pools:
        return "job_spec.worker_pool_specs must not be empty"
    if pools[0].replica_count != 1:
        return "the first worker pool (the chief) must have replica_count 1"
    if not proto.job_spec.base_output_directory.output_uri_prefix.startswith("gs://"):
        return "base_output_directory must be a gs:// URI"
    for i, pool in enumerate(pools):
        image = pool.python_package_spec.executor_image_uri if "python_package_spec" in pool else None
        if image is not None and published_image(image) is None:  # rule 2
            return (f"workerpool{i}: executor_image_uri {image} is not a prebuilt training image with the :latest "
                    "tag (PythonPackageSpec: \"You must use an image from this list\")")
    board = proto.job_spec.tensorboard  # rule 11
    if board and not re.fullmatch(r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+", board):
        return f"tensorboard {board!r} is not projects/{{project}}/locations/{{location}}/tensorboards/{{id}}"
    if board and not proto.job_spec.service_account:
        return "a job with a tensorboard needs a service_account, as which it writes the logs"
    bad = [k for k in proto.labels if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)]
    return f"invalid label keys: {bad}" if bad else None


def api_error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def project_number(project: str) -> str:
    """Rule 10: the project number the fake gives a project id (stable, 12 digits; a number stays itself)."""
    if project.isdigit():
        return project
    return str(10**11 + int(hashlib.sha256(project.encode()).hexdigest(), 16) % (9 * 10**11))


def failure_message(replica: str, code: int) -> str:
    """Rule 7: the "User code exception" message, as Vertex's template has it and nothing more."""
    return f"The replica {replica} exited with a non-zero status of {code}. Termination reason: Error."


def stockout_message(proto: CustomJob) -> str:
    """Rule 6: the stockout message, for the job's region (projects/P/locations/REGION/customJobs/ID)."""
    region = proto.name.split("/")[3]
    return (f"Resources are insufficient in region: {region}. "
            "Try a different region or use a different accelerator.")


def time_limit(proto: CustomJob) -> tuple[float, bool]:
    """Rule 9: the seconds the job may run, and whether the job set them (scheduling.timeout)."""
    scheduling = proto.job_spec.scheduling
    if "timeout" in scheduling and scheduling.timeout.total_seconds() > 0:
        return scheduling.timeout.total_seconds(), True
    return JOB_TIMEOUT_S, False


# -- a job ------------------------------------------------------------------------------------------
@dataclass
class FakeJob:
    proto: CustomJob
    request_body: dict
    log: str = ""
    replicas: dict[str, Replica] = field(default_factory=dict)
    job_retries: int = 0  # whole-job restarts after a possibly transient exit (rule 7)
    spot_restarts: int = 0  # whole-job restarts after a Spot preemption (rule 6)
    cpu_replicas: int = 0  # its training replicas, while they hold a share of this machine's cores
    side_by_side: int = 1  # jobs like it that start together (a tuning job's parallel trials): each its share
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)  # replicas are running
    done: threading.Event = field(default_factory=threading.Event)

    def note(self, text: str) -> None:
        self.log += f"[fake] {text}\n"

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [r.process for r in self.replicas.values() if r.process is not None]

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.processes if p.poll() is None]


# -- quota (rule 1) ---------------------------------------------------------------------------------------------
def gpus_needed(proto: CustomJob) -> Counter:
    """GPUs per accelerator type that the job's training pools ask for (reducers have none)."""
    need: Counter = Counter()
    for pool in proto.job_spec.worker_pool_specs[:2]:
        if pool.machine_spec.accelerator_count:
            gpu = AcceleratorType(pool.machine_spec.accelerator_type).name
            need[gpu] += pool.machine_spec.accelerator_count * pool.replica_count
    return need


class Quota:
    """The project's custom-training GPU quota in the region: None means unlimited."""

    def __init__(self, limits: dict[str, int] | None):
        self.limits = dict(limits) if limits is not None else None
        self.in_use: Counter = Counter()
        self.changed = threading.Condition()

    def fits(self, need: Counter) -> bool:
        if self.limits is None:
            return True
        return all(self.in_use[g] + n <= self.limits.get(g, 0) for g, n in need.items())

    def set(self, accelerator_type: str, count: int) -> None:
        with self.changed:
            self.limits = {**(self.limits or {}), accelerator_type: count}
            self.changed.notify_all()

    def release(self, need: Counter) -> None:
        with self.changed:
            self.in_use -= need
            self.changed.notify_all()


# -- running the replicas (rules 4-9) ---------------------------------------------------------------
class Outcome:
    SUCCEEDED, FAILED, CANCELLED, TIMED_OUT = "succeeded", "failed", "cancelled", "timed out"
    RETRY_JOB, SPOT_RESTART = "retry job", "spot restart"  # the whole job starts again (rules 7 and 6)


def run_job(job: FakeJob, replicas: list[Replica], *, grace_s: float) -> tuple[JobState, str]:
    """Rules 4-9 from JOB_STATE_RUNNING to the job's end: its final state and error message."""
    limit, set_by_job = time_limit(job.proto)
    deadline = time.monotonic() + limit  # rule 9: running time, across whole-job restarts
    restart_all = job.proto.job_spec.scheduling.restart_job_on_worker_restart
    while True:
        outcome, message = supervise(job, replicas, restart_whole_job=restart_all, grace_s=grace_s,
                                     deadline=deadline)
        if outcome == Outcome.RETRY_JOB and job.job_retries < MAX_JOB_RETRIES:  # rule 7
            job.job_retries += 1
            job.note(f"{message} Possibly transient: restarting the job "
                     f"({job.job_retries} of {MAX_JOB_RETRIES})")
        elif outcome == Outcome.SPOT_RESTART and job.spot_restarts < MAX_SPOT_RESTARTS:  # rule 6
            job.spot_restarts += 1
            job.note(f"{message}: the job fails with a STOCKOUT error; restarting the job "
                     f"({job.spot_restarts} of {MAX_SPOT_RESTARTS})")
        elif outcome == Outcome.SPOT_RESTART:
            job.note(f"{message} again, after {MAX_SPOT_RESTARTS} restarts: the job fails")
            return JobState.JOB_STATE_FAILED, stockout_message(job.proto)
        elif outcome == Outcome.TIMED_OUT and set_by_job:  # rule 9
            return JobState.JOB_STATE_CANCELLED, (f"The job ran longer than its scheduling.timeout "
                                                  f"({limit:g} s) and was cancelled.")
        elif outcome == Outcome.TIMED_OUT:
            return JobState.JOB_STATE_FAILED, (f"the fake's safety limit of {limit:g} s passed: the job "
                                               "sets no scheduling.timeout (Vertex's default is 7 days)")
        else:
            states = {Outcome.SUCCEEDED: JobState.JOB_STATE_SUCCEEDED,
                      Outcome.CANCELLED: JobState.JOB_STATE_CANCELLED}
            return states.get(outcome, JobState.JOB_STATE_FAILED), message


def supervise(job: FakeJob, replicas: list[Replica], *, restart_whole_job: bool, grace_s: float,
              deadline: float) -> tuple[str, str]:
    """Start every replica and apply rules 4-8 until the job ends or must start again as a whole."""
    for replica in replicas:
        replica.start()
    while True:
        if job.cancel_requested.is_set():
            stop_all(replicas, grace_s)
            return Outcome.CANCELLED, "cancelled by the user"
        if time.monotonic() > deadline:
            stop_all(replicas, grace_s)
            return Outcome.TIMED_OUT, ""
        # A preempted replica first: its restart (of the whole job, with rules 6 and 8) comes before the
        # errors its peers then run into, as on Vertex, where the VM event starts the restart. So while a
        # preempted replica is still stopping (or being reaped: Popen.poll() answers None while another thread
        # waits on it), the exits of its peers wait for it; and its own exit code, 0 included, is the VM's.
        if any(r.preempted and r.running() for r in replicas):
            time.sleep(0.1)
            continue
        for replica in sorted(replicas, key=lambda r: not r.preempted):
            code = replica.process.poll() if replica.process and not replica.finished else None
            if code is None:
                continue
            replica.kill_all()  # the container is gone with its first process
            if code == 0 and not replica.preempted:
                replica.finished = True
                if replica.primary:  # rule 4
                    stop_all([r for r in replicas if r is not replica], grace_s)
                    return Outcome.SUCCEEDED, ""
                continue
            if replica.preempted == "spot":  # rule 6: every replica goes, the whole job starts again
                stop_all(replicas, grace_s)
                return Outcome.SPOT_RESTART, f"{replica.name}'s Spot VM was preempted"
            if not replica.preempted:  # rule 7: a transient code restarts the job, any other ends it
                stop_all(replicas, grace_s)
                transient = code in TRANSIENT_EXIT_CODES[replica.kind]
                return Outcome.RETRY_JOB if transient else Outcome.FAILED, failure_message(replica.name, code)
            why = "VM maintenance: restarted on another VM with the same hostname"  # rule 5
            if restart_whole_job:  # rule 8
                job.note(f"{replica.name} {why}; restart_job_on_worker_restart: restarting every replica")
                stop_all(replicas, grace_s)
                for other in replicas:
                    other.start()
            else:
                job.note(f"{replica.name} {why}")
                replica.start()
        time.sleep(0.1)


def preempt(job: FakeJob, replica: Replica, *, kind: str, hard: bool, grace_s: float) -> None:
    """Rules 5 and 6: VM maintenance (`kind="maintenance"`) or a Spot preemption of the VM under `replica`."""
    if kind not in PREEMPTION_KINDS:
        raise ValueError(f"kind={kind!r}: a preemption is one of {PREEMPTION_KINDS}")
    if kind == "spot" and job.proto.job_spec.scheduling.strategy != Scheduling.Strategy.SPOT:
        raise ValueError(f"{job.proto.name} does not run on Spot VMs (scheduling.strategy SPOT): only VM "
                         "maintenance (kind=\"maintenance\") can take its VMs away")
    if not replica.running():
        raise RuntimeError(f"{replica.name} is not running")
    replica.preempted = kind
    if hard:
        replica.kill_all()
        return
    replica.process.send_signal(signal.SIGTERM)
    attempt = replica.attempt

    def power_off() -> None:  # the VM's hard stop after the grace period
        if replica.attempt == attempt and replica.running():
            replica.kill_all()

    timer = threading.Timer(grace_s, power_off)
    timer.daemon = True
    timer.start()


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
