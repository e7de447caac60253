"""Vertex AI's contract with a custom training container, spelled once: the environment it sets
(CLUSTER_SPEC read into one object), the exit codes it retries, the marker file that carries the
launcher's SIGTERM through torchrun, and whether the VM is going. No torch, so the launcher reads
it at start-up.

Sources: "Prepare training code" (https://cloud.google.com/vertex-ai/docs/training/
code-requirements) for AIP_*; "Use Vertex AI TensorBoard with custom training"
(https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training); "Distributed training"
(https://cloud.google.com/vertex-ai/docs/training/distributed-training) for CLUSTER_SPEC; "Handle
common errors" (https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service)
for the exit codes; "Use Spot VMs" (https://docs.cloud.google.com/vertex-ai/docs/training/
use-spot-vms) for a preempted job's restarts.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from nli_helpers.config import NLIError

MODEL_DIR_ENV = "AIP_MODEL_DIR"  # base_output_dir/model: the run folder
CHECKPOINT_DIR_ENV = "AIP_CHECKPOINT_DIR"  # base_output_dir/checkpoints: set, a restart resumes
TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"  # base_output_dir/logs: what Vertex TensorBoard reads
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"  # set in a hyperparameter tuning trial
METRIC_TAG_ENV = "CLOUD_ML_HP_METRIC_TAG"  # the legacy AI Platform name of the metric to report
CLUSTER_SPEC_ENV = "CLUSTER_SPEC"  # the worker pools and this replica's place among them



class ClusterSpecError(NLIError):
    """CLUSTER_SPEC is not what Vertex AI sets."""


@dataclass(frozen=True)
class ClusterSpec:
    """CLUSTER_SPEC, read once for all its readers (the launcher's nodes, a tuning trial's id, the
    replica's GPUs): {"cluster": {"workerpool0": ["host:port"], ...}, "task": {"type":
    "workerpool1", "index": 0, "trial": ...}, "job": the CustomJobSpec} ("Distributed training",
    "The format of CLUSTER_SPEC"). `task.trial` is "only set if the current training job is a
    hyperparameter tuning job". The page shows `job` as a dictionary in no given spelling: the
    REST API's camelCase (workerPoolSpecs) is read as the Python SDK's snake_case."""

    cluster: dict[str, list[str]]  # worker pool -> its replicas' host:port
    pool: str  # this replica's: workerpool0 (the chief), 1 (workers), 2 (Reduction Server)
    index: int
    trial: str | None
    job: dict

    @classmethod
    def parse(cls, spec: str | dict | None) -> ClusterSpec | None:
        """The environment's JSON (or the same as a dict); None off Vertex AI."""
        def snake(d: dict) -> dict:  # acceleratorCount -> accelerator_count
            return {re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", k).lower(): v for k, v in d.items()}

        if not spec:
            return None
        try:
            spec = json.loads(spec if isinstance(spec, str) else json.dumps(spec),
                              object_hook=snake)
            job = spec.get("job") or {}
            task = spec["task"]
            return cls(spec.get("cluster", {}), task["type"], int(task.get("index", 0)),
                       str(task["trial"]) if task.get("trial") else None,
                       json.loads(job, object_hook=snake) if isinstance(job, str) else job)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ClusterSpecError(f"CLUSTER_SPEC is malformed ({type(e).__name__}: {e}); "
                                   'expected {"cluster": {"workerpool0": ["host:port"], ...}, '
                                   '"task": {"type": ..., "index": ...}}') from e


# In a custom container Vertex AI restarts a job (up to three times) after exit 134 or 139 only,
# and restarts a job whose VM was preempted (Spot) or maintained on its own, whatever the exit
# code. So a SIGTERM exits 134 only when Compute Engine says the VM is going (`host_is_going`): a
# cancel, the job's timeout or another replica's failure exits 143 (128 + SIGTERM), never retried.
RESTARTABLE_EXIT_CODE = 134
PERMANENT_STOP_EXIT_CODE = 143

# The launcher creates LAUNCHER_SIGTERM in this folder when it passes a SIGTERM on to the trainers:
# one without it comes from torchrun stopping the ranks after another failed.
PREEMPTED_MARKERS_ENV = "NLI_PREEMPTED_MARKERS"
LAUNCHER_SIGTERM = "launcher-sigterm"
# google-auth's override of the metadata server's host (default metadata.google.internal).
METADATA_HOST_ENV = "GCE_METADATA_HOST"


def host_is_going(env=os.environ, timeout_s: float = 1.0) -> bool:
    """Whether Compute Engine's metadata server says this VM is being preempted (`instance/
    preempted` is TRUE: "Detect if a VM is preempted") or stopped for host maintenance
    (`instance/maintenance-event` is not NONE: "Handle GPU host maintenance events"). No answer
    (no metadata server, as off Google Cloud) is no."""
    root = f"http://{env.get(METADATA_HOST_ENV, 'metadata.google.internal')}/computeMetadata/v1/"
    answers = {}
    for key in ("instance/preempted", "instance/maintenance-event"):
        request = urllib.request.Request(root + key, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                answers[key] = response.read().decode().strip()
        except (OSError, ValueError):
            return False
    return answers["instance/preempted"] == "TRUE" or \
        answers["instance/maintenance-event"] not in ("NONE", "")


def stopped_code(env: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """(exit code, why) after a SIGTERM: 134, which Vertex AI retries, when the VM is being
    preempted or maintained; else 143: a cancel, the job's timeout, or torchrun stopping the ranks
    after another one failed."""
    if not stopped_by_torchrun_after_a_failure(env) and host_is_going(env):
        return RESTARTABLE_EXIT_CODE, (", an exit code Vertex AI retries: Compute Engine is "
                                       "preempting or maintaining this VM")
    return PERMANENT_STOP_EXIT_CODE, (", an exit Vertex AI does not retry (a cancel, the job's "
                                      "timeout or another replica's failure: the VM is not going)")


def stopped_by_torchrun_after_a_failure(env: Mapping[str, str] = os.environ) -> bool:
    """Under `vertex.launch`, a SIGTERM the launcher did not pass on comes from torchrun stopping
    the surviving ranks after one failed."""
    markers = env.get(PREEMPTED_MARKERS_ENV)
    return bool(markers) and not os.path.exists(os.path.join(markers, LAUNCHER_SIGTERM))


def exit_before_training(signum: int, frame=None) -> None:
    """The entry point's and the launcher's SIGTERM handler until training starts (then
    `run.sigterm_times`, or the launcher passing it on to torchrun, takes over). Without it the
    imports and loading (seconds to minutes) die by the signal or, as a container's PID 1, ignore
    it until SIGKILL. Nothing is lost yet: exit at once, with the code a stopped run gives."""
    code, why = stopped_code()
    os.write(2, f"SIGTERM before training started: exiting {code}{why}\n".encode())
    os._exit(code)
