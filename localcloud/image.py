"""The trainer image's stand-in: docker/Dockerfile's packages in a venv on this machine's Python.

The image is python:3.11 with the torch constraints.txt pins (its cu126 CUDA build there, the CPU build here) and
`pip install .[smoke,vertex]` under constraints.txt; nli_helpers.vertex.packaging.image_venv builds exactly that from the
project's sdist, cached by the sdist's content, so it is built once and reused until the package changes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from nli_helpers.vertex import packaging

# The image name the tests register with their fakes (the notebooks use vertex.trainer_image_uri's).
TRAINER_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/trainer:test"
_lock = threading.Lock()
_sdist: Path | None = None


def project_sdist(folder: Path) -> Path:
    """The project's sdist, built (into `folder`) once per process, and again if its folder has been removed since
    (a LocalCloud removes its own when it stops)."""
    global _sdist
    with _lock:
        if _sdist is None or not _sdist.is_file():
            _sdist = packaging.build_sdist(folder)
        return _sdist


def trainer_image_python(sdist: Path) -> Path:
    """The python of the image stand-in built from this sdist (with the [smoke,vertex] extras, as the Dockerfile does)."""
    return packaging.image_venv(sdist).python
