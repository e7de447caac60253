"""A small fake of the Vertex AI REST surface for custom jobs, and the stand-in for Vertex's training container.

The real google-cloud-aiplatform SDK talks to it over HTTP on a free loopback port:

    fake = FakeVertex(container_python=...)        # or the fixtures below
    aiplatform.init(project="p", location="us-central1", api_endpoint=fake.endpoint, api_transport="rest",
                    staging_bucket="gs://bucket", credentials=AnonymousCredentials())

It serves create / get / list / cancel of `projects/*/locations/*/customJobs` (and of `hyperparameterTuningJobs`,
whose trials run as child custom jobs: tests/fake_vertex_tuning.py), parses every request body into
the SDK's own `aiplatform_v1.CustomJob` proto (so a field Vertex would not know is a 400, as on Vertex), and
records every request (`fake.requests`; unknown routes in `fake.unknown_requests`) for assertions. Enums arrive
as integers and int64 as strings (the SDK asks for `$alt=json;enum-encoding=int`).

With `container_python` (a venv holding only torch, as Vertex's prebuilt PyTorch image does) it RUNS the job's
training replicas as local processes: a python-package pool downloads the staged sdist from Cloud Storage (the
emulator), pip-installs it as Vertex does, and runs `python -m <module> <args>`; a container pool runs an image
registered with `fake.register_image(uri, python)`: its ENTRYPOINT `python -m nli_helpers.task`, or the spec's
`command` (e.g. `python -m nli_helpers.launch`). Every replica of workerpool0 (chief) and workerpool1 (workers)
runs, each with the variables Vertex sets: CLUSTER_SPEC (every replica's 127.0.0.1:PORT, its own task type and
index), node-level RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as the prebuilt PyTorch images set them, and
AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under base_output_dir. So a multi-worker job really
trains over torchrun across "nodes" on this machine (gloo on the CPU). The job goes PENDING -> RUNNING ->
SUCCEEDED, or FAILED as soon as one replica fails (the others are stopped). Without it, jobs stay PENDING (queued)
until cancelled.

Differences from Vertex, on purpose: pools from workerpool2 on (Reduction Server: Google's image, which only
serves NCCL between GPUs) are accepted and reported in the job log but not started; all replicas share one
container venv and one pip install; pip installs under constraints.txt (the build machines are offline but for
PyPI, and this keeps the run reproducible); machine specs are recorded, not honoured (everything runs on the CPU).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from google.cloud.aiplatform_v1.types import CustomJob, JobState

from nli_helpers import packaging

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
JOB_TIMEOUT_S = 900
_COLLECTION = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs$")
_JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)(:cancel)?$")
_TERMINAL = {JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED}
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
    processes: list[subprocess.Popen] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.processes if p.poll() is None]


class FakeVertex:
    """A threaded HTTP server answering the customJobs REST calls; `endpoint` is what aiplatform.init takes."""

    def __init__(self, container_python: Path | None = None, *, run_jobs: bool | None = None,
                 constraints: Path = CONSTRAINTS):
        self.container_python = container_python
        self.run_jobs = container_python is not None if run_jobs is None else run_jobs
        self.constraints = constraints
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
        """Let container jobs with this image run `python -m nli_helpers.task` with this interpreter."""
        self.images[image_uri] = python

    def wait(self, name: str, timeout: float = JOB_TIMEOUT_S) -> CustomJob:
        job = self.jobs[name]
        if not job.done.wait(timeout):
            raise TimeoutError(f"{name} still running after {timeout} s")
        return job.proto

    def close(self) -> None:
        for job in self.jobs.values():
            for process in job.running():
                process.kill()
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
            return 200, {"customJobs": [self._json(j.proto, query) for n, j in self.jobs.items() if n.startswith(prefix)]}
        if job and job.group(1) in self.jobs:
            if method == "GET" and not job.group(2):
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
        problem = _server_side_problem(proto)
        if problem:
            return _error(400, "INVALID_ARGUMENT", problem)
        now = dt.datetime.now(dt.timezone.utc)
        proto.name = f"{parent}/customJobs/{next(self._ids)}"
        proto.state, proto.create_time, proto.update_time = JobState.JOB_STATE_PENDING, now, now
        job = self.jobs[proto.name] = FakeJob(proto, body)
        if self.run_jobs:
            threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return 200, self._json(proto, {})

    def _cancel(self, job: FakeJob) -> tuple[int, dict]:
        with self._lock:
            if job.proto.state in _TERMINAL:
                return _error(400, "FAILED_PRECONDITION", f"{job.proto.name} has already ended")
            if not job.processes:
                self._finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            else:
                job.proto.state = JobState.JOB_STATE_CANCELLING
                for process in job.running():
                    process.terminate()
        return 200, {}

    @staticmethod
    def _json(proto: CustomJob, query: dict) -> dict:
        ints = "enum-encoding=int" in ";".join(query.get("$alt", []))
        return json.loads(CustomJob.to_json(proto, use_integers_for_enums=ints))

    # -- running the training replicas ---------------------------------------------------------------------
    def _run(self, job: FakeJob) -> None:
        with self._lock:
            if job.proto.state != JobState.JOB_STATE_PENDING:
                return
            job.proto.state, job.proto.start_time = JobState.JOB_STATE_RUNNING, dt.datetime.now(dt.timezone.utc)
        workdir = Path(tempfile.mkdtemp(prefix="fake-vertex-job-"))
        try:
            code, message = self._run_replicas(job, workdir)
        except Exception as err:  # noqa: BLE001 - whatever breaks, the job must end FAILED with the reason
            code, message = 1, f"{type(err).__name__}: {err}"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        with self._lock:
            if job.proto.state == JobState.JOB_STATE_CANCELLED:  # cancelled before its processes started
                return
            if job.proto.state == JobState.JOB_STATE_CANCELLING:
                self._finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            elif code == 0:
                self._finish(job, JobState.JOB_STATE_SUCCEEDED)
            else:
                self._finish(job, JobState.JOB_STATE_FAILED, message)

    def _run_replicas(self, job: FakeJob, workdir: Path) -> tuple[int, str]:
        pools = job.proto.job_spec.worker_pool_specs
        for i, pool in enumerate(pools[2:], start=2):
            image = pool.container_spec.image_uri or pool.python_package_spec.executor_image_uri
            job.log += (f"[fake] workerpool{i}: {pool.replica_count} replica(s) of {image} accepted, not started "
                        "(Reduction Server serves NCCL between GPUs; the local replicas use gloo)\n")
        commands, env_lists, installed = {}, {}, set()
        for i, pool in enumerate(pools[:2]):
            if pool.replica_count:
                found = self._command(job, pool, workdir, installed)
                if isinstance(found, str):
                    return 1, found
                commands[i], env_lists[i] = found
        hosts = {name: f"127.0.0.1:{free_port()}" for name in replica_names(job.proto)}
        replicas = [(i, index) for i in commands for index in range(pools[i].replica_count)]
        logs = []
        with self._lock:
            if job.proto.state != JobState.JOB_STATE_RUNNING:  # cancelled while installing
                return 1, "cancelled"
            for i, index in replicas:
                name = f"workerpool{i}-{index}"
                (workdir / name).mkdir()
                logs.append((name, open(workdir / name / "replica.log", "w+")))  # noqa: SIM115 - closed below
                env = self._job_env(job, env_lists[i], name, hosts)
                job.processes.append(subprocess.Popen(commands[i], cwd=workdir / name, env=env, stdout=logs[-1][1],
                                                      stderr=subprocess.STDOUT, text=True))
        failed = _wait_all(job.processes, JOB_TIMEOUT_S)
        texts = []
        for name, log in logs:
            log.seek(0)
            texts.append(log.read())
            log.close()
            job.log += "".join(f"[{name}] {line}" for line in texts[-1].splitlines(keepends=True))
        if failed is None:
            return 0, ""
        code, tail = job.processes[failed].returncode, "\n".join(texts[failed].strip().splitlines()[-5:])
        return code, f"The replica {logs[failed][0]} exited with a non-zero status of {code}. Last lines:\n{tail}"

    def _command(self, job: FakeJob, pool, workdir: Path, installed: set[str]) -> tuple[list[str], list[dict]] | str:
        """The command one replica of this pool runs, and the pool's env; or why it cannot run."""
        if "python_package_spec" in pool:
            spec = pool.python_package_spec
            python = self.container_python
            if python is None:
                return "this fake has no container venv to run python packages in"
            for uri in set(spec.package_uris) - installed:  # every replica shares the one container venv
                job.log += f"[fake] pip install {uri}\n"
                self._pip_install(job, self._download(uri, workdir))
                installed.add(uri)
            command = [str(python), "-m", spec.python_module, *spec.args]
        elif pool.container_spec.image_uri in self.images:
            spec = pool.container_spec
            python = self.images[spec.image_uri]
            entry = list(spec.command) or ["python", "-m", "nli_helpers.task"]
            if entry[0] not in ("python", "python3"):
                return f"the fake runs only `python ...` commands in {spec.image_uri}, not {entry}"
            command = [str(python), *entry[1:], *spec.args]
        else:
            return f"cannot pull image {pool.container_spec.image_uri}: not registered with the fake"
        return command, [{"name": e.name, "value": e.value} for e in spec.env]

    @staticmethod
    def _download(uri: str, workdir: Path) -> Path:
        from nli_helpers import storage

        return storage.download(uri, workdir / uri.rsplit("/", 1)[-1])

    def _pip_install(self, job: FakeJob, package: Path) -> None:
        # As Vertex does: install the staged package (no extras) into the container's Python.
        with VENV_LOCK:
            report = packaging.install_sdist(self.container_python, package, constraints=self.constraints)
        job.log += f"[fake] {report}\n[fake] Successfully installed {' '.join(report.installed)}\n"

    def _job_env(self, job: FakeJob, spec_env: list[dict], replica: str, hosts: dict[str, str]) -> dict[str, str]:
        base = job.proto.job_spec.base_output_directory.output_uri_prefix.rstrip("/")
        env = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/", CLOUD_ML_JOB_ID=job.proto.name.rsplit("/", 1)[-1],
                   CLOUD_ML_PROJECT_ID=job.proto.name.split("/")[1], HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   OMP_NUM_THREADS="1")  # several replicas share this machine's few cores
        env.update(vertex_env(job.proto, replica, hosts))
        env.update({e["name"]: e["value"] for e in spec_env})
        return env

    def _finish(self, job: FakeJob, state: JobState, message: str = "") -> None:
        now = dt.datetime.now(dt.timezone.utc)
        job.proto.state, job.proto.end_time, job.proto.update_time = state, now, now
        if message and state != JobState.JOB_STATE_SUCCEEDED:
            job.proto.error = {"code": 1 if state == JobState.JOB_STATE_CANCELLED else 3, "message": message}
        job.done.set()


