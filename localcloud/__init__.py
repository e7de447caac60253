"""Google Cloud on this machine: a Cloud Storage emulator and a fake of Vertex AI whose jobs really train.

What `make demo`, the notebooks under nbval and the tests use instead of the cloud, offline:

    python -m localcloud -- papermill notebooks/04_submit_vertex.ipynb runs/04.ipynb -f notebooks/params/smoke.yaml

    with LocalCloud() as cloud:       # STORAGE_EMULATOR_HOST, NLI_VERTEX_API_ENDPOINT, ... point at it
        ...                           # nli_helpers.vertex / files calls go to the local stand-ins

* gcs.py: gcp-storage-emulator, in memory on a free loopback port.
* vertex.py: the customJobs REST surface the real aiplatform SDK calls; with `run_jobs` each replica runs as a
  local process group (replica.py) under the rules of rules.py, each quoting the Vertex AI page it models;
  tuning.py adds hyperparameter-tuning jobs whose trials run as child jobs.
* image.py: the trainer image's stand-in, a venv built as docker/Dockerfile builds the image and cached by the
  sdist's content (image.image_venv), so it is built once for notebook 03, the fake's jobs and
  the tests.

Not part of the nli_helpers distribution: a project of its own (pyproject.toml here), installed editable beside
the package by `make venv` and environment.yml.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LocalCloud", "environment"]  # the parts: localcloud.gcs, .vertex, .image, .replica


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set these variables (and drop the cached Cloud Storage filesystems that read the old ones); restore them
    after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    _forget_storage_client()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _forget_storage_client()


def _forget_storage_client() -> None:
    # fsspec caches each gcsfs filesystem, which reads STORAGE_EMULATOR_HOST when it is created; if nothing
    # imported gcsfs there is nothing to forget.
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is not None:
        gcsfs.GCSFileSystem.clear_instance_cache()


class LocalCloud:
    """The Cloud Storage emulator and a job-running Vertex fake, with the environment variables pointing at them.

    What notebooks 04 and 05 read: STORAGE_EMULATOR_HOST (gcsfs and google-cloud-storage), NLI_VERTEX_API_ENDPOINT,
    GOOGLE_CLOUD_PROJECT and NLI_STAGING_BUCKET (vertex.init_vertex). The trainer image the notebooks use by
    default (vertex.trainer_image_uri(project, region)) is registered, backed by its stand-in.
    """

    project = "nli-notebooks-ci"
    bucket = "nli-notebooks-ci-staging"
    region = "us-central1"

    def __init__(self) -> None:
        # Here, not at import: a test that needs one free port (localcloud.replica) imports this package on
        # machines without the emulator's packages (the GPU check's).
        from localcloud.gcs import start_emulator
        from localcloud.image import project_sdist, trainer_image_python
        from localcloud.vertex import FakeVertex
        from nli_helpers.vertex import API_ENDPOINT_ENV, trainer_image_uri

        self.tmp = Path(tempfile.mkdtemp(prefix="nli-local-cloud-"))
        self.emulator = start_emulator()
        self.emulator.make_bucket(self.bucket, location=self.region)  # in the jobs' region, as preflight asks
        self.fake = FakeVertex(run_jobs=True)
        self.image_uri = trainer_image_uri(self.project, self.region)
        self.fake.register_image(self.image_uri, trainer_image_python(project_sdist(self.tmp / "dist")))
        self.env = {**self.emulator.env, API_ENDPOINT_ENV: self.fake.endpoint, "GOOGLE_CLOUD_PROJECT": self.project,
                    "NLI_STAGING_BUCKET": f"gs://{self.bucket}"}
        self._environment = environment(self.env)  # the fake's jobs and this process's clients read them too
        self._environment.__enter__()

    def stop(self) -> None:
        """Stop both servers and restore the environment. The image stand-in stays cached for the next run."""
        self.fake.close()
        self.emulator.stop()
        self._environment.__exit__(None, None, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> LocalCloud:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
