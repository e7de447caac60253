"""torch.distributed set-up, from torchrun's environment or from Vertex AI's CLUSTER_SPEC.

Inside a training process (started by torchrun) call `init_distributed()`: it reads `RANK`,
`LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` and joins the process group (NCCL
on GPUs, gloo on CPUs); without those variables it returns a single-process `DistInfo` and
touches nothing.

On Vertex AI every replica starts one container. There `WORLD_SIZE` is the number of *nodes*
and `RANK` the node's rank, not torchrun's per-process values, so the container must not call
`init_process_group` directly: `python -m nli_helpers.launch -- <task args>` reads
`CLUSTER_SPEC` with `cluster_layout()` below and starts torchrun, which sets the per-process
variables correctly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .config import NLIError

# Vertex worker pools: 0 = chief (one replica), 1 = workers, 2 = Reduction Server, 3 = evaluators.
TRAINING_POOLS = ("workerpool0", "workerpool1")
REDUCTION_SERVER_POOL = "workerpool2"
DEFAULT_MASTER_PORT = 29500


class DistributedError(NLIError):
    """The distributed environment is inconsistent (e.g. a malformed CLUSTER_SPEC)."""


@dataclass(frozen=True)
class DistInfo:
    """Who this process is. `world_size == 1` means plain single-process training."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = DistInfo()
# A gloo group beside NCCL, for small flags that live on the CPU (the stop request): agreeing on them must not
# synchronise the GPU stream every step. Under gloo the default group serves.
_control_group = None


def init_distributed(timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group torchrun describes in the environment; single process otherwise."""
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    if info.world_size == 1 or dist.is_initialized():
        return info
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=timeout_minutes))
    global _control_group
    _control_group = dist.new_group(backend="gloo") if cuda else None
    return info


def shutdown_distributed() -> None:
    global _control_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _control_group = None


def device_for(info: DistInfo) -> torch.device:
    return torch.device(f"cuda:{info.local_rank}" if torch.cuda.is_available() else "cpu")


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over every process (identity when single-process)."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def agree_after_step(stop: bool, main_says: bool, info: DistInfo) -> tuple[bool, bool]:
    """(`stop` on any rank, `main_says` on rank 0), the same on every rank: one small CPU
    all-reduce, no GPU sync.

    A SIGTERM may reach one rank first. A decision a clock takes (a time-based checkpoint) is
    rank 0's alone: each rank's clock would cross the line at its own step, and all must act at
    the same one.
    """
    if not info.enabled:
        return stop, main_says
    votes = torch.tensor([int(stop), int(main_says and info.is_main)], dtype=torch.int32)
    dist.all_reduce(votes, op=dist.ReduceOp.SUM, group=_control_group)
    return bool(votes[0]), bool(votes[1])


def broadcast_from_main(obj, info: DistInfo):
    """Rank 0's `obj` on every rank (over the CPU control group)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group)
    return box[0]


def on_main_process(fn, info: DistInfo):
    """Run `fn` on rank 0 only (a save, an upload) and return its result there; every rank learns whether it
    worked, so a failure on rank 0 raises on every rank at once with rank 0's message, instead of leaving the
    others in a barrier until the collective timeout (30 minutes)."""
    result, error = None, None
    if info.is_main:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
    failure = broadcast_from_main(None if error is None else f"{type(error).__name__}: {error}", info)
    if error is not None:
        raise error
    if failure is not None:
        raise DistributedError(f"rank 0 failed, so rank {info.rank} stops too: {failure}")
    return result


def all_gather_objects(obj, info: DistInfo) -> list:
    """Every process's `obj`, in rank order (a one-element list when single-process)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


# -- Vertex AI: CLUSTER_SPEC -> torchrun -------------------------------------------------------
@dataclass(frozen=True)
class ClusterLayout:
    """What torchrun needs to know on this replica."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    role: str  # "chief", "worker", "reduction_server" or "evaluator"


def cluster_layout(cluster_spec: str | dict | None = None, env: dict | None = None) -> ClusterLayout:
    """Work out nnodes / node rank / master from Vertex's CLUSTER_SPEC (or a single node without it).

    CLUSTER_SPEC looks like {"cluster": {"workerpool0": ["host:port"], "workerpool1": [...],
    "workerpool2": [...]}, "task": {"type": "workerpool1", "index": 0}}. Training nodes are the
    chief (pool 0) then the workers (pool 1); Reduction Server replicas (pool 2) are not torch
    nodes: they run Google's reduction-server image and only aggregate gradients.
    """
    env = os.environ if env is None else env
    spec = cluster_spec if cluster_spec is not None else env.get("CLUSTER_SPEC")
    if not spec:
        return ClusterLayout(1, 0, env.get("MASTER_ADDR", "127.0.0.1"),
                             int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)), "chief")
    try:
        spec = json.loads(spec) if isinstance(spec, str) else spec
        cluster, task = spec["cluster"], spec["task"]
        pool, index = task["type"], int(task.get("index", 0))
        chief = cluster["workerpool0"][0]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise DistributedError(f"CLUSTER_SPEC is malformed ({type(e).__name__}: {e}); expected "
                               '{"cluster": {"workerpool0": ["host:port"], ...}, "task": {"type": ..., "index": ...}}') from e
    host, _, port = chief.rpartition(":") if ":" in chief else (chief, "", "")
    workers = len(cluster.get("workerpool1", []))
    role = {"workerpool0": "chief", "workerpool1": "worker", REDUCTION_SERVER_POOL: "reduction_server"}.get(
        pool, "evaluator")
    node_rank = {"workerpool0": 0, "workerpool1": index + 1}.get(pool, -1)
    return ClusterLayout(1 + workers, node_rank, host, int(port or DEFAULT_MASTER_PORT), role)


def processes_per_node() -> int:
    """One process per visible GPU, or one on a CPU-only node."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def torchrun_has_shutdown_timeout() -> bool:
    """torchrun takes --shutdown-timeout (newer torch); older ones always give workers 30 s after a SIGTERM."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    return "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}


def torchrun_command(layout: ClusterLayout, nproc_per_node: int, task_args: list[str], *,
                     rendezvous_timeout_s: int = 1800, max_restarts: int = 0,
                     shutdown_timeout_s: int | None = None) -> list[str]:
    """The torchrun command line for this node (static rendezvous at the chief).

    Vertex starts replicas minutes apart; the rendezvous timeout (default 30 min, torch's default
    is 10) keeps early replicas waiting instead of failing the job. `shutdown_timeout_s`: how long
    torchrun lets the trainers checkpoint after a SIGTERM before it kills them (where torch has it).
    """
    import sys

    shutdown = ([f"--shutdown-timeout={shutdown_timeout_s}"]
                if shutdown_timeout_s is not None and torchrun_has_shutdown_timeout() else [])
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={layout.nnodes}", f"--node-rank={layout.node_rank}",
            f"--nproc-per-node={nproc_per_node}",
            f"--master-addr={layout.master_addr}", f"--master-port={layout.master_port}",
            f"--rdzv-conf=timeout={rendezvous_timeout_s}", f"--max-restarts={max_restarts}", *shutdown,
            "--module", "nli_helpers.task", *task_args]