# -- what Vertex tells each replica about the cluster ---------------------------------------------------------------
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
    return json.dumps({"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": int(index)},
                       "job": json.dumps(CustomJob.to_dict(proto)["job_spec"])})


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


def _wait_all(processes: list[subprocess.Popen], timeout: float) -> int | None:
    """Wait for every process; on the first failure stop the others (they would wait for it at the rendezvous).
    Returns the index of the failed process, or None when all exited 0."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in processes]
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is None and time.monotonic() > deadline:
            failed = next(i for i, c in enumerate(codes) if c is None)
        if failed is not None:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            return failed
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.2)


def _server_side_problem(proto: CustomJob) -> str | None:
    """The few rules Vertex checks on create that the SDK does not."""
    pools = proto.job_spec.worker_pool_specs
    if not pools:
        return "job_spec.worker_pool_specs must not be empty"
    if pools[0].replica_count != 1:
        return "the first worker pool (the chief) must have replica_count 1"
    if not proto.job_spec.base_output_directory.output_uri_prefix.startswith("gs://"):
        return "base_output_directory must be a gs:// URI"
    bad = [k for k in proto.labels if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k)]
    return f"invalid label keys: {bad}" if bad else None


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


# -- the "prebuilt container": a venv holding only torch, made once per session -------------------------------------
VENV_LOCK = threading.Lock()
_SESSION_CACHE: dict[str, Path] = {}


def make_container_venv(path: Path) -> Path:
    """A fresh venv with only the pinned torch, as Vertex's prebuilt PyTorch image has; returns its python."""
    return packaging.make_container_venv(path, constraints=CONSTRAINTS)


