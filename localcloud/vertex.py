"""A small fake of the Vertex AI REST surface for custom jobs.

The real google-cloud-aiplatform SDK talks to it over HTTP on a free loopback port:

    fake = FakeVertex(run_jobs=True)
    fake.register_image("us-central1-docker.pkg.dev/p/nli/trainer:0.1.0", python)   # the image's stand-in
    aiplatform.init(project="p", location="us-central1", api_endpoint=fake.endpoint, api_transport="rest",
                    staging_bucket="gs://bucket", credentials=AnonymousCredentials())

It serves create / get / list / cancel of `projects/*/locations/*/customJobs` (and of `hyperparameterTuningJobs`,
whose trials run as child custom jobs: localcloud/tuning.py; models and endpoints: localcloud/serving.py), parses every request body into the SDK's own
`aiplatform_v1.CustomJob` proto (so a field Vertex would not know is a 400, as on Vertex), and records every
request (`fake.requests`; unknown routes in `fake.unknown_requests`) for assertions. Enums arrive as integers and
int64 as strings (the SDK asks for `$alt=json;enum-encoding=int`).

With `run_jobs` it RUNS each job's training replicas as local processes, following the rules of
localcloud/rules.py, each of which cites the Vertex AI page it models: the quota queue, the images a
python package may name, how pip treats the image's torch, success, VM maintenance and Spot preemption
(`fake.preempt`), non-zero exits, `restart_job_on_worker_restart` and `scheduling.timeout`. Every replica of
workerpool0 (chief) and workerpool1 (workers) gets the variables Vertex sets: CLUSTER_SPEC (every replica's
127.0.0.1:PORT, its own task type and index), node-level RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as the
prebuilt PyTorch images set them, CLOUD_ML_PROJECT_ID (the project number) and AIP_MODEL_DIR /
AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under base_output_dir. So a multi-worker job really trains over
torchrun across "nodes" on this machine (gloo on the CPU). Without `run_jobs`, jobs stay PENDING. The replicas have
no hub (replica.HUB_OFFLINE_ENV), as a job behind VPC Service Controls, where "Vertex AI won't be able to reach resources
outside the perimeter" (https://cloud.google.com/vertex-ai/docs/general/vpc-service-controls): a job that names a
hub model or dataset fails at once, and one staged in gs:// (vertex.stage_data, vertex.stage_model) trains. A
container job runs the interpreter registered for its image: localcloud/image.py builds the trainer image's.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from google.cloud.aiplatform_v1.types import CustomJob, JobState
from google.protobuf import json_format

from localcloud import rules
from localcloud.replica import Replica, container_env, free_port
from localcloud.serving import handle_serving, stop_all
from localcloud.tuning import handle_tuning

JOB_TIMEOUT_S = rules.JOB_TIMEOUT_S
_COLLECTION = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs$")
_JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)(:cancel)?$")
_SERVING = re.compile(r"^/v1/projects/[^/]+/locations/[^/]+/(models|endpoints|operations|batchPredictionJobs)\b")
PRACTICE_FULL = ("practice mode trains each job on this machine's CPU, where profile full (roberta-base on 393k "
                 "pairs) takes days: practice with notebooks/params/smoke.yaml, rehearse full by adding "
                 "notebooks/params/rehearsal.yaml after full.yaml, or run it on Vertex AI with cloud='google'")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict | None


class FakeVertex:
    """A threaded HTTP server answering the customJobs REST calls; `endpoint` is what aiplatform.init takes."""

    def __init__(self, *, run_jobs: bool = False, gpu_quota: dict[str, int] | None = None,
                 grace_s: float = rules.SPOT_GRACE_S):
        self.run_jobs = run_jobs
        self.quota = rules.Quota(gpu_quota)
        self.grace_s = grace_s
        self.requests: list[Request] = []
        self.unknown_requests: list[Request] = []
        self.jobs: dict[str, rules.FakeJob] = {}
        self.images: dict[str, Path] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.Lock()
        self._replicas_running = 0  # training replicas of every running job: they share this machine's cores
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

    def preempt(self, name: str, replica: str = "workerpool0-0", *, kind: str, hard: bool = False,
                grace_s: float | None = None) -> None:
        """Take the VM under `replica` away: `kind="maintenance"` restarts that replica on another
        VM (rule 5); `kind="spot"` (a Spot job only) restarts the whole job, at most three times (rule 6)."""
        job = self.jobs[name]
        rules.preempt(job, job.replicas[replica], kind=kind, hard=hard,
                      grace_s=self.grace_s if grace_s is None else grace_s)

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
        stop_all(self)
        with self.quota.changed:
            self.quota.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- the REST surface -----------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        self.requests.append(Request(method, path, query, body))
        if "/hyperparameterTuningJobs" in path:  # served (and trials run) by localcloud/tuning.py
            return handle_tuning(self, method, path, query, body)
        if _SERVING.match(path):  # the Model Registry and endpoints: localcloud/serving.py
            return handle_serving(self, method, path, query, body)
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
            return rules.api_error(404, "NOT_FOUND", f"{job.group(1)} not found")
        self.unknown_requests.append(self.requests[-1])
        return rules.api_error(404, "NOT_FOUND", f"the fake does not serve {method} {path}")

    def _create(self, parent: str, body: dict) -> tuple[int, dict]:
        try:
            proto = CustomJob.from_json(json.dumps(body))  # unknown fields raise, as on Vertex
        except Exception as err:  # noqa: BLE001 - the parser's message is the 400's message
            return rules.api_error(400, "INVALID_ARGUMENT", f"invalid CustomJob: {err}")
        problem = rules.server_side_problem(proto)
        if problem:
            return rules.api_error(400, "INVALID_ARGUMENT", problem)
        if problem := self.practice_problem(proto.job_spec):
            return rules.api_error(400, "FAILED_PRECONDITION", problem)
        proto.name = f"{parent}/customJobs/{next(self._ids)}"
        proto.state, proto.create_time, proto.update_time = JobState.JOB_STATE_PENDING, rules.now(), rules.now()
        job = self.jobs[proto.name] = rules.FakeJob(proto, body)
        if self.run_jobs:
            threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return 200, self._json(proto, {})

    def practice_problem(self, job_spec) -> str | None:
        """Not Vertex's: the fake trains every job on this machine, so without a GPU here it refuses the
        full recipe, which would take days on the CPU, naming the scaled alternatives."""
        for pool in job_spec.worker_pool_specs[:2] if self.run_jobs else ():
            flags = dict(arg.removeprefix("--").partition("=")[::2] for arg in pool.container_spec.args)
            if flags.get("profile") == "full" and "max_train_samples" not in flags:
                import torch  # only here: the fake itself needs no torch

                if not torch.cuda.is_available():
                    return PRACTICE_FULL
        return None

    def _cancel(self, job: rules.FakeJob) -> tuple[int, dict]:
        with self._lock:
            if job.proto.state in rules.TERMINAL:
                return rules.api_error(400, "FAILED_PRECONDITION", f"{job.proto.name} has already ended")
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
    def _run(self, job: rules.FakeJob) -> None:
        """Queue, prepare and run the job to its end (rules 1-9); used for trials too."""
        need = rules.gpus_needed(job.proto)
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
            with self._lock:
                self._replicas_running -= job.cpu_replicas
            for replica in job.replicas.values():
                replica.kill_all()
                for attempt in range(1, replica.attempt + 1):
                    label = replica.name if attempt == 1 else f"{replica.name} attempt {attempt}"
                    job.log += "".join(f"[{label}] {line}" for line in
                                       replica.log_text(attempt).splitlines(keepends=True))
            shutil.rmtree(workdir, ignore_errors=True)
        with self._lock:
            self._finish(job, state, message)

    def _prepare_and_supervise(self, job: rules.FakeJob, workdir: Path) -> tuple[JobState, str]:
        pools = job.proto.job_spec.worker_pool_specs
        for i, pool in enumerate(pools[2:], start=2):
            image = pool.container_spec.image_uri or pool.python_package_spec.executor_image_uri
            job.note(f"workerpool{i}: {pool.replica_count} replica(s) of {image} accepted, not started (Reduction "
                     "Server serves NCCL between GPUs; the local replicas use gloo)")
        hosts = {name: f"127.0.0.1:{free_port()}" for name in replica_names(job.proto)}
        with self._lock:  # not Vertex's: every replica gets a VM there; here the replicas split the cores
            job.cpu_replicas = sum(pool.replica_count for pool in pools[:2])
            self._replicas_running += job.cpu_replicas
            threads = max(1, host_cores() // max(self._replicas_running, job.cpu_replicas * job.side_by_side))
        for i, pool in enumerate(pools[:2]):
            if not pool.replica_count:
                continue
            found = self._command(job, pool, workdir)
            if isinstance(found, str):
                return JobState.JOB_STATE_FAILED, found
            (kind, command, spec_env) = found
            for index in range(pool.replica_count):
                name = f"workerpool{i}-{index}"
                env = self._job_env(job, spec_env, name, hosts, threads)
                job.replicas[name] = Replica(name, kind, command, env, workdir)
        with self._lock:
            if job.cancel_requested.is_set():
                return JobState.JOB_STATE_CANCELLED, "cancelled by the user"
            job.proto.state, job.proto.start_time = JobState.JOB_STATE_RUNNING, rules.now()
        job.started.set()
        return rules.run_job(job, list(job.replicas.values()), grace_s=self.grace_s)

    def _command(self, job: rules.FakeJob, pool, workdir: Path) -> tuple[str, list[str], list[dict]] | str:
        """(kind, the command one replica of this pool runs, the pool's env), or why it cannot run."""
        if "python_package_spec" in pool:
            spec = pool.python_package_spec
            torch_version, python_version = rules.published_image(spec.executor_image_uri)  # checked on create
            for uri in spec.package_uris:
                sdist = self._download(uri, workdir)
                keeps, wanted = rules.pip_keeps_torch(sdist, torch_version)
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
        entry = list(spec.command) or rules.DEFAULT_ENTRYPOINT
        if entry[0] not in ("python", "python3"):
            return f"the fake runs only `python ...` commands in {spec.image_uri}, not {entry}"
        command = [str(self.images[spec.image_uri]), *entry[1:], *spec.args]
        return "container_spec", command, [{"name": e.name, "value": e.value} for e in spec.env]

    @staticmethod
    def _download(uri: str, workdir: Path) -> Path:
        from nli_helpers import files

        fs, path = files.filesystem(uri)
        fs.get(path, str(workdir / uri.rsplit("/", 1)[-1]))
        return workdir / uri.rsplit("/", 1)[-1]

    def _job_env(self, job: rules.FakeJob, spec_env: list[dict], replica: str, hosts: dict[str, str],
                 threads: int) -> dict[str, str]:
        base = job.proto.job_spec.base_output_directory.output_uri_prefix.rstrip("/")
        env = container_env()
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/", CLOUD_ML_JOB_ID=job.proto.name.rsplit("/", 1)[-1],
                   CLOUD_ML_PROJECT_ID=rules.project_number(job.proto.name.split("/")[1]),  # rule 10
                   OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
                   NLI_ALLOW_CPU="1")  # not Vertex's: the replicas run on this CPU whatever GPUs the job asked
        env.update(vertex_env(job.proto, replica, hosts))
        env.update({e["name"]: e["value"] for e in spec_env})
        return env

    def _finish(self, job: rules.FakeJob, state: JobState, message: str = "") -> None:
        if job.proto.state in rules.TERMINAL:
            return
        job.proto.state, job.proto.end_time, job.proto.update_time = state, rules.now(), rules.now()
        if message and state != JobState.JOB_STATE_SUCCEEDED:
            job.proto.error = {"code": 1 if state == JobState.JOB_STATE_CANCELLED else 3, "message": message}
        job.done.set()


