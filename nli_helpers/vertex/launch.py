"""Start the trainer on every process of this node through torchrun: Vertex AI's multi-node entry.

    python -m nli_helpers.vertex.launch -- --profile full                     # on each replica
    python -m nli_helpers.vertex.launch --nproc-per-node 2 -- --profile smoke  # 2 CPU processes
    python -m nli_helpers.vertex.launch --dry-run -- --profile smoke           # print the command

One process per visible GPU (one on a CPU), nodes from Vertex's CLUSTER_SPEC. A SIGTERM
(preemption) goes on to the trainers (`vertex.entry`), which checkpoint and exit 134; torchrun
itself exits 1 whatever its workers did, so this launcher turns a preemption back into the code
Vertex retries.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nli_helpers.config import NLIError

from .environment import (
    CLUSTER_SPEC_ENV,
    LAUNCHER_SIGTERM,
    PREEMPTED_MARKERS_ENV,
    ClusterSpec,
    ClusterSpecError,
    exit_before_training,
    stopped_code,
)

ENTRY_MODULE = "nli_helpers.vertex.entry"  # what torchrun starts on every process
# torchrun's default 30 s can cut a checkpoint's upload short (benchmarks/README.md, "Preemption").
SHUTDOWN_TIMEOUT_S = 300
REDUCTION_SERVER_POOL = "workerpool2"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class ClusterLayout:
    """What torchrun needs to know on this replica."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    role: str  # "chief", "worker", "reduction_server" or "evaluator"
    reducers: int = 0  # replicas of the Reduction Server pool


def cluster_layout(cluster_spec: str | dict | None = None,
                   env: Mapping[str, str] = os.environ) -> ClusterLayout:
    """nnodes / node rank / master from Vertex's CLUSTER_SPEC (`cluster_spec`, else the
    environment's; a single node without one). Training nodes are the chief (pool 0), then the
    workers (pool 1); Reduction Server replicas (pool 2) run Google's image, not torch."""
    spec = ClusterSpec.parse(cluster_spec or env.get(CLUSTER_SPEC_ENV))
    if spec is None:
        return ClusterLayout(1, 0, env.get("MASTER_ADDR", "127.0.0.1"),
                             int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)), "chief")
    if not spec.cluster.get("workerpool0"):
        raise ClusterSpecError("CLUSTER_SPEC is malformed: its cluster has no workerpool0 (the "
                               "chief), whose address every node meets at")
    chief = spec.cluster["workerpool0"][0]
    host, _, port = chief.rpartition(":") if ":" in chief else (chief, "", "")
    role = {"workerpool0": "chief", "workerpool1": "worker",
            REDUCTION_SERVER_POOL: "reduction_server"}.get(spec.pool, "evaluator")
    node_rank = {"workerpool0": 0, "workerpool1": spec.index + 1}.get(spec.pool, -1)
    return ClusterLayout(1 + len(spec.cluster.get("workerpool1", [])), node_rank, host,
                         int(port or DEFAULT_MASTER_PORT), role,
                         len(spec.cluster.get(REDUCTION_SERVER_POOL, [])))


