"""Local stand-ins for Google Cloud while nbval runs notebooks 04 and 05 (Vertex AI) in CI; nothing to do for the others.

Before the kernel of `04_submit_vertex.ipynb` (or `05_tune_hyperparameters.ipynb`) starts, this starts
`localcloud.LocalCloud`: the Cloud Storage emulator and the fake of the Vertex AI REST surface on free loopback
ports, a staging bucket, and the variables the notebook reads from the environment:

    STORAGE_EMULATOR_HOST     nli_helpers.storage uses the emulator, with anonymous credentials
    NLI_VERTEX_API_ENDPOINT   vertex.init_vertex uses the fake (a plain-HTTP endpoint: anonymous credentials)
    GOOGLE_CLOUD_PROJECT      the project the notebook submits to
    NLI_STAGING_BUCKET        the gs:// bucket for the staged sdist and the job outputs

The notebook runs exactly the production code path; nothing in it knows it is under test. The fake runs each job's
replicas in the trainer image's stand-in (localcloud/image.py: cached by the sdist's content, so shared with
notebook 03 and the Vertex tests). After the notebook's last cell the servers stop and the environment is
restored. For papermill runs, `python -m localcloud -- papermill ...` does the same around any command.

Why hooks and not a session-scoped autouse fixture: nbval's cells are plain pytest Items, not test functions, so
pytest sets up no fixtures for them (checked with nbval 0.11 and pytest 9: such a fixture never runs). nbval
starts the kernel in the setup of a notebook's first cell, as a child of pytest, with a copy of os.environ;
`pytest_runtest_setup` here runs just before that (conftest hooks run before the built-in one), so the kernel
inherits the variables.
"""

from __future__ import annotations

import pytest

from localcloud import LocalCloud

CLOUD_NOTEBOOKS = ("04_submit_vertex.ipynb", "05_tune_hyperparameters.ipynb")
_running: dict[str, LocalCloud] = {}


def _is_cloud_notebook(item: pytest.Item | None) -> bool:
    return item is not None and item.path.name in CLOUD_NOTEBOOKS


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _is_cloud_notebook(item) and "cloud" not in _running:
        _running["cloud"] = LocalCloud()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if "cloud" in _running and not _is_cloud_notebook(nextitem):
        _running.pop("cloud").stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    if "cloud" in _running:
        _running.pop("cloud").stop()
