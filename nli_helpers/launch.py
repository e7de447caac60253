"""Start the trainer on every process of this node through torchrun: the Vertex AI multi-worker entry.

    python -m nli_helpers.launch -- --profile full --epochs 2          # on each Vertex replica
    python -m nli_helpers.launch --nproc-per-node 2 -- --profile smoke  # two CPU processes here
    python -m nli_helpers.launch --dry-run -- --profile smoke           # print the command only

It reads Vertex's CLUSTER_SPEC (see `distributed.cluster_layout`), chooses one process per visible
GPU (one on a CPU), and replaces itself with torchrun, which sets RANK / LOCAL_RANK / WORLD_SIZE
for each process. On a Reduction Server replica it refuses: those run Google's own image.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .distributed import cluster_layout, processes_per_node, torchrun_command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, task_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m nli_helpers.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, default=None, help="default: visible GPUs, or 1 on a CPU")
    parser.add_argument("--rendezvous-timeout", type=int, default=1800, help="seconds to wait for every node")
    parser.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts of failed workers")
    parser.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    args = parser.parse_args(ours)
    layout = cluster_layout()
    if layout.role == "reduction_server":
        print("error: this replica is in the Reduction Server pool; give that pool the reduction-server "
              "container image, not the trainer", file=sys.stderr)
        return 2
    command = torchrun_command(layout, args.nproc_per_node or processes_per_node(), task_args,
                               rendezvous_timeout_s=args.rendezvous_timeout, max_restarts=args.max_restarts)
    print(f"[launch] {layout.role} node {layout.node_rank}/{layout.nnodes}: {shlex.join(command)}", flush=True)
    if args.dry_run:
        return 0
    os.execv(command[0], command)
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