def visible_gpus() -> int:
    import torch  # lazily: --help and the signal handler come first

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torchrun_command(layout: ClusterLayout, nproc_per_node: int, task_args: list[str], *,
                     rendezvous_timeout_s: int = 1800, max_restarts: int = 0,
                     shutdown_timeout_s: int | None = None) -> list[str]:
    """The torchrun command for this node: static rendezvous at the chief, whose address Vertex
    gives every replica. Vertex starts replicas minutes apart, so the rendezvous waits 30 minutes
    (torch's default: 10) instead of failing the job. --shutdown-timeout needs the image's torch
    (2.13; pytorch/pytorch#172596 came after 2.6)."""
    shutdown = [f"--shutdown-timeout={shutdown_timeout_s}"] if shutdown_timeout_s else []
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={layout.nnodes}", f"--node-rank={layout.node_rank}",
            f"--nproc-per-node={nproc_per_node}",
            f"--master-addr={layout.master_addr}", f"--master-port={layout.master_port}",
            f"--rdzv-conf=timeout={rendezvous_timeout_s}", f"--max-restarts={max_restarts}",
            *shutdown, "--module", ENTRY_MODULE, *task_args]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, task_args = ((argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv
                       else (argv, []))
    parser = argparse.ArgumentParser(prog="python -m nli_helpers.vertex.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="default: visible GPUs, or 1 on a CPU")
    parser.add_argument("--rendezvous-timeout", type=int, default=1800,
                        help="seconds to wait for every node")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="torchrun restarts of failed workers")
    parser.add_argument("--shutdown-timeout", type=int, default=SHUTDOWN_TIMEOUT_S,
                        help="seconds torchrun gives the trainers after a SIGTERM to checkpoint "
                        "and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the torchrun command and exit")
    parser.add_argument("--check-nccl-plugin", action="store_true",
                        help="exit 0 where this torch's NCCL loads the Reduction Server's network "
                        "plugin, else 2 (docker/Dockerfile's build runs it)")
    args = parser.parse_args(ours)
    try:
        if args.check_nccl_plugin:
            return check_image_nccl_plugin()
        layout = cluster_layout()
        if layout.role == "reduction_server":
            raise NLIError("this replica is in the Reduction Server pool; give that pool the "
                           "reduction-server container image, not the trainer")
        check_reduction_server_plugin(layout)
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    nproc = args.nproc_per_node or visible_gpus() or 1  # one process per GPU, one on a CPU
    command = torchrun_command(layout, nproc, task_args, max_restarts=args.max_restarts,
                               rendezvous_timeout_s=args.rendezvous_timeout,
                               shutdown_timeout_s=args.shutdown_timeout)
    avoid_a_small_shm(nproc)
    print(f"[launch] {layout.role} node {layout.node_rank}/{layout.nnodes}: "
          f"{shlex.join(command)}", flush=True)
    if args.dry_run:
        return 0
    return run_torchrun(command)


def check_image_nccl_plugin() -> int:
    """The image build's check: this torch's NCCL is in the table, and loads the plugin."""
    nccl = image_nccl_version()
    problem = nccl_plugin_problem(nccl)
    if problem:
        raise NLIError(f"the Reduction Server's NCCL plugin would not load: {problem}")
    print(f"NCCL {'.'.join(map(str, nccl))} loads the Reduction Server's network plugin")
    return 0


def avoid_a_small_shm(nproc: int, path: str = "/dev/shm") -> None:
    """NCCL's shared-memory transport between a node's GPUs makes its segments in /dev/shm, which
    a container may get at Docker's 64 MB: with several GPUs a job then fails at its first
    collective ("Error while creating shared memory segment", python-aiplatform#3434). Under
    1 GiB, NCCL_SHM_DISABLE=1 (NVIDIA's NCCL environment variables page): NVLink, PCIe P2P or
    sockets carry the traffic instead."""
    size = shutil.disk_usage(path).total if os.path.isdir(path) else 2**40
    if nproc > 1 and size < 2**30 and "NCCL_SHM_DISABLE" not in os.environ:
        os.environ["NCCL_SHM_DISABLE"] = "1"
        print(f"[launch] {path} holds {size / 2**20:.0f} MB, too little for NCCL's shared memory "
              "between GPUs: NCCL_SHM_DISABLE=1", file=sys.stderr)


# The network-plugin API versions NCCL looks up, as `ncclNetPlugin_vN` symbols, by release
# (NVIDIA/nccl src/plugin/net.cc `ncclNetVersion[]`: {12, ..., 6} from 2.30.3, {11, ..., 6} in 2.28
# and 2.29, {10, ..., 6} in 2.27). For older NCCL its own log says whether it loaded the plugin.
NCCL_NET_PLUGIN_VERSIONS = (((2, 30, 3), range(6, 13)), ((2, 28, 0), range(6, 12)),
                            ((2, 27, 0), range(6, 11)))


def nccl_plugin_problem(nccl: tuple[int, ...], name: str = "nccl-net") -> str | None:
    """Why NCCL `nccl` would not load the network plugin lib`name`.so, or None. "When NCCL is
    initialized, it will look for a `libnccl-net.so` library and dynamically load it", or
    `libnccl-net-${NCCL_NET_PLUGIN}.so` (NVIDIA/nccl ext-net/README.md), as the dynamic linker
    finds it (ctypes.util.find_library follows it); it then takes the newest symbol it supports,
    and without one falls back to its own transport ("External network plugin ... is
    unsupported", 2.28.3 on)."""
    versions = next((v for since, v in NCCL_NET_PLUGIN_VERSIONS if tuple(nccl) >= since), None)
    if versions is None:
        oldest = ".".join(map(str, NCCL_NET_PLUGIN_VERSIONS[-1][0]))
        return (f"this torch's NCCL ({'.'.join(map(str, nccl)) or 'none'}) is older than {oldest}, "
                "whose plugin versions the check knows")
    library = ctypes.util.find_library(name)
    if library is None:
        return f"there is no lib{name}.so here"
    try:
        loaded = ctypes.CDLL(library)
        exported = [v for v in versions if hasattr(loaded, f"ncclNetPlugin_v{v}")]
    except OSError as e:
        return f"{library} does not load ({e})"
    if not exported:
        return (f"{library} exports none of the ncclNetPlugin_v{versions[0]}..v{versions[-1]} "
                f"symbols that NCCL {'.'.join(map(str, nccl))} loads")
    return None


def check_reduction_server_plugin(layout: ClusterLayout) -> None:
    """With a Reduction Server pool, a training node's NCCL must load Google's network plugin (the
    `google-reduction-server` package of docker/Dockerfile); else it reduces among the GPU nodes
    as always and the reducers are billed for nothing, so the node stops at once. NCCL_DEBUG=INFO
    with NCCL_DEBUG_SUBSYS=INIT,NET makes NCCL log what it loaded, as Google's Reduction Server
    sample Dockerfiles set NCCL_DEBUG=INFO (the subsystem filter is ours: the rest stays quiet)."""
    if not layout.reducers or layout.role not in ("chief", "worker"):
        return
    if not visible_gpus():  # gloo on the CPU (the stand-in): no NCCL here
        print(f"[launch] {layout.reducers} Reduction Server replica(s), but no CUDA GPU here: gloo "
              "reduces, without NCCL or its plugin", file=sys.stderr, flush=True)
        return
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    plugin = "nccl-net" + (f"-{os.environ['NCCL_NET_PLUGIN']}" if os.environ.get("NCCL_NET_PLUGIN")
                           else "")
    problem = nccl_plugin_problem(image_nccl_version(), plugin)
    if problem:
        raise NLIError(f"{layout.reducers} Reduction Server replica(s) would be billed for "
                       f"nothing: {problem}. Build the image from docker/Dockerfile (it "
                       "installs the google-reduction-server package and checks it), or drop "
                       "the Reduction Server pool")
    print(f"[launch] {layout.reducers} Reduction Server replica(s): NCCL's network plugin "
          f"lib{plugin}.so loads; NCCL's NET lines below say so", file=sys.stderr, flush=True)


def image_nccl_version() -> tuple[int, ...]:
    """The NCCL that torch loads here; () on a torch built without NCCL (a CPU build)."""
    import torch

    try:
        return tuple(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):
        return ()


def run_torchrun(command: list[str]) -> int:
    """Run torchrun as a child, pass SIGTERM/SIGINT on to it, and turn a preemption into the
    restartable code."""
    markers = Path(tempfile.mkdtemp(prefix="nli-preempted-"))
    signalled = []
    try:
        child = subprocess.Popen(command, env={**os.environ, PREEMPTED_MARKERS_ENV: str(markers)})

        def forward(signum, frame):
            signalled.append(signum)
            (markers / LAUNCHER_SIGTERM).touch()  # the trainers then checkpoint (entry.py)
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        shutil.rmtree(markers, ignore_errors=True)
    if signalled and code != 0:  # torchrun itself exits 1, whatever its trainers did
        code, why = stopped_code()
        print(f"[launch] stopped by a signal: exiting {code}{why}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_before_training)  # run_torchrun passes later ones on
    sys.exit(main())