# -- what Vertex tells each replica about the cluster ----------------------------------------
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
    # "job": "The CustomJobSpec that you provided to create the current training job, represented as a dictionary"
    # (distributed-training page): the service's JSON of the spec, its REST spelling (workerPoolSpecs, machineSpec).
    job = json_format.MessageToDict(type(proto.job_spec).pb(proto.job_spec))
    return json.dumps({"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": int(index)}, "job": job})


def vertex_env(proto: CustomJob, replica: str, hosts: dict[str, str]) -> dict[str, str]:
    """CLUSTER_SPEC, and the node-level variables Vertex's prebuilt PyTorch images add: RANK is the replica's node
    rank and WORLD_SIZE the number of training nodes (not processes: the trap nli_helpers.vertex.launch avoids)."""
    training = [n for n in replica_names(proto) if n.startswith(("workerpool0-", "workerpool1-"))]
    chief_host, _, chief_port = hosts["workerpool0-0"].rpartition(":")
    env = {"CLUSTER_SPEC": cluster_spec(proto, replica, hosts), "MASTER_ADDR": chief_host, "MASTER_PORT": chief_port,
           "WORLD_SIZE": str(len(training))}
    if replica in training:
        env["RANK"] = str(training.index(replica))
    return env


def host_cores() -> int:
    """The cores the fake's jobs may share: $OMP_NUM_THREADS when this process was given a share of the machine (a
    pytest-xdist worker, see conftest.py), else every core."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else (os.cpu_count() or 1)


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
