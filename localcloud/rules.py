"""How the fake of Vertex AI (localcloud/vertex.py) runs a custom job, rule by rule as Vertex AI documents it.

Every rule below cites the page it models. The pages (read 2026-11-22/23; Google now also files them under
"Gemini Enterprise Agent Platform", same API):

* TRAINING_SERVICE: https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service
* PREBUILT: https://docs.cloud.google.com/vertex-ai/docs/training/pre-built-containers
* PACKAGE_SPEC: https://docs.cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec#PythonPackageSpec
* SCHEDULING: https://docs.cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec#Scheduling
* SPOT: https://docs.cloud.google.com/vertex-ai/docs/training/use-spot-vms
* SPOT_VM: https://cloud.google.com/compute/docs/instances/spot (the preemption process)

The rules:

1. Queue (TRAINING_SERVICE, "Queue a new job"): a job whose GPUs exceed the project's remaining custom-training
   quota stays JOB_STATE_QUEUED until quota frees up (`FakeVertex(gpu_quota={"NVIDIA_L4": 0})`, `set_quota`).
2. Images. A python-package pool must name a prebuilt training image (PACKAGE_SPEC: "You must use an image from
   this list"; only `:latest` tags, PREBUILT): anything else is refused on create, with a 400. A container pool
   runs an image registered with `register_image(uri, python)`; an unknown image fails the job (the pull fails).
3. Installing a python package. Vertex installs the staged packages into the image and then runs the module
   (PACKAGE_SPEC: "The Python module name to run after installing the packages"); pip keeps an installed
   distribution that satisfies a requirement and replaces one that does not. The fake reads the sdist's own
   Requires-Dist (its ranges, never this repository's pins) against the image's torch (PREBUILT). When pip would
   replace the image's torch, the fake fails the job there, saying so: on Vertex pip would download the newest
   torch from PyPI (a CUDA build of several GB, not the image's CUDA) on every replica at every start, which the
   fake does not do. None of the published images (torch <= 2.4) suits this package (torch >= 2.6), and the fake
   has no environment holding their torch, so a python-package job never trains here.
4. Success (TRAINING_SERVICE): "A training job completes successfully when its primary replica exits with exit
   code 0. At that point, Vertex AI shuts down all the other running workers."
5. Preemption and maintenance (TRAINING_SERVICE, "Restart workers"; SPOT; SPOT_VM): `preempt(job, replica)`
   sends SIGTERM to the replica's first process (what a container stop does), and after the grace period
   (30 s for a Spot VM, SPOT_VM) SIGKILLs everything left; `hard=True` kills at once. The worker is then restarted
   with the same hostname, command and environment ("starts running your code again from its start"), up to six
   times a job (SPOT: "Compute Engine tries to restart the job up to six times").
6. Non-zero exits (TRAINING_SERVICE, "Handle common errors"): a user-code exit is permanent and ends the job
   FAILED with "The replica REPLICA exited with a non-zero status of CODE", except the exit codes Vertex calls
   possibly transient, SIGABRT and SIGSEGV (134 and 139 in a custom container, 6 and 11 from a prebuilt image):
   the worker is restarted in place, up to five restarts a worker, then the whole job up to three times.
7. `restart_job_on_worker_restart` (SCHEDULING): "Restarts the entire CustomJob if a worker gets restarted": every
   training replica is stopped (SIGTERM, grace, SIGKILL) and started again.

Deliberately not modelled: Reduction Server pools (Google's image, which serves NCCL between GPUs) are accepted
and noted in the job log, not started; machine specs are recorded, not honoured (everything runs on this CPU);
the whole-job retry of a stockout or internal error.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from google.cloud.aiplatform_v1.types import AcceleratorType, CustomJob, JobState

from nli_helpers import packaging

# Rule 2: the PyTorch rows of the prebuilt training images table (PREBUILT, read 2026-11-22): name -> (torch, Python).
PUBLISHED_PYTORCH_IMAGES = {
    "pytorch-gpu.2-4.py310": ("2.4.1", "3.10"), "pytorch-xla.2-4.py310": ("2.4.1", "3.10"),
    "pytorch-gpu.2-3.py310": ("2.3.1", "3.10"), "pytorch-xla.2-3.py310": ("2.3.1", "3.10"),
    "pytorch-gpu.2-2.py310": ("2.2.2", "3.10"), "pytorch-xla.2-2.py310": ("2.2.2", "3.10"),
    "pytorch-gpu.2-1.py310": ("2.1.2", "3.10"), "pytorch-xla.2-1.py310": ("2.1.2", "3.10"),
}
PREBUILT_HOSTS = ("us-docker.pkg.dev", "europe-docker.pkg.dev", "asia-docker.pkg.dev")
DEFAULT_ENTRYPOINT = ["python", "-m", "nli_helpers.task"]  # docker/Dockerfile's ENTRYPOINT
TRANSIENT_EXIT_CODES = {"container_spec": {134, 139}, "python_package_spec": {6, 11}}  # rule 6
MAX_WORKER_RESTARTS, MAX_JOB_RETRIES, MAX_PREEMPTIONS = 5, 3, 6  # rules 5 and 6
SPOT_GRACE_S = 30.0  # rule 5
JOB_TIMEOUT_S = 900
TERMINAL = {JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED}


def published_image(uri: str) -> tuple[str, str] | None:
    """(torch version, Python version) of a prebuilt training image URI, or None if it is not one (rule 2)."""
    host, _, path = uri.partition("/")
    name, _, tag = path.removeprefix("vertex-ai/training/").partition(":")
    if host not in PREBUILT_HOSTS or not path.startswith("vertex-ai/training/") or tag != "latest":
        return None
    return PUBLISHED_PYTORCH_IMAGES.get(name)


def pip_keeps_torch(sdist: Path, image_torch: str) -> tuple[bool, str]:
    """Rule 3: would `pip install SDIST` keep the image's torch? And the sdist's torch requirement, as text."""
    torch = next((r for r in packaging.sdist_requirements(sdist) if r.name == "torch"), None)
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
    bad = [k for k in proto.labels if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)]
    return f"invalid label keys: {bad}" if bad else None



def api_error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}



# -- a job and its replicas -----------------------------------------------------------------------------------------
@dataclass
class FakeJob:
    proto: CustomJob
    request_body: dict
    log: str = ""
    replicas: dict[str, Replica] = field(default_factory=dict)
    preemptions: int = 0
    cpu_replicas: int = 0  # its training replicas, while they hold a share of this machine's cores
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



# -- a replica: one "container" -------------------------------------------------------------------------------------
@dataclass
class Replica:
    name: str  # workerpool0-0, workerpool1-0, ...
    kind: str  # "container_spec" or "python_package_spec"
    command: list[str]
    env: dict[str, str]
    workdir: Path
    attempt: int = 0
    process: subprocess.Popen | None = None
    preempted: bool = False
    restarts: int = 0
    finished: bool = False  # exited 0
    logs: list[Path] = field(default_factory=list)

    @property
    def primary(self) -> bool:
        return self.name == "workerpool0-0"

    def start(self) -> None:
        self.attempt, self.preempted, self.finished = self.attempt + 1, False, False
        (self.workdir / self.name).mkdir(parents=True, exist_ok=True)
        self.logs.append(self.workdir / f"{self.name}.attempt-{self.attempt}.log")
        with open(self.logs[-1], "w") as log:
            # Its own session: the replica's processes form one group, as a container's do.
            self.process = subprocess.Popen(self.command, cwd=self.workdir / self.name, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill_all(self) -> None:
        """SIGKILL every process of the replica (what tearing a container down does)."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the first process, then SIGKILL to all after `grace_s` (a container stop)."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()

    def log_text(self, attempt: int | None = None) -> str:
        path = self.logs[(attempt or self.attempt) - 1] if self.logs else None
        return path.read_text(errors="replace") if path and path.exists() else ""


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


