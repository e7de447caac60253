"""A small fake of the Vertex AI REST surface for custom jobs, and the stand-in for the trainer image.

The real google-cloud-aiplatform SDK talks to it over HTTP on a free loopback port:

    fake = FakeVertex(run_jobs=True)
    fake.register_image("us-central1-docker.pkg.dev/p/nli/trainer:0.1.0", python)   # the image's stand-in
    aiplatform.init(project="p", location="us-central1", api_endpoint=fake.endpoint, api_transport="rest",
                    staging_bucket="gs://bucket", credentials=AnonymousCredentials())

It serves create / get / list / cancel of `projects/*/locations/*/customJobs` (and of `hyperparameterTuningJobs`,
whose trials run as child custom jobs: tests/fake_vertex_tuning.py), parses every request body into the SDK's own
`aiplatform_v1.CustomJob` proto (so a field Vertex would not know is a 400, as on Vertex), and records every
request (`fake.requests`; unknown routes in `fake.unknown_requests`) for assertions. Enums arrive as integers and
int64 as strings (the SDK asks for `$alt=json;enum-encoding=int`).

With `run_jobs` it RUNS each job's training replicas as local processes, following the rules of
tests/fake_vertex_runner.py, each of which cites the Vertex AI page it models: the quota queue, the images a
python package may name, how pip treats the image's torch, success, preemption (`fake.preempt`), restarts after
non-zero exits, and `restart_job_on_worker_restart`. Every replica of workerpool0 (chief) and workerpool1
(workers) gets the variables Vertex sets: CLUSTER_SPEC (every replica's 127.0.0.1:PORT, its own task type and
index), node-level RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as the prebuilt PyTorch images set them, and
AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under base_output_dir. So a multi-worker job really
trains over torchrun across "nodes" on this machine (gloo on the CPU). Without `run_jobs`, jobs stay PENDING.

The trainer image's stand-in (`trainer_image_stand_in`) is what docker/Dockerfile builds, on this machine's
Python 3.11 (the Dockerfile's base is python:3.11): a venv with the torch constraints.txt pins (a CPU build here,
CUDA 12.8 in the image) and the sdist with its [smoke] extra under constraints.txt. It is cached by the sdist's
content, so it is built once and reused until the package changes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from google.cloud.aiplatform_v1.types import CustomJob, JobState

from nli_helpers import packaging
from tests import fake_vertex_runner as runner

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
JOB_TIMEOUT_S = runner.JOB_TIMEOUT_S
_COLLECTION = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs$")
_JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)(:cancel)?$")
_TERMINAL = runner.TERMINAL
# Environment a container would not have: the checkout on the path, the test venv, the developer's data.
_HOST_ONLY_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "NLI_REAL_DATA", "PYTHONHOME")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict | None


@dataclass
class FakeJob:
    proto: CustomJob
    request_body: dict
    log: str = ""
    replicas: dict[str, runner.Replica] = field(default_factory=dict)
    preemptions: int = 0
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


class FakeVertex:
    """A threaded HTTP server answering the customJobs REST calls; `endpoint` is what aiplatform.init takes."""

    def __init__(self, *, run_jobs: bool = False, gpu_quota: dict[str, int] | None = None,
                 grace_s: float = runner.SPOT_GRACE_S):
        self.run_jobs = run_jobs
        self.quota = runner.Quota(gpu_quota)
        self.grace_s = grace_s
        self.requests: list[Request] = []
        self.unknown_requests: list[Request] = []
        self.jobs: dict[str, FakeJob] = {}
        self.images: dict[str, Path] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def created_bodies(self) -> list[dict]:
        """The bodies of every create-custom-job request, as the SDK sent them."""
        return [r.body for r in self.requests if r.method == "POST" and _COLLECTION.match(r.path)]

    def register_image(self, image_uri: str, python: Path) -> None:
        """Let container jobs with this image run its ENTRYPOINT (or the spec's command) with this interpreter."""
        self.images[image_uri] = python

    def set_quota(self, accelerator_type: str, count: int) -> None:
        """Change the project's GPU quota (rule 1): queued jobs that now fit start."""
        self.quota.set(accelerator_type, count)

    def preempt(self, name: str, replica: str = "workerpool0-0", *, hard: bool = False,
                grace_s: float | None = None) -> None:
        """A maintenance event or Spot preemption of the VM under `replica` (rule 5)."""
        runner.preempt(self.jobs[name].replicas[replica], hard=hard, grace_s=self.grace_s if grace_s is None else grace_s)

    def replica_log(self, name: str, replica: str = "workerpool0-0") -> str:
        """What the replica's current attempt has printed so far."""
        found = self.jobs[name].replicas.get(replica)
        return found.log_text() if found else ""

    def wait(self, name: str, timeout: float = JOB_TIMEOUT_S) -> CustomJob:
        job = self.jobs[name]
        if not job.done.wait(timeout):
            raise TimeoutError(f"{name} still running after {timeout} s")
        return job.proto

    def close(self) -> None:
        for job in self.jobs.values():
            job.cancel_requested.set()
            for replica in job.replicas.values():
                replica.kill_all()
        with self.quota.changed:
            self.quota.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- the REST surface -----------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        self.requests.append(Request(method, path, query, body))
        if "/hyperparameterTuningJobs" in path:  # served (and trials run) by tests/fake_vertex_tuning.py
            from tests.fake_vertex_tuning import handle_tuning

            return handle_tuning(self, method, path, query, body)
        collection, job = _COLLECTION.match(path), _JOB.match(path)
        if collection and method == "POST":
            return self._create(collection.group(1), body or {})
        if collection and method == "GET":
            prefix = collection.group(1) + "/"
            with self._lock:
                return 200, {"customJobs": [self._json(j.proto, query) for n, j in self.jobs.items()
                                            if n.startswith(prefix)]}
        if job and job.group(1) in self.jobs:
            if method == "GET" and not job.group(2):
                with self._lock:
                    return 200, self._json(self.jobs[job.group(1)].proto, query)
            if method == "POST" and job.group(2):
                return self._cancel(self.jobs[job.group(1)])
        if job:
            return _error(404, "NOT_FOUND", f"{job.group(1)} not found")
        self.unknown_requests.append(self.requests[-1])
        return _error(404, "NOT_FOUND", f"the fake does not serve {method} {path}")

    def _create(self, parent: str, body: dict) -> tuple[int, dict]:
        try:
            proto = CustomJob.from_json(json.dumps(body))  # unknown fields raise, as on Vertex
        except Exception as err:  # noqa: BLE001 - the parser's message is the 400's message
            return _error(400, "INVALID_ARGUMENT", f"invalid CustomJob: {err}")
        problem = server_side_problem(proto)
        if problem:
            return _error(400, "INVALID_ARGUMENT", problem)
        proto.name = f"{parent}/customJobs/{next(self._ids)}"
        proto.state, proto.create_time, proto.update_time = JobState.JOB_STATE_PENDING, runner.now(), runner.now()
        job = self.jobs[proto.name] = FakeJob(proto, body)
        if self.run_jobs:
            threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return 200, self._json(proto, {})

    def _cancel(self, job: FakeJob) -> tuple[int, dict]:
        with self._lock:
            if job.proto.state in _TERMINAL:
                return _error(400, "FAILED_PRECONDITION", f"{job.proto.name} has already ended")
            job.cancel_requested.set()
            if not job.started.is_set():
                self._finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            else:
                job.proto.state = JobState.JOB_STATE_CANCELLING
        with self.quota.changed:
            self.quota.changed.notify_all()
        return 200, {}

    @staticmethod
    def _json(proto: CustomJob, query: dict) -> dict:
        ints = "enum-encoding=int" in ";".join(query.get("$alt", []))
        return json.loads(CustomJob.to_json(proto, use_integers_for_enums=ints))

    # -- running a job --------------------------------------------------------------------------------------
    def _run(self, job: FakeJob) -> None:
        """Queue, prepare and supervise the job to its end (rules 1-7); used for trials too."""
        need = runner.gpus_needed(job.proto)
        with self.quota.changed:
            while not self.quota.fits(need) and not job.cancel_requested.is_set():
                if job.proto.state == JobState.JOB_STATE_PENDING:
                    job.proto.state = JobState.JOB_STATE_QUEUED  # rule 1
                    job.note(f"queued: the job needs {dict(need)} GPUs, the quota leaves "
                             f"{ {g: self.quota.limits.get(g, 0) - self.quota.in_use[g] for g in need} }")
                self.quota.changed.wait(0.5)
            if job.cancel_requested.is_set():
                return
            self.quota.in_use += need
        workdir = Path(tempfile.mkdtemp(prefix="fake-vertex-job-"))
        try:
            state, message = self._prepare_and_supervise(job, workdir)
        except Exception as err:  # noqa: BLE001 - whatever breaks, the job must end FAILED with the reason
            state, message = JobState.JOB_STATE_FAILED, f"{type(err).__name__}: {err}"
        finally:
            self.quota.release(need)
            for replica in job.replicas.values():
                replica.kill_all()
                for attempt in range(1, replica.attempt + 1):
                    label = replica.name if attempt == 1 else f"{replica.name} attempt {attempt}"
                    job.log += "".join(f"[{label}] {line}" for line in
                                       replica.log_text(attempt).splitlines(keepends=True))
            shutil.rmtree(workdir, ignore_errors=True)
        with self._lock:
            self._finish(job, state, message)

    def _prepare_and_supervise(self, job: FakeJob, workdir: Path) -> tuple[JobState, str]:
        pools = job.proto.job_spec.worker_pool_specs
        for i, pool in enumerate(pools[2:], start=2):
            image = pool.container_spec.image_uri or pool.python_package_spec.executor_image_uri
            job.note(f"workerpool{i}: {pool.replica_count} replica(s) of {image} accepted, not started (Reduction "
                     "Server serves NCCL between GPUs; the local replicas use gloo)")
        hosts = {name: f"127.0.0.1:{free_port()}" for name in replica_names(job.proto)}
        for i, pool in enumerate(pools[:2]):
            if not pool.replica_count:
                continue
            found = self._command(job, pool, workdir)
            if isinstance(found, str):
                return JobState.JOB_STATE_FAILED, found
            (kind, command, spec_env) = found
            for index in range(pool.replica_count):
                name = f"workerpool{i}-{index}"
                job.replicas[name] = runner.Replica(name, kind, command, self._job_env(job, spec_env, name, hosts),
                                                    workdir)
        with self._lock:
            if job.cancel_requested.is_set():
                return JobState.JOB_STATE_CANCELLED, "cancelled by the user"
            job.proto.state, job.proto.start_time = JobState.JOB_STATE_RUNNING, runner.now()
        restart_all = job.proto.job_spec.scheduling.restart_job_on_worker_restart
        replicas = list(job.replicas.values())
        for attempt in range(1, runner.MAX_JOB_RETRIES + 2):
            job.started.set()
            outcome, message = runner.supervise(job, replicas, restart_whole_job=restart_all, grace_s=self.grace_s)
            if outcome != runner.Outcome.RETRY_JOB or attempt > runner.MAX_JOB_RETRIES:
                break
            job.note(f"{message}: retrying the whole job ({attempt} of {runner.MAX_JOB_RETRIES})")
            for replica in replicas:
                replica.restarts = 0
        states = {runner.Outcome.SUCCEEDED: JobState.JOB_STATE_SUCCEEDED,
                  runner.Outcome.CANCELLED: JobState.JOB_STATE_CANCELLED}
        return states.get(outcome, JobState.JOB_STATE_FAILED), message

    def _command(self, job: FakeJob, pool, workdir: Path) -> tuple[str, list[str], list[dict]] | str:
        """(kind, the command one replica of this pool runs, the pool's env), or why it cannot run."""
        if "python_package_spec" in pool:
            spec = pool.python_package_spec
            torch_version, python_version = runner.published_image(spec.executor_image_uri)  # checked on create
            for uri in spec.package_uris:
                sdist = self._download(uri, workdir)
                keeps, wanted = runner.pip_keeps_torch(sdist, torch_version)
                job.note(f"pip install {uri} on {spec.executor_image_uri} (torch {torch_version}, Python "
                         f"{python_version}): the package asks for {wanted}")
                if not keeps:
                    return (f"installing {uri.rsplit('/', 1)[-1]}: pip would replace the image's torch {torch_version} "
                            f"with the newest torch on PyPI that satisfies {wanted}, a CUDA build of several GB "
                            "that is not the image's CUDA, on every replica at every start (the fake stops here; "
                            "preflight refuses this image before anything is created)")
            return (f"the fake has no environment with torch {torch_version} and Python {python_version} to run "
                    f"{spec.executor_image_uri} in")
        spec = pool.container_spec
        if spec.image_uri not in self.images:
            return f"cannot pull image {spec.image_uri}: not registered with the fake (nothing pushed there)"
        entry = list(spec.command) or runner.DEFAULT_ENTRYPOINT
        if entry[0] not in ("python", "python3"):
            return f"the fake runs only `python ...` commands in {spec.image_uri}, not {entry}"
        command = [str(self.images[spec.image_uri]), *entry[1:], *spec.args]
        return "container_spec", command, [{"name": e.name, "value": e.value} for e in spec.env]

    @staticmethod
    def _download(uri: str, workdir: Path) -> Path:
        from nli_helpers import storage

        return storage.download(uri, workdir / uri.rsplit("/", 1)[-1])

    def _job_env(self, job: FakeJob, spec_env: list[dict], replica: str, hosts: dict[str, str]) -> dict[str, str]:
        base = job.proto.job_spec.base_output_directory.output_uri_prefix.rstrip("/")
        env = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/", CLOUD_ML_JOB_ID=job.proto.name.rsplit("/", 1)[-1],
                   CLOUD_ML_PROJECT_ID=job.proto.name.split("/")[1], HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",  # several replicas share this machine's few cores
                   # Not Vertex's: the replicas run on this CPU whatever GPUs the job asked for, so the trainer is
                   # told to accept that (its --allow-cpu), instead of refusing a GPU job without a GPU.
                   NLI_ALLOW_CPU="1")
        env.update(vertex_env(job.proto, replica, hosts))
        env.update({e["name"]: e["value"] for e in spec_env})
        return env

    def _finish(self, job: FakeJob, state: JobState, message: str = "") -> None:
        if job.proto.state in _TERMINAL:
            return
        job.proto.state, job.proto.end_time, job.proto.update_time = state, runner.now(), runner.now()
        if message and state != JobState.JOB_STATE_SUCCEEDED:
            job.proto.error = {"code": 1 if state == JobState.JOB_STATE_CANCELLED else 3, "message": message}
        job.done.set()


