"""A replica of a fake Vertex AI job: one local process group standing in for one container on its own VM.

localcloud/rules.py decides when replicas start, stop and restart; this module only does it, the way a
container runtime would: a replica's processes form one group (its own session), a stop is SIGTERM to the
first process and SIGKILL to every process after the grace period, and each attempt writes its own log file.
The first process is the container's PID 1, which gets a SIGTERM only if it has a handler for it: "a process
in an ancestor namespace can [...] send signals to the "init" process of a child PID namespace only if the
"init" process has established a handler for that signal" (pid_namespaces(7)); SIGKILL always arrives.
"""

from __future__ import annotations

import http.server
import os
import random
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

METADATA_HOST_ENV = "GCE_METADATA_HOST"  # google-auth's override of metadata.google.internal
# Environment a container would not have: the checkout on the path, the test venv, the developer's data, the hub's
# stand-in (localcloud/hub.py).
HOST_ONLY_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "NLI_REAL_DATA", "PYTHONHOME", "HF_ENDPOINT")
# What takes huggingface_hub and datasets offline, failing at once instead of after retries (huggingface_hub 2.4.0's
# constants.py reads HF_HUB_OFFLINE against ENV_VARS_TRUE_VALUES; datasets 5.2.0's config.py HF_DATASETS_OFFLINE).
HUB_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def container_env() -> dict[str, str]:
    """This process's environment as a container of the trainer image sees it: no host-only variables, no hub."""
    return {**{k: v for k, v in os.environ.items() if k not in HOST_ONLY_ENV}, **HUB_OFFLINE_ENV}


class MetadataServer(http.server.ThreadingHTTPServer):
    """The VM's metadata server, for the two keys that say the VM is going. "instance/preempted": "TRUE" while a
    Spot VM is being preempted ("Detect if a VM is preempted", https://cloud.google.com/compute/docs/instances/
    spot). "instance/maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE" before a GPU VM stops for maintenance,
    else "NONE" ("Handle GPU host maintenance events", https://cloud.google.com/compute/docs/gpus/
    gpu-host-maintenance). Each request needs the header "Metadata-Flavor: Google" (both pages' curl)."""

    def __init__(self, replica: Replica):
        self.replica = replica
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def answer(self, path: str) -> str | None:
        going = self.replica.preempted
        return {"/computeMetadata/v1/instance/preempted": "TRUE" if going == "spot" else "FALSE",
                "/computeMetadata/v1/instance/maintenance-event":
                    "TERMINATE_ON_HOST_MAINTENANCE" if going == "maintenance" else "NONE"}.get(path)


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        value = self.server.answer(self.path) if self.headers.get("Metadata-Flavor") == "Google" else None
        body = (value or "").encode()
        self.send_response(200 if value is not None else 403 if "Metadata-Flavor" not in self.headers else 404)
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@dataclass
class Replica:
    name: str  # workerpool0-0, workerpool1-0, ...
    kind: str  # "container_spec" or "python_package_spec"
    command: list[str]
    env: dict[str, str]
    workdir: Path
    attempt: int = 0
    process: subprocess.Popen | None = None
    preempted: str | None = None  # "spot" or "maintenance" while its VM is being taken away
    finished: bool = False  # exited 0
    logs: list[Path] = field(default_factory=list)
    metadata: MetadataServer | None = None  # its VM's, while it runs

    @property
    def primary(self) -> bool:
        return self.name == "workerpool0-0"

    def start(self) -> None:
        (self.workdir / self.name).mkdir(parents=True, exist_ok=True)
        self.logs.append(self.workdir / f"{self.name}.attempt-{self.attempt + 1}.log")
        self.attempt, self.preempted, self.finished = self.attempt + 1, None, False
        self.metadata = self.metadata or MetadataServer(self)
        env = {**self.env, METADATA_HOST_ENV: f"127.0.0.1:{self.metadata.server_address[1]}"}
        with open(self.logs[-1], "w") as log:
            self.process = subprocess.Popen(self.command, cwd=self.workdir / self.name, env=env,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill_all(self) -> None:
        """SIGKILL every process of the replica (what tearing a container down does), and its VM's metadata server."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
        server, self.metadata = self.metadata, None  # the fake's loop and a preemption's timer may both stop it
        if server is not None:
            server.shutdown()
            server.server_close()

    def log_text(self, attempt: int | None = None) -> str:
        """One attempt's log; the newest by default (start() appends it before the attempt counter moves
        on, and the fake's loop thread may start a replica while a test's thread reads)."""
        logs = self.logs[attempt - 1:attempt] if attempt else self.logs[-1:]
        return logs[0].read_text(errors="replace") if logs and logs[0].exists() else ""


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (SigCgt in /proc/PID/status, a hex mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    mask = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(mask, 16) >> (signum - 1) & 1)


def stop_all(replicas: list[Replica], grace_s: float) -> None:
    """Stop these containers together: SIGTERM to each first process that handles it (PID 1 drops it
    otherwise), SIGKILL to all after `grace_s`."""
    for replica in replicas:
        if replica.running() and catches(replica.process.pid, signal.SIGTERM):
            replica.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for replica in replicas:
        if replica.process is not None:
            try:
                replica.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            replica.kill_all()


def free_port() -> int:
    """A loopback port free now, for a process that binds it later (a chief's torchrun, a server).

    Drawn below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default), which the kernel hands to
    every outbound connection and every bind to port 0: a port taken from that range could go to another
    connection before the process binds it, and the chief's torchrun would exit with "address already in use"."""
    for port in random.sample(range(20000, 32768), 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port between 20000 and 32767 in 100 tries")
