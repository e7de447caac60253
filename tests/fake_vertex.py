"""A small fake of the Vertex AI REST surface for custom jobs, and the stand-in for Vertex's training container.

The real google-cloud-aiplatform SDK talks to it over HTTP on a free loopback port:

    fake = FakeVertex(container_python=...)        # or the fixtures below
    aiplatform.init(project="p", location="us-central1", api_endpoint=fake.endpoint, api_transport="rest",
                    staging_bucket="gs://bucket", credentials=AnonymousCredentials())

It serves create / get / list / cancel of `projects/*/locations/*/customJobs`, parses every request body into
the SDK's own `aiplatform_v1.CustomJob` proto (so a field Vertex would not know is a 400, as on Vertex), and
records every request (`fake.requests`; unknown routes in `fake.unknown_requests`) for assertions. Enums arrive
as integers and int64 as strings (the SDK asks for `$alt=json;enum-encoding=int`).

With `container_python` (a venv holding only torch, as Vertex's prebuilt PyTorch image does) it RUNS the chief
replica: a python-package pool downloads the staged sdist from Cloud Storage (the emulator), pip-installs it
as Vertex does, and runs `python -m <module> <args>`; a container pool runs an image registered with
`fake.register_image(uri, python)` (its ENTRYPOINT being `python -m nli_helpers.task`). The job sees
AIP_MODEL_DIR / AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under base_output_dir and goes
PENDING -> RUNNING -> SUCCEEDED or FAILED. Without it, jobs stay PENDING (queued) until cancelled.

Differences from Vertex, on purpose: only the chief replica runs; pip installs under constraints.txt (the
build machines are offline but for PyPI, and this keeps the run reproducible); no CLUSTER_SPEC is set.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from google.cloud.aiplatform_v1.types import CustomJob, JobState

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
    process: subprocess.Popen | None = None
    done: threading.Event = field(default_factory=threading.Event)


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
            if job.process and job.process.poll() is None:
                job.process.kill()
        self._server.shutdown()
        self._server.server_close()

    # -- the REST surface -----------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        self.requests.append(Request(method, path, query, body))
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
            if job.process is None:
                self._finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            else:
                job.proto.state = JobState.JOB_STATE_CANCELLING
                job.process.terminate()
        return 200, {}

    @staticmethod
    def _json(proto: CustomJob, query: dict) -> dict:
        ints = "enum-encoding=int" in ";".join(query.get("$alt", []))
        return json.loads(CustomJob.to_json(proto, use_integers_for_enums=ints))

    # -- running the chief replica -------------------------------------------------------------------------
    def _run(self, job: FakeJob) -> None:
        with self._lock:
            if job.proto.state != JobState.JOB_STATE_PENDING:
                return
            job.proto.state, job.proto.start_time = JobState.JOB_STATE_RUNNING, dt.datetime.now(dt.timezone.utc)
        workdir = Path(tempfile.mkdtemp(prefix="fake-vertex-job-"))
        try:
            code, message = self._run_chief(job, workdir)
        except Exception as err:  # noqa: BLE001 - whatever breaks, the job must end FAILED with the reason
            code, message = 1, f"{type(err).__name__}: {err}"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        with self._lock:
            if job.proto.state == JobState.JOB_STATE_CANCELLED:  # cancelled before its process started
                return
            if job.proto.state == JobState.JOB_STATE_CANCELLING:
                self._finish(job, JobState.JOB_STATE_CANCELLED, "cancelled by the user")
            elif code == 0:
                self._finish(job, JobState.JOB_STATE_SUCCEEDED)
            else:
                self._finish(job, JobState.JOB_STATE_FAILED, message)

    def _run_chief(self, job: FakeJob, workdir: Path) -> tuple[int, str]:
        pool = job.proto.job_spec.worker_pool_specs[0]
        if "python_package_spec" in pool:
            spec = pool.python_package_spec
            python = self.container_python
            if python is None:
                return 1, "this fake has no container venv to run python packages in"
            for uri in spec.package_uris:
                self._pip_install(job, self._download(uri, workdir))
            command = [str(python), "-m", spec.python_module, *spec.args]
        elif pool.container_spec.image_uri in self.images:
            spec = pool.container_spec
            python = self.images[spec.image_uri]
            command = [str(python), "-m", "nli_helpers.task", *spec.args]
        else:
            return 1, f"cannot pull image {pool.container_spec.image_uri}: not registered with the fake"
        env = self._job_env(job, [{"name": e.name, "value": e.value} for e in spec.env])
        with self._lock:
            if job.proto.state != JobState.JOB_STATE_RUNNING:  # cancelled while installing
                return 1, "cancelled"
            job.process = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
        out, _ = job.process.communicate(timeout=JOB_TIMEOUT_S)
        job.log += out
        tail = "\n".join(out.strip().splitlines()[-5:])
        return job.process.returncode, (f"The replica workerpool0-0 exited with a non-zero status of "
                                        f"{job.process.returncode}. Last lines:\n{tail}")

    @staticmethod
    def _download(uri: str, workdir: Path) -> Path:
        from nli_helpers import storage

        return storage.download(uri, workdir / uri.rsplit("/", 1)[-1])

    def _pip_install(self, job: FakeJob, package: Path) -> None:
        # As Vertex does: install the staged package (no extras) into the container's Python.
        with VENV_LOCK:
            proc = subprocess.run([str(self.container_python), "-m", "pip", "install", "--disable-pip-version-check",
                                   "-c", str(self.constraints), str(package)], capture_output=True, text=True)
        job.log += proc.stdout + proc.stderr
        if proc.returncode:
            raise RuntimeError(f"pip install {package.name} failed:\n{proc.stderr[-2000:]}")

    def _job_env(self, job: FakeJob, spec_env: list[dict]) -> dict[str, str]:
        base = job.proto.job_spec.base_output_directory.output_uri_prefix.rstrip("/")
        env = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/", CLOUD_ML_JOB_ID=job.proto.name.rsplit("/", 1)[-1],
                   CLOUD_ML_PROJECT_ID=job.proto.name.split("/")[1], HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        env.update({e["name"]: e["value"] for e in spec_env})
        return env

    def _finish(self, job: FakeJob, state: JobState, message: str = "") -> None:
        now = dt.datetime.now(dt.timezone.utc)
        job.proto.state, job.proto.end_time, job.proto.update_time = state, now, now
        if message and state != JobState.JOB_STATE_SUCCEEDED:
            job.proto.error = {"code": 1 if state == JobState.JOB_STATE_CANCELLED else 3, "message": message}
        job.done.set()


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


def torch_pin(constraints: Path = CONSTRAINTS) -> str:
    return re.search(r"^torch==(\S+)$", constraints.read_text(), re.M).group(1)


def make_container_venv(path: Path) -> Path:
    """A fresh venv with only the pinned torch, as Vertex's prebuilt PyTorch image has; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(CONSTRAINTS), f"torch=={torch_pin()}"], check=True, capture_output=True)
    return python


def installed_version(python: Path, dist: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{dist}'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="session")
def container_python(tmp_path_factory) -> Path:
    """The session's stand-in for the prebuilt container (shared by the packaging and Vertex tests)."""
    with VENV_LOCK:  # module-level cache: one venv even if several test modules import this fixture
        if "python" not in _SESSION_CACHE:
            _SESSION_CACHE["python"] = make_container_venv(tmp_path_factory.mktemp("container") / "venv")
    return _SESSION_CACHE["python"]


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
    install_package(container_python, f"{sdist_path}[smoke]")
    return container_python


def install_package(python: Path, requirement: str) -> None:
    """pip install `requirement` under constraints.txt into the container venv."""
    with VENV_LOCK:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                        str(CONSTRAINTS), requirement], check=True, capture_output=True)