# -- supervising the replicas (rules 4-7) --------------------------------------------------------------------------
class Outcome:
    SUCCEEDED, FAILED, CANCELLED, RETRY_JOB = "succeeded", "failed", "cancelled", "retry job"


def supervise(job, replicas: list[Replica], *, restart_whole_job: bool, grace_s: float,
              timeout_s: float = JOB_TIMEOUT_S) -> tuple[str, str]:
    """Start every replica and apply rules 4-7 until the job ends; returns (Outcome, message)."""
    for replica in replicas:
        replica.start()
    deadline = time.monotonic() + timeout_s
    while True:
        if job.cancel_requested.is_set():
            _stop(replicas, grace_s)
            return Outcome.CANCELLED, "cancelled by the user"
        if time.monotonic() > deadline:
            _stop(replicas, 0)
            return Outcome.FAILED, f"the fake's job timeout ({timeout_s:g} s) passed"
        # A preempted replica first: its restart (of the whole job, with rule 7) comes before the errors its
        # peers then run into, as on Vertex, where the VM event starts the restart. So while a preempted replica is
        # still stopping (or being reaped: Popen.poll() answers None while another thread waits on it), the exits
        # of its peers wait for it.
        if any(r.preempted and r.running() for r in replicas):
            time.sleep(0.1)
            continue
        for replica in sorted(replicas, key=lambda r: not r.preempted):
            code = replica.process.poll() if replica.process and not replica.finished else None
            if code is None:
                continue
            replica.kill_all()  # the container is gone with its first process
            if code == 0:
                replica.finished = True
                if replica.primary:  # rule 4
                    _stop([r for r in replicas if r is not replica], grace_s)
                    return Outcome.SUCCEEDED, ""
                continue
            if replica.preempted:  # rule 5
                job.preemptions += 1
                if job.preemptions > MAX_PREEMPTIONS:
                    _stop(replicas, grace_s)
                    return Outcome.FAILED, f"{replica.name} was preempted {job.preemptions} times"
                why = "preempted: restarted on another VM with the same hostname"
            elif code in TRANSIENT_EXIT_CODES[replica.kind]:  # rule 6
                replica.restarts += 1
                if replica.restarts > MAX_WORKER_RESTARTS:
                    _stop(replicas, grace_s)
                    return Outcome.RETRY_JOB, f"{replica.name} exited {code} after {MAX_WORKER_RESTARTS} restarts"
                why = f"exited {code} (possibly transient): restarted in place"
            else:
                _stop(replicas, grace_s)
                tail = "\n".join(replica.log_text().strip().splitlines()[-5:])
                return Outcome.FAILED, (f"The replica {replica.name} exited with a non-zero status of {code}. "
                                        f"Termination reason: Error. Last lines:\n{tail}")
            if restart_whole_job:  # rule 7
                job.note(f"{replica.name} {why}; restart_job_on_worker_restart: restarting every replica")
                _stop(replicas, grace_s)
                for other in replicas:
                    other.start()
            else:
                job.note(f"{replica.name} {why}")
                replica.start()
        time.sleep(0.1)


def _stop(replicas: list[Replica], grace_s: float) -> None:
    for replica in replicas:
        if replica.running():
            replica.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for replica in replicas:
        if replica.process is not None:
            try:
                replica.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            replica.kill_all()


def preempt(replica: Replica, *, hard: bool, grace_s: float) -> None:
    """Rule 5: a maintenance event or a Spot preemption of the VM under `replica`."""
    if not replica.running():
        raise RuntimeError(f"{replica.name} is not running")
    replica.preempted = True
    if hard:
        replica.kill_all()
        return
    replica.process.send_signal(signal.SIGTERM)
    attempt = replica.attempt

    def power_off() -> None:  # the Spot VM's hard stop after the grace period
        if replica.attempt == attempt and replica.running():
            replica.kill_all()

    timer = threading.Timer(grace_s, power_off)
    timer.daemon = True
    timer.start()


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
