"""The fake's serving surface: the Model Registry, online endpoints and batch prediction, as the Vertex AI REST API
shapes them.

FakeVertex (localcloud/vertex.py) routes every `models`, `endpoints`, `batchPredictionJobs` and `operations` path
of a location here:

    POST   .../models:upload                 UploadModelRequest -> Operation (UploadModelResponse)
    GET    .../models, .../models/M           ListModelsResponse, Model
    DELETE .../models/M                       Operation; refused while the model is deployed
    POST   .../endpoints[?endpoint_id=E]      Endpoint -> Operation (Endpoint)
    GET    .../endpoints, .../endpoints/E     ListEndpointsResponse, Endpoint
    POST   .../endpoints/E:deployModel        DeployModelRequest -> Operation (DeployModelResponse)
    POST   .../endpoints/E:undeployModel      UndeployModelRequest -> Operation (UndeployModelResponse)
    POST   .../endpoints/E:predict            {"instances", "parameters"} -> PredictResponse
    DELETE .../endpoints/E                    Operation; refused while models are deployed on it
    POST   .../batchPredictionJobs            BatchPredictionJob, run in the background (_run_batch)
    GET    .../batchPredictionJobs[/J], POST .../J:cancel, DELETE .../J

Each body is parsed into the SDK's own `aiplatform_v1` proto, so a field Vertex would not know is a 400, and every
long-running call answers with a finished `google.longrunning.Operation` whose `response` is the message the REST
reference names (the SDK unpacks it by its `@type`). Refusals follow the API: "A model cannot be deleted if any
Endpoint resource has a DeployedModel based on the model"; an endpoint with deployed models is not deleted
(the SDK's `Endpoint.delete(force=True)` undeploys them first).

Deploying really starts the Model's serving container: the registered image's interpreter runs the container
spec's `python ...` command with the variables of Google's custom-container page
(https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements): AIP_HTTP_PORT (a free
loopback port here, not the spec's port), AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE (the spec's routes),
AIP_STORAGE_URI (the artifact URI itself: Vertex first copies it to a bucket of its own), AIP_MODE=PREDICTION,
AIP_DEPLOYED_MODEL_ID and AIP_ENDPOINT_ID. The deploy finishes once the health route answers 200, and predict
forwards the body to the predict route and adds `deployedModelId`, as the page says Vertex does. Not Vertex's:
the machine spec is recorded, not provisioned; traffic goes to the newest deployed model.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from google.cloud.aiplatform_v1.types import (
    BatchPredictionJob,
    DeployModelRequest,
    Endpoint,
    JobState,
    Model,
    PredictRequest,
    UndeployModelRequest,
    UploadModelRequest,
)

from localcloud import rules
from localcloud.replica import container_env, free_port

_PATH = re.compile(r"^/v1/(?P<parent>projects/[^/]+/locations/[^/]+)/"
                   r"(?P<kind>models|endpoints|operations|batchPredictionJobs)"
                   r"(?:/(?P<id>[^/:@]+)(?:@[^/:]+)?)?(?::(?P<verb>\w+))?$")
_TYPE = "type.googleapis.com/google.cloud.aiplatform.v1."
HEALTH_TIMEOUT_S = 180.0  # the model loads in the container first; Vertex's own startup probe waits longer


@dataclass
class Served:
    """One deployed model: its DeployedModel JSON and the serving container's process and routes."""
    deployed: dict
    process: subprocess.Popen
    url: str
    predict_route: str


@dataclass
class Registry:
    models: dict[str, dict] = field(default_factory=dict)
    endpoints: dict[str, dict] = field(default_factory=dict)
    served: dict[str, Served] = field(default_factory=dict)  # deployed model id -> its container
    operations: dict[str, dict] = field(default_factory=dict)
    batch_jobs: dict[str, dict] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)  # every serving container started
    ids: itertools.count = field(default_factory=lambda: itertools.count(2000))

    def table(self, kind: str) -> dict[str, dict]:
        return {"models": self.models, "endpoints": self.endpoints, "operations": self.operations,
                "batchPredictionJobs": self.batch_jobs}[kind]


