"""Pytest set-up shared by tests/ and notebooks/: each pytest-xdist worker gets its share of the cores.

`make test` runs one worker per core (`-n auto`). torch (and every training subprocess, notebook kernel and fake
Vertex job started from a worker, which inherit the variable) would otherwise start one OpenMP thread per core in
every worker; on 2 cores, 2 workers x 2 threads made a sample of the suite 1.5x slower than 2 x 1 thread (measured
side by side, benchmarks/README.md). A value you set yourself is kept.
"""

import os

# gcsfs decides when it is first imported whether to probe every bucket's layout over the Storage
# Control API (gRPC), which the Cloud Storage emulator does not serve: a probe then retries for a
# minute or more per bucket, and every test makes its own bucket. localcloud's EMULATOR_ENV says
# "false" too, but only from the moment the emulator starts: a test that touched gs:// before that
# had already imported gcsfs with the probe on, for the rest of the worker's tests.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))  # before anything imports torch


def pytest_collection_modifyitems(config, items):
    """The longest files first: files with a `slow` test, then the notebooks, then the rest.

    pytest-xdist hands each worker one file at a time (`--dist loadfile`); `make test` keeps this order
    (`--no-loadscope-reorder`, where xdist would put files with few tests, the slow ones among them, last).
    A two-minute file started last keeps one worker busy while the other has nothing left to do.
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        return 0 if item.path in slow_files else 1 if item.path.suffix == ".ipynb" else 2

    items.sort(key=rank)  # stable: the order within each file, and of files within a rank, is kept
