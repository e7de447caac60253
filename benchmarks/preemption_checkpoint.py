"""How long a preempted trainer takes from SIGTERM to a complete checkpoint, and to its exit.

Starts `python -m nli_helpers.vertex.entry` (the trainer image's entry point) on the smoke model (MiniLM-L6, 22.7M parameters) with AIP_CHECKPOINT_DIR set,
as Vertex AI sets it, sends SIGTERM once it has logged a few steps, and reads what the trainer reports ("checkpoint
saved to ... N s after the signal") and when it exits. Checkpoints go to a local folder and to gs:// on the Cloud
Storage emulator (in this process, on loopback), each `--repeats` times:

    python benchmarks/preemption_checkpoint.py --out runs/preemption.json      # about 2 minutes on 2 cores

The checkpoint holds the fp32 weights and AdamW's two moments: 12 bytes a parameter. benchmarks/README.md turns
the measured rates into the arithmetic for roberta-base (125M parameters, about 1.5 GB) on a Spot VM, which Compute
Engine powers off 30 s after its preemption notice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
SAVED = re.compile(r"checkpoint saved to (\S+) ([\d.]+) s after the signal")


def run_once(checkpoint_dir: str, output_dir: Path, env: dict) -> dict:
    """Train until step 6, SIGTERM, and time the checkpoint and the exit."""
    args = ["--profile", "smoke", "--data", "sample", "--num_train_epochs", "2", "--per_device_train_batch_size", "8",
            "--logging_steps", "2", "--precision", "fp32", "--output_dir", str(output_dir)]
    run_env = {**env, "AIP_CHECKPOINT_DIR": checkpoint_dir, "OMP_NUM_THREADS": "1"}
    log = output_dir.parent / f"{output_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.vertex.entry", *args], cwd=ROOT, env=run_env,
                                stdout=out, stderr=subprocess.STDOUT)
        while not re.search(r"^step ([6-9]|\d\d+)/", log.read_text(), re.M):
            if proc.poll() is not None:
                raise RuntimeError(f"the trainer ended before step 6:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=600)
        exited = time.monotonic() - sent
    text = log.read_text()
    found = SAVED.search(text)
    if code != 134 or not found:
        raise RuntimeError(f"exit {code}, no checkpoint report:\n{text[-2000:]}")
    return {"exit_code": code, "to_checkpoint_s": float(found.group(2)), "to_exit_s": exited,
            "checkpoint": found.group(1)}


def checkpoint_bytes(local_root: Path) -> int:
    newest = max(local_root.glob("checkpoint-*"))
    return sum(f.stat().st_size for f in newest.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the JSON results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from types import SimpleNamespace

    from localcloud.gcs import start_emulator
    from localcloud.replica import METADATA_HOST_ENV, MetadataServer

    emulator = start_emulator()
    emulator.make_bucket("preemption")
    # The VM's metadata server says it is being preempted, as a Spot VM's does: the trainer then exits 134.
    metadata = MetadataServer(SimpleNamespace(preempted="spot"))
    env = {**os.environ, **emulator.env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           METADATA_HOST_ENV: f"127.0.0.1:{metadata.server_address[1]}"}
    results: dict[str, list[dict]] = {"local": [], "gcs_emulator": []}
    size = None
    try:
        with tempfile.TemporaryDirectory(prefix="nli-preemption-") as tmp:
            for i in range(args.repeats):  # alternate, so that a drifting machine hits both alike
                local = Path(tmp) / f"local-{i}"
                results["local"].append(run_once(str(local / "checkpoints"), local / "job", env))
                size = size or checkpoint_bytes(local / "checkpoints")
                gcs = f"gs://preemption/run-{i}/checkpoints"
                results["gcs_emulator"].append(run_once(gcs, Path(tmp) / f"gcs-{i}" / "job", env))
    finally:
        emulator.stop()
        metadata.shutdown()
    summary = {where: {key: median(r[key] for r in runs) for key in ("to_checkpoint_s", "to_exit_s")}
               for where, runs in results.items()}
    report = {"model": "minilm-l6", "checkpoint_bytes": size, "median": summary, "runs": results,
              "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    print(f"checkpoint: {size / 1e6:.0f} MB (MiniLM-L6 weights + AdamW moments, fp32)")
    print("| checkpoint dir | SIGTERM -> checkpoint complete (s) | SIGTERM -> exit (s) |")
    print("| --- | --- | --- |")
    for where, row in summary.items():
        print(f"| {where} | {row['to_checkpoint_s']:.2f} | {row['to_exit_s']:.2f} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