def registry(fake) -> Registry:
    if not hasattr(fake, "serving"):
        fake.serving = Registry()
    return fake.serving


def handle_serving(fake, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
    match = _PATH.match(urllib.parse.unquote(path))  # the SDK quotes a version's "@"
    if not match:
        fake.unknown_requests.append(fake.requests[-1])
        return rules.api_error(404, "NOT_FOUND", f"the fake does not serve {method} {path}")
    reg, parent, kind, verb = registry(fake), match["parent"], match["kind"], match["verb"]
    name = f"{parent}/{kind}/{match['id']}" if match["id"] else None
    table = reg.table(kind)
    try:
        if name is None and method == "GET":
            wanted = _filter(query.get("filter", [""])[0])
            return 200, {kind: [item for key, item in table.items() if key.startswith(f"{parent}/") and
                                all(_field(item, path) == value for path, value in wanted)]}
        if kind == "models" and verb == "upload":
            return _upload(fake, reg, parent, body or {})
        if kind == "endpoints" and name is None and method == "POST":
            return _create_endpoint(reg, parent, body or {}, query.get("endpoint_id", [None])[0])
        if kind == "batchPredictionJobs" and name is None and method == "POST":
            return _create_batch(fake, reg, parent, body or {})
        if name not in table:
            return rules.api_error(404, "NOT_FOUND", f"{name} not found")
        if method == "GET" and not verb:
            return 200, table[name]
        if kind == "batchPredictionJobs" and verb == "cancel":
            return _cancel_batch(reg, name)
        if method == "DELETE":
            return _delete(reg, kind, name)
        if kind == "endpoints" and verb == "deployModel":
            return _deploy(fake, reg, name, body or {})
        if kind == "endpoints" and verb == "undeployModel":
            return _undeploy(reg, name, body or {})
        if kind == "endpoints" and verb == "predict":
            return _predict(reg, name, body or {})
    except ValueError as err:  # a body the SDK's proto does not parse: Vertex's 400
        return rules.api_error(400, "INVALID_ARGUMENT", str(err))
    fake.unknown_requests.append(fake.requests[-1])
    return rules.api_error(404, "NOT_FOUND", f"the fake does not serve {method} {path}")


def _filter(text: str) -> list[tuple[str, str]]:
    """The list filters the fake understands: `labels.KEY="VALUE"` and `display_name="VALUE"`, joined by AND
    (the list calls' `filter` field, https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.endpoints/list)."""
    terms = [t.strip() for t in re.split(r"\s+AND\s+", text) if t.strip()]
    found = [re.fullmatch(r'(labels\.[\w-]+|display_name)\s*=\s*"?([^"]*)"?', t) for t in terms]
    if not all(found):
        raise ValueError(f"the fake cannot filter on {text!r}: use labels.KEY=\"VALUE\" or display_name=\"VALUE\"")
    return [(m[1], m[2]) for m in found]


def _field(item: dict, path: str) -> str | None:
    if path == "display_name":
        return item.get("displayName")
    return item.get("labels", {}).get(path.removeprefix("labels."))


def _parsed(proto_type, body: dict):
    try:
        return proto_type.from_json(json.dumps(body))  # unknown fields raise, as on Vertex
    except Exception as err:  # noqa: BLE001 - the parser's message is the 400's message
        raise ValueError(f"invalid {proto_type.__name__}: {err}") from err


def _json(proto) -> dict:
    return json.loads(type(proto).to_json(proto))


def _operation(reg: Registry, parent: str, response_type: str, response: dict) -> tuple[int, dict]:
    """A long-running operation that has already finished with `response`."""
    name = f"{parent}/operations/{next(reg.ids)}"
    reg.operations[name] = {"name": name, "done": True, "response": {"@type": response_type, **response}}
    return 200, reg.operations[name]


def _upload(fake, reg: Registry, parent: str, body: dict) -> tuple[int, dict]:
    request = _parsed(UploadModelRequest, {**body, "parent": parent})
    model = request.model
    if not model.container_spec.image_uri:
        raise ValueError("model.containerSpec.imageUri is required for a custom-trained model")
    model.name = f"{parent}/models/{request.model_id or next(reg.ids)}"
    model.version_id, model.create_time, model.update_time = "1", rules.now(), rules.now()
    # What a custom-container model supports: deploying on machines you name ("If you want to use a custom-trained
    # model ... you must specify a machine type when you deploy", configure-compute page), and the fake's JSON Lines.
    model.supported_deployment_resources_types = [Model.DeploymentResourcesType.DEDICATED_RESOURCES]
    model.supported_input_storage_formats = model.supported_output_storage_formats = ["jsonl"]
    reg.models[model.name] = _json(model)
    return _operation(reg, parent, _TYPE + "UploadModelResponse", {"model": model.name, "modelVersionId": "1"})


def _create_endpoint(reg: Registry, parent: str, body: dict, endpoint_id: str | None) -> tuple[int, dict]:
    endpoint = _parsed(Endpoint, body)
    endpoint.name = f"{parent}/endpoints/{endpoint_id or next(reg.ids)}"
    endpoint.create_time = endpoint.update_time = rules.now()
    reg.endpoints[endpoint.name] = _json(endpoint)
    return _operation(reg, parent, _TYPE + "Endpoint", reg.endpoints[endpoint.name])


def _delete(reg: Registry, kind: str, name: str) -> tuple[int, dict]:
    parent = name.split(f"/{kind}/")[0]
    if kind == "models":
        using = [e for e in reg.endpoints.values()
                 if any(d["model"].split("@")[0] == name for d in e.get("deployedModels", []))]
        if using:
            return rules.api_error(400, "FAILED_PRECONDITION", f"{name} is deployed on {using[0]['name']}: "
                                   "undeploy it first (a model with a DeployedModel cannot be deleted)")
    if kind == "endpoints" and reg.endpoints[name].get("deployedModels"):
        return rules.api_error(400, "FAILED_PRECONDITION", f"{name} has deployed models: undeploy them first "
                               "(Endpoint.delete(force=True) does)")
    del reg.table(kind)[name]
    return _operation(reg, parent, "type.googleapis.com/google.protobuf.Empty", {})


def _deploy(fake, reg: Registry, name: str, body: dict) -> tuple[int, dict]:
    request = _parsed(DeployModelRequest, {**body, "endpoint": name})
    model = reg.models.get(request.deployed_model.model.split("@")[0])
    if model is None:
        return rules.api_error(404, "NOT_FOUND", f"{request.deployed_model.model} not found")
    deployed = request.deployed_model
    if not deployed.dedicated_resources.machine_spec.machine_type:
        raise ValueError("a custom-trained model needs dedicatedResources.machineSpec.machineType: name the machine")
    deployed.id, deployed.create_time = str(next(reg.ids)), rules.now()
    served = _start(fake, model, name, deployed.id)
    if isinstance(served, str):
        return rules.api_error(400, "FAILED_PRECONDITION", served)
    served.deployed = _json(deployed)
    reg.served[deployed.id] = served
    endpoint = reg.endpoints[name]
    endpoint.setdefault("deployedModels", []).append(served.deployed)
    endpoint["trafficSplit"] = {deployed.id: 100}
    model.setdefault("deployedModels", []).append({"endpoint": name, "deployedModelId": deployed.id})
    return _operation(reg, name.split("/endpoints/")[0], _TYPE + "DeployModelResponse", {"deployedModel": served.deployed})


def _undeploy(reg: Registry, name: str, body: dict) -> tuple[int, dict]:
    request = _parsed(UndeployModelRequest, {**body, "endpoint": name})
    endpoint, gone = reg.endpoints[name], request.deployed_model_id
    if gone not in {d["id"] for d in endpoint.get("deployedModels", [])}:
        return rules.api_error(404, "NOT_FOUND", f"deployed model {gone} not found on {name}")
    stop(reg.served.pop(gone))
    endpoint["deployedModels"] = [d for d in endpoint["deployedModels"] if d["id"] != gone]
    endpoint["trafficSplit"] = {d["id"]: 100 for d in endpoint["deployedModels"][-1:]}
    for model in reg.models.values():
        model["deployedModels"] = [r for r in model.get("deployedModels", []) if r["deployedModelId"] != gone]
    return _operation(reg, name.split("/endpoints/")[0], _TYPE + "UndeployModelResponse", {})


def _predict(reg: Registry, name: str, body: dict) -> tuple[int, dict]:
    traffic = reg.endpoints[name].get("trafficSplit") or {}
    if not traffic:
        return rules.api_error(400, "FAILED_PRECONDITION", f"{name} has no deployed model to send the request to")
    _parsed(PredictRequest, {**body, "endpoint": name})  # an unknown field is Vertex's 400
    deployed_id = next(iter(traffic))
    served = reg.served[deployed_id]
    status, answer = _send(served, body)
    if status != 200:
        return status, answer
    return 200, {**answer, "deployedModelId": deployed_id, "model": served.deployed["model"]}


def _send(served: Served, body: dict) -> tuple[int, dict]:
    """POST `body` to the container's predict route: its answer, or its own status and line as an API error."""
    request = urllib.request.Request(served.url + served.predict_route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return 200, json.loads(reply.read())
    except urllib.error.HTTPError as err:  # passed on as Vertex passes the container's answer
        message = json.loads(err.read() or b"{}").get("error", err.reason)
        return rules.api_error(err.code, "INVALID_ARGUMENT" if err.code < 500 else "INTERNAL", message)


# -- batch prediction ----------------------------------------------------------------------------------------
def _create_batch(fake, reg: Registry, parent: str, body: dict) -> tuple[int, dict]:
    job = _parsed(BatchPredictionJob, body)
    model = reg.models.get(job.model.split("@")[0])
    if model is None:
        return rules.api_error(404, "NOT_FOUND", f"{job.model} not found")
    if job.input_config.instances_format != "jsonl" or job.output_config.predictions_format != "jsonl":
        raise ValueError("the fake reads and writes jsonl only (instancesFormat, predictionsFormat)")
    job.name = f"{parent}/batchPredictionJobs/{next(reg.ids)}"
    job.state, job.create_time, job.update_time = JobState.JOB_STATE_PENDING, rules.now(), rules.now()
    reg.batch_jobs[job.name] = _json(job)
    threading.Thread(target=_run_batch, args=(fake, reg, job, model), daemon=True).start()
    return 200, reg.batch_jobs[job.name]


def _run_batch(fake, reg: Registry, job: BatchPredictionJob, model: dict) -> None:
    """Serve the model as a deploy would, send it the instances in requests of the job's batch size (default 64),
    and write each line {"instance", "prediction"} to `prediction.results-00000-of-00001` in
    `prediction-<model-display-name>-<job-create-time>/` (the get-batch-predictions page's names). Not Vertex's: a
    request the container refuses fails the job with the container's line, where Vertex writes error files."""
    from nli_helpers import files

    record = reg.batch_jobs[job.name]
    record.update(state="JOB_STATE_RUNNING", startTime=_stamp())
    served = _start(fake, model, job.name, job.name.rsplit("/", 1)[-1])
    try:
        if isinstance(served, str):
            raise RuntimeError(served)
        instances = []
        for uri in job.input_config.gcs_source.uris:
            fs, path = files.filesystem(uri)
            instances += [json.loads(line) for line in fs.cat_file(path).decode().splitlines() if line.strip()]
        size = job.manual_batch_tuning_parameters.batch_size or 64
        lines = []
        for start in range(0, len(instances), size):
            chunk = instances[start:start + size]
            status, answer = _send(served, {"instances": chunk})
            if status != 200:
                raise RuntimeError(f"the container answered {status} to instances {start}-{start + len(chunk) - 1}: "
                                   f"{answer['error']['message']}")
            lines += [json.dumps({"instance": i, "prediction": p}) for i, p in zip(chunk, answer["predictions"])]
        created = job.create_time.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # YYYY-MM-DDThh:mm:ss.sssZ
        out = f"{job.output_config.gcs_destination.output_uri_prefix.rstrip('/')}/prediction-" \
              f"{model['displayName']}-{created}"
        fs, path = files.filesystem(out)
        fs.pipe_file(files.join(path, "prediction.results-00000-of-00001"), "\n".join(lines).encode() + b"\n")
        record.update(outputInfo={"gcsOutputDirectory": out}, state="JOB_STATE_SUCCEEDED",
                      completionStats={"successfulCount": str(len(lines))})
    except Exception as err:  # noqa: BLE001 - whatever breaks, the job ends FAILED with the reason
        record.update(state="JOB_STATE_FAILED", error={"code": 3, "message": str(err)})
    finally:
        if not isinstance(served, str):
            stop(served)
        record.update(endTime=_stamp(), updateTime=_stamp())


def _cancel_batch(reg: Registry, name: str) -> tuple[int, dict]:
    reg.batch_jobs[name].update(state="JOB_STATE_CANCELLED", endTime=_stamp())
    return 200, {}


def _stamp() -> str:
    return rules.now().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- the serving container ------------------------------------------------------------------------------------
def _start(fake, model: dict, endpoint: str, deployed_id: str) -> Served | str:
    """Start the model's container and wait for its health route, or say why it cannot serve."""
    spec = model.get("containerSpec", {})
    if spec.get("imageUri") not in fake.images:
        return f"cannot pull image {spec.get('imageUri')}: not registered with the fake (nothing pushed there)"
    command = [*spec.get("command", []), *spec.get("args", [])]
    if not command or command[0] not in ("python", "python3"):
        return f"the fake runs only `python ...` serving commands in {spec['imageUri']}, not {command}"
    port, health, predict = free_port(), spec.get("healthRoute") or "/health", spec.get("predictRoute") or "/predict"
    env = container_env()
    env.update({e["name"]: e["value"] for e in spec.get("env", [])})
    env.update(PYTHONUNBUFFERED="1", AIP_MODE="PREDICTION", AIP_HTTP_PORT=str(port),
               AIP_HEALTH_ROUTE=health, AIP_PREDICT_ROUTE=predict, AIP_STORAGE_URI=model.get("artifactUri", ""),
               AIP_DEPLOYED_MODEL_ID=deployed_id, AIP_ENDPOINT_ID=endpoint.rsplit("/", 1)[-1])
    log = tempfile.NamedTemporaryFile("w+", prefix="fake-vertex-serve-", suffix=".log", delete=False)
    process = subprocess.Popen([str(fake.images[spec["imageUri"]]), *command[1:]], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    registry(fake).processes.append(process)
    served = Served({}, process, f"http://127.0.0.1:{port}", predict)
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"the serving container exited with code {process.returncode}: {_tail(log.name)}"
        try:
            with urllib.request.urlopen(served.url + health, timeout=5) as reply:
                if reply.status == 200:
                    return served
        except OSError:
            time.sleep(0.2)
    stop(served)
    return f"the serving container did not answer {health} within {HEALTH_TIMEOUT_S:.0f} s: {_tail(log.name)}"


def stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        served.process.kill()


def stop_all(fake) -> None:
    """Stop every serving container (FakeVertex.close)."""
    for served in registry(fake).served.values():
        stop(served)


def _tail(path: str, lines: int = 5) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return " | ".join(f.read().strip().splitlines()[-lines:])
