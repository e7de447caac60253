"""Pytest set-up shared by tests/ and notebooks/: each pytest-xdist worker gets its share of the cores.

`make test` runs one worker per core (`-n auto`). torch (and every training subprocess, notebook kernel and fake
Vertex job started from a worker, which inherit the variable) would otherwise start one OpenMP thread per core in
every worker; on 2 cores, 2 workers x 2 threads made a sample of the suite 1.5x slower than 2 x 1 thread (measured
side by side, benchmarks/README.md). A value you set yourself is kept.
"""

import os

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))  # before anything imports torch
