"""The trainer image's serving entry point, `python -m nli_helpers.vertex.serve`: the HTTP server
a Vertex AI Model runs, after Google's custom container requirements for inference
(https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements).

It loads the model folder AIP_STORAGE_URI names ("a Cloud Storage URI that begins with gs://",
Vertex AI's copy of the Model's artifactUri; a local folder works too), then listens on
0.0.0.0:AIP_HTTP_PORT:

    GET  AIP_HEALTH_ROUTE    200 once the model is loaded
    POST AIP_PREDICT_ROUTE   {"instances": [{"premise": ..., "hypothesis": ...}, ...]}
                             -> {"predictions": [{"label": ..., "probs": {label: p}}, ...]}

A request over 1.5 MB ("each inference request must be 1.5 MB or smaller", on a shared public
endpoint) is a 413, and a body of another shape a 400, each with one line saying what to send.
Batch prediction sends the same requests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nli_helpers.config import NLIError

MAX_REQUEST_BYTES = 1_500_000  # the page above: "1.5 MB or smaller"
SHAPE = '{"instances": [{"premise": "...", "hypothesis": "..."}, ...]}'


class BadRequest(ValueError):
    """A request the server refuses: its HTTP status, and one line for the caller."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


def check_size(length: int) -> None:
    if length > MAX_REQUEST_BYTES:
        raise BadRequest(f"the request is {length:,} bytes, over the 1.5 MB limit: send fewer "
                         "instances per request", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


def parse_instances(body: bytes) -> list[tuple[str, str]]:
    """The (premise, hypothesis) pairs of a predict request, or BadRequest saying what is off."""
    check_size(len(body))
    try:
        instances = json.loads(body).get("instances")
    except (ValueError, AttributeError) as e:
        raise BadRequest(f"the body is not a JSON object ({e}): send {SHAPE}") from e
    if not isinstance(instances, list) or not instances:
        raise BadRequest(f"no list of instances: send {SHAPE}")
    pairs = []
    for i, instance in enumerate(instances):
        texts = [instance.get(k) if isinstance(instance, dict) else None
                 for k in ("premise", "hypothesis")]
        if not all(isinstance(text, str) and text.strip() for text in texts):
            raise BadRequest(f"instance {i} needs a non-empty 'premise' and 'hypothesis', not "
                             f"{json.dumps(instance)[:200]}")
        pairs.append((texts[0], texts[1]))
    return pairs


def make_server(model_dir: str, port: int, health_route: str, predict_route: str,
                host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Load the model (gs:// or local), then an HTTP server for it, not yet serving."""
    from nli_helpers.model import load_model_and_tokenizer
    from nli_helpers.notebook_runs import predict

    model, tokenizer = load_model_and_tokenizer(model_dir)
    one_at_a_time = threading.Lock()  # one model, a thread per request

    class Handler(BaseHTTPRequestHandler):
        def reply(self, status: HTTPStatus, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's names)
            if self.path != health_route:
                return self.reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            self.reply(HTTPStatus.OK, {"model": model_dir})

        def do_POST(self):  # noqa: N802
            if self.path != predict_route:
                return self.reply(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                if length > 10 * MAX_REQUEST_BYTES:  # refused unread: reply, then close
                    self.close_connection = True
                    check_size(length)
                # read first, even a body to refuse: a client still sending it gets the 413
                pairs = parse_instances(self.rfile.read(length))
            except BadRequest as e:
                return self.reply(e.status, {"error": str(e)})
            with one_at_a_time:
                rows = predict(pairs, model=model, tokenizer=tokenizer)
            self.reply(HTTPStatus.OK, {"predictions": rows})

        def log_message(self, format, *args):  # noqa: A002 (http.server's name)
            print(f"serve: {format % args}", file=sys.stderr, flush=True)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    # no options: Vertex AI configures the server through AIP_* variables; --help prints this
    argparse.ArgumentParser(prog="python -m nli_helpers.vertex.serve", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    env = os.environ
    if not env.get("AIP_STORAGE_URI"):
        print("serve: AIP_STORAGE_URI is not set: Vertex AI sets it from the Model's artifact_uri;"
              " here, set it to a model folder (gs:// or local)", file=sys.stderr)
        return 2
    try:
        server = make_server(env["AIP_STORAGE_URI"], int(env.get("AIP_HTTP_PORT", "8080")),
                             env.get("AIP_HEALTH_ROUTE", "/health"),
                             env.get("AIP_PREDICT_ROUTE", "/predict"))
    except NLIError as e:  # a folder without weights or tokenizer, a URI that cannot be read
        print(f"serve: {e}", file=sys.stderr)
        return 1
    print(f"serve: {env['AIP_STORAGE_URI']} on port {server.server_port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