def session_container_python(folder: Callable[[], Path]) -> Path:
    """The one container venv of this pytest process (made in `folder()` the first time), shared by the packaging
    and Vertex tests and by the notebooks' conftest."""
    with VENV_LOCK:  # module-level cache: one venv even if several test modules import this fixture
        if "python" not in _SESSION_CACHE:
            _SESSION_CACHE["python"] = make_container_venv(folder() / "venv")
    return _SESSION_CACHE["python"]


@pytest.fixture(scope="session")
def container_python(tmp_path_factory) -> Path:
    """The session's stand-in for the prebuilt container (shared by the packaging and Vertex tests)."""
    return session_container_python(lambda: tmp_path_factory.mktemp("container"))


@pytest.fixture(scope="session")
def sdist_path(tmp_path_factory) -> Path:
    """The project's sdist, built once per session with nli_helpers.vertex.build_sdist."""
    from nli_helpers.vertex import build_sdist

    with VENV_LOCK:
        if "sdist" not in _SESSION_CACHE:
            _SESSION_CACHE["sdist"] = build_sdist(tmp_path_factory.mktemp("dist"))
    return _SESSION_CACHE["sdist"]


@pytest.fixture
def fake_vertex(gcs_emulator) -> Iterator[FakeVertex]:
    """A fake that accepts jobs and keeps them queued (no training runs)."""
    fake = FakeVertex()
    yield fake
    fake.close()