# -- what Vertex checks on create, and tells each replica about the cluster ----------------------------------------
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
        if image is not None and runner.published_image(image) is None:  # rule 2
            return (f"workerpool{i}: executor_image_uri {image} is not a prebuilt training image with the :latest "
                    "tag (PythonPackageSpec: \"You must use an image from this list\")")
    bad = [k for k in proto.labels if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)]
    return f"invalid label keys: {bad}" if bad else None


def replica_names(proto: CustomJob) -> list[str]:
    """Every replica of the job, as Vertex names them: workerpool0-0, workerpool1-0, workerpool1-1, ..."""
    return [f"workerpool{i}-{index}" for i, pool in enumerate(proto.job_spec.worker_pool_specs)
            for index in range(pool.replica_count)]


def cluster_spec(proto: CustomJob, replica: str, hosts: dict[str, str]) -> str:
    """The CLUSTER_SPEC Vertex sets on `replica` (e.g. "workerpool1-0"); `hosts` maps each replica to host:port."""
    cluster: dict[str, list[str]] = {}
    for name in replica_names(proto):
        cluster.setdefault(name.rsplit("-", 1)[0], []).append(hosts[name])
    pool, index = replica.rsplit("-", 1)
    # "job": the CustomJobSpec the job was created with, as a dictionary (enum names, snake_case fields).
    job = type(proto.job_spec).to_dict(proto.job_spec, use_integers_for_enums=False)
    return json.dumps({"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": int(index)},
                       "job": job})


