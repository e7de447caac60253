"""The serving entry point (`python -m nli_helpers.vertex.serve`) as Vertex AI runs it: a real process, a real HTTP
server on a loopback port, the variables Google's custom container requirements name, and a model folder in the
Cloud Storage emulator. Its predictions are the local pipeline's; a bad request is one line, not a stack trace."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nli_helpers import files
from nli_helpers.notebook_runs import predict
from nli_helpers.vertex.serve import MAX_REQUEST_BYTES, BadRequest, parse_instances

PAIRS = [("A man is playing a guitar on stage.", "A man is performing music."),
         ("A man is playing a guitar on stage.", "Nobody is playing an instrument."),
         ("The museum opens at nine every morning.", "The museum is popular with tourists.")]
ROUTES = {"AIP_HEALTH_ROUTE": "/health", "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/2:predict"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, route: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def server(tiny_model_dir, gcs_bucket):
    """The entry point serving the tiny model from gs://, as a Model's AIP_STORAGE_URI names it."""
    uri = f"gs://{gcs_bucket}/models/tiny"
    files.put(tiny_model_dir, uri)
    port = free_port()
    env = {**os.environ, **ROUTES, "AIP_STORAGE_URI": uri, "AIP_HTTP_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.vertex.serve"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited:\n{proc.stdout.read()}"
            try:
                if call(port, ROUTES["AIP_HEALTH_ROUTE"])[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not answer its health route in 120 s"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_server_predicts_what_the_local_pipeline_predicts(server, tiny_model_dir):
    body = json.dumps({"instances": [{"premise": p, "hypothesis": h} for p, h in PAIRS]}).encode()
    status, answer = call(server, ROUTES["AIP_PREDICT_ROUTE"], body)
    assert status == 200, answer
    local = predict(PAIRS, tiny_model_dir)
    assert [row["label"] for row in answer["predictions"]] == [row["label"] for row in local]
    for served, here in zip(answer["predictions"], local, strict=True):
        assert served["probs"] == pytest.approx(here["probs"], abs=1e-5)


def test_a_bad_request_gets_one_line_and_the_server_keeps_serving(server):
    route = ROUTES["AIP_PREDICT_ROUTE"]
    status, answer = call(server, route, json.dumps({"instances": [{"premise": "A dog runs."}]}).encode())
    assert status == 400 and "instance 0 needs a non-empty 'premise' and 'hypothesis'" in answer["error"]
    status, answer = call(server, route, b"premise=A dog runs.")
    assert status == 400 and "not a JSON object" in answer["error"]
    status, answer = call(server, route, b" " * (MAX_REQUEST_BYTES + 1))
    assert status == 413 and "over the 1.5 MB limit" in answer["error"]
    assert call(server, "/elsewhere")[0] == 404
    status, answer = call(server, route, json.dumps({"instances": [{"premise": "A", "hypothesis": "B"}]}).encode())
    assert status == 200 and len(answer["predictions"]) == 1


@pytest.mark.parametrize("body, says", [
    (b"[]", "not a JSON object"),
    (b'{"instances": []}', "no list of instances"),
    (b'{"instances": ["A dog runs."]}', "instance 0 needs"),
    (b'{"instances": [{"premise": " ", "hypothesis": "B"}]}', "instance 0 needs"),
])
def test_parse_instances_names_what_is_off(body, says):
    with pytest.raises(BadRequest, match=says):
        parse_instances(body)


def test_a_folder_without_a_model_is_one_line(tmp_path: Path):
    env = {**os.environ, **ROUTES, "AIP_STORAGE_URI": str(tmp_path), "AIP_HTTP_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-m", "nli_helpers.vertex.serve"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("serve: ") and str(tmp_path) in proc.stderr