@pytest.fixture
def fake_vertex_runner(gcs_emulator, container_python) -> Iterator[FakeVertex]:
    """A fake that runs each job's chief replica in the container venv."""
    fake = FakeVertex(container_python=container_python)
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
def trainer_image_python(container_python, sdist_path) -> Path:
    """The container venv with the package installed as docker/Dockerfile installs it: a custom image stand-in."""
    install_package(container_python, sdist_path, "smoke")
    return container_python


def install_package(python: Path, sdist: Path, extras: str = "") -> None:
    """pip install the sdist (with extras) under constraints.txt into the container venv."""
    with VENV_LOCK:
        packaging.install_sdist(python, sdist, extras=extras, constraints=CONSTRAINTS)


# -- the whole local cloud, for notebooks: emulator + fake + the environment that points at them ------------------
class LocalCloud:
    """The Cloud Storage emulator and a job-running Vertex fake, with the environment variables pointing at them.

    What notebook 04 reads: STORAGE_EMULATOR_HOST (nli_helpers.storage), NLI_VERTEX_API_ENDPOINT
    (vertex.init_vertex), GOOGLE_CLOUD_PROJECT and NLI_STAGING_BUCKET. Used by notebooks/conftest.py under nbval,
    and from a shell for papermill:

        python -m tests.fake_vertex -- papermill notebooks/04_submit_vertex.ipynb runs/04.ipynb -f notebooks/params/smoke.yaml
    """

    project = "nli-notebooks-ci"
    bucket = "nli-notebooks-ci-staging"

    def __init__(self) -> None:
        import logging

        from nli_helpers.storage import get_client
        from nli_helpers.vertex import API_ENDPOINT_ENV
        from tests.gcs_emulator import EMULATOR_ENV, GcsEmulator, _start_on_free_port

        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)  # a warning per JSON response
        self.tmp = Path(tempfile.mkdtemp(prefix="nli-local-cloud-"))
        server, port = _start_on_free_port()
        self.emulator = GcsEmulator(host=f"http://127.0.0.1:{port}", server=server)
        self.emulator.make_bucket(self.bucket)
        self.fake = FakeVertex(container_python=session_container_python(lambda: self.tmp))
        self.env = {**EMULATOR_ENV, "STORAGE_EMULATOR_HOST": self.emulator.host, API_ENDPOINT_ENV: self.fake.endpoint,
                    "GOOGLE_CLOUD_PROJECT": self.project, "NLI_STAGING_BUCKET": f"gs://{self.bucket}"}
        self._saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)  # the fake's jobs and this process's storage client read them too
        self._clear_clients = get_client.cache_clear
        self._clear_clients()

    def stop(self) -> None:
        """Stop both servers and restore the environment. The container venv is cached for the whole process."""
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
    try:
        return subprocess.run(command, env=os.environ.copy()).returncode
    finally:
        cloud.stop()
        shutil.rmtree(cloud.tmp, ignore_errors=True)  # the container venv made for this command


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