def vertex_env(proto: CustomJob, replica: str, hosts: dict[str, str]) -> dict[str, str]:
    """CLUSTER_SPEC, and the node-level variables Vertex's prebuilt PyTorch images add: RANK is the replica's node
    rank and WORLD_SIZE the number of training nodes (not processes: the trap nli_helpers.launch avoids)."""
    training = [n for n in replica_names(proto) if n.startswith(("workerpool0-", "workerpool1-"))]
    chief_host, _, chief_port = hosts["workerpool0-0"].rpartition(":")
    env = {"CLUSTER_SPEC": cluster_spec(proto, replica, hosts), "MASTER_ADDR": chief_host, "MASTER_PORT": chief_port,
           "WORLD_SIZE": str(len(training))}
    if replica in training:
        env["RANK"] = str(training.index(replica))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def _handler_for(fake: FakeVertex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, payload = fake.handle(self.command, url.path, parse_qs(url.query), json.loads(raw) if raw else None)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

    return Handler


# -- the trainer image's stand-in: docker/Dockerfile's packages in a venv, cached by the sdist's content ------------
VENV_LOCK = threading.RLock()
_SESSION_CACHE: dict[str, Path] = {}


def cache_root() -> Path:
    return Path(os.environ.get("NLI_CACHE_DIR") or Path.home() / ".cache" / "nli-helpers")


def sdist_digest(sdist: Path, *extra: bytes) -> str:
    """A hash of the sdist's files (names and bytes, not their timestamps) and of `extra`."""
    digest = hashlib.sha256()
    with tarfile.open(sdist) as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            digest.update(member.name.split("/", 1)[-1].encode() + b"\0" + tar.extractfile(member).read())
    for part in extra:
        digest.update(part)
    return digest.hexdigest()[:16]


def trainer_image_stand_in(sdist: Path) -> Path:
    """The python of a venv built as docker/Dockerfile builds the image (torch pin, then `.[smoke]` under
    constraints.txt), from this sdist; reused while the sdist's content and the constraints stay the same."""
    key = sdist_digest(sdist, CONSTRAINTS.read_bytes(), sys.version.encode())
    folder = cache_root() / "trainer-image" / key
    with VENV_LOCK:
        if not (folder / ".complete").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
            python = packaging.make_container_venv(folder / "venv", constraints=CONSTRAINTS)
            packaging.install_sdist(python, sdist, extras="smoke", constraints=CONSTRAINTS)
            (folder / ".complete").write_text(str(sdist.name) + "\n")
    return folder / "venv" / "bin" / "python"


def session_sdist(folder: Callable[[], Path]) -> Path:
    """The project's sdist, built once per process (in `folder()`) with nli_helpers.vertex.build_sdist."""
    from nli_helpers.vertex import build_sdist

    with VENV_LOCK:
        if "sdist" not in _SESSION_CACHE:
            _SESSION_CACHE["sdist"] = build_sdist(folder())
    return _SESSION_CACHE["sdist"]


@pytest.fixture(scope="session")
def sdist_path(tmp_path_factory) -> Path:
    """The project's sdist, built once per session with nli_helpers.vertex.build_sdist."""
    return session_sdist(lambda: tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def trainer_image_python(sdist_path) -> Path:
    """The stand-in of the image docker/Dockerfile builds (see `trainer_image_stand_in`)."""
    return trainer_image_stand_in(sdist_path)


@pytest.fixture
def fake_vertex(gcs_emulator) -> Iterator[FakeVertex]:
    """A fake that accepts jobs and keeps them pending (no training runs)."""
    fake = FakeVertex()
    yield fake
    fake.close()


@pytest.fixture
def make_fake_vertex(gcs_emulator) -> Iterator[Callable[..., FakeVertex]]:
    """FakeVertex(**kwargs) for tests that need another set-up; each is closed after the test."""
    fakes: list[FakeVertex] = []

    def make(**kwargs) -> FakeVertex:
        fakes.append(FakeVertex(**kwargs))
        return fakes[-1]

    yield make
    for fake in fakes:
        fake.close()


@pytest.fixture
def fake_vertex_runner(make_fake_vertex, trainer_image_python) -> FakeVertex:
    """A fake that runs jobs, with the trainer image registered under TRAINER_IMAGE."""
    fake = make_fake_vertex(run_jobs=True)
    fake.register_image(TRAINER_IMAGE, trainer_image_python)
    return fake


TRAINER_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/trainer:test"


# -- the whole local cloud, for notebooks: emulator + fake + the environment that points at them ------------------
class LocalCloud:
    """The Cloud Storage emulator and a job-running Vertex fake, with the environment variables pointing at them.

    What notebooks 04 and 05 read: STORAGE_EMULATOR_HOST (nli_helpers.storage), NLI_VERTEX_API_ENDPOINT
    (vertex.init_vertex), GOOGLE_CLOUD_PROJECT and NLI_STAGING_BUCKET. The trainer image the notebooks use by
    default (vertex.trainer_image_uri(project, region) for us-central1) is registered, backed by its stand-in.
    Used by notebooks/conftest.py under nbval, and from a shell for papermill:

        python -m tests.fake_vertex -- papermill notebooks/04_submit_vertex.ipynb runs/04.ipynb -f notebooks/params/smoke.yaml
    """

    project = "nli-notebooks-ci"
    bucket = "nli-notebooks-ci-staging"
    region = "us-central1"

    def __init__(self) -> None:
        import logging

        from nli_helpers.storage import get_client
        from nli_helpers.vertex import API_ENDPOINT_ENV, trainer_image_uri
        from tests.gcs_emulator import EMULATOR_ENV, GcsEmulator, _start_on_free_port

        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)  # a warning per JSON response
        self.tmp = Path(tempfile.mkdtemp(prefix="nli-local-cloud-"))
        server, port = _start_on_free_port()
        self.emulator = GcsEmulator(host=f"http://127.0.0.1:{port}", server=server)
        self.emulator.make_bucket(self.bucket)
        self.fake = FakeVertex(run_jobs=True)
        self.image_uri = trainer_image_uri(self.project, self.region)
        self.fake.register_image(self.image_uri, trainer_image_stand_in(session_sdist(lambda: self.tmp / "dist")))
        self.env = {**EMULATOR_ENV, "STORAGE_EMULATOR_HOST": self.emulator.host, API_ENDPOINT_ENV: self.fake.endpoint,
                    "GOOGLE_CLOUD_PROJECT": self.project, "NLI_STAGING_BUCKET": f"gs://{self.bucket}"}
        self._saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)  # the fake's jobs and this process's storage client read them too
        self._clear_clients = get_client.cache_clear
        self._clear_clients()

    def stop(self) -> None:
        """Stop both servers and restore the environment. The image stand-in stays cached for the next run."""
        self.fake.close()
        self.emulator.server.stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._clear_clients()


def main(argv: list[str]) -> int:
    """`python -m tests.fake_vertex -- COMMAND...`: run COMMAND with the local cloud up and its variables set."""
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(main.__doc__)
        return 2
    cloud = LocalCloud()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return subprocess.run(command, env=os.environ.copy()).returncode
    finally:
        signal.signal(signal.SIGTERM, previous)
        cloud.stop()
        shutil.rmtree(cloud.tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
