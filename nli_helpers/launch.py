"""Start the trainer on every process of this node through torchrun: the Vertex AI multi-worker entry.

    python -m nli_helpers.launch -- --profile full --epochs 2          # on each Vertex replica
    python -m nli_helpers.launch --nproc-per-node 2 -- --profile smoke  # two CPU processes here
    python -m nli_helpers.launch --dry-run -- --profile smoke           # print the command only

It reads Vertex's CLUSTER_SPEC (see `distributed.cluster_layout`), chooses one process per visible
GPU (one on a CPU), and runs torchrun, which sets RANK / LOCAL_RANK / WORLD_SIZE for each process.
On a Reduction Server replica it refuses: those run Google's own image.

Preemption. On Vertex the container's first process (this one) gets the SIGTERM. It passes it to
torchrun, which passes it to every trainer process; they stop at the same optimizer step, rank 0
writes a checkpoint, and they exit with `train.RESTARTABLE_EXIT_CODE`. torchrun gives them
`--shutdown-timeout` seconds (default here 300, torch's own is 30) before it kills them: a
roberta-base checkpoint (weights and AdamW state, about 1.5 GB) needs about 10-20 s to reach Cloud
Storage from a GPU VM, and a Spot VM is powered off 30 s after its preemption notice. torchrun
itself exits 1 whatever its workers did, so this launcher exits with the trainer's restartable code
when the trainers were preempted, and with torchrun's code otherwise.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .distributed import cluster_layout, processes_per_node, torchrun_command

# Each trainer process that stops for a SIGTERM leaves a file in this folder (see task.main).
PREEMPTED_MARKERS_ENV = "NLI_PREEMPTED_MARKERS"
RESTARTABLE_EXIT_CODE = 134  # = train.RESTARTABLE_EXIT_CODE (not imported: this module must not load torch first)
SHUTDOWN_TIMEOUT_S = 300


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, task_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m nli_helpers.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, default=None, help="default: visible GPUs, or 1 on a CPU")
    parser.add_argument("--rendezvous-timeout", type=int, default=1800, help="seconds to wait for every node")
    parser.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts of failed workers")
    parser.add_argument("--shutdown-timeout", type=int, default=SHUTDOWN_TIMEOUT_S,
                        help="seconds torchrun gives the trainers after a SIGTERM to checkpoint and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    args = parser.parse_args(ours)
    layout = cluster_layout()
    if layout.role == "reduction_server":
        print("error: this replica is in the Reduction Server pool; give that pool the reduction-server "
              "container image, not the trainer", file=sys.stderr)
        return 2
    command = torchrun_command(layout, args.nproc_per_node or processes_per_node(), task_args,
                               rendezvous_timeout_s=args.rendezvous_timeout, max_restarts=args.max_restarts,
                               shutdown_timeout_s=args.shutdown_timeout)
    print(f"[launch] {layout.role} node {layout.node_rank}/{layout.nnodes}: {shlex.join(command)}", flush=True)
    if args.dry_run:
        return 0
    return run_torchrun(command)


def run_torchrun(command: list[str]) -> int:
    """Run torchrun as a child, pass SIGTERM/SIGINT on to it, and turn a preemption into the restartable code."""
    markers = Path(tempfile.mkdtemp(prefix="nli-preempted-"))
    signalled = []
    try:
        child = subprocess.Popen(command, env={**os.environ, PREEMPTED_MARKERS_ENV: str(markers)})

        def forward(signum, frame):
            signalled.append(signum)
            (markers / "launcher-sigterm").touch()  # the trainers then checkpoint (see train.py)
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        preempted = sorted(p.name for p in markers.iterdir() if p.name.startswith("rank-"))
    finally:
        shutil.rmtree(markers, ignore_errors=True)
    if preempted or (signalled and code != 0):
        print(f"[launch] preempted ({', '.join(preempted) or 'signal'}): exiting {RESTARTABLE_EXIT_CODE}, an exit code "
              "Vertex AI retries; the restarted job resumes from the newest checkpoint", file=sys.stderr, flush=True)
        return RESTARTABLE_EXIT_CODE
    return code


if __name__ == "__main__":
    sys.exit(main())
