"""Shared fixtures: the bundled sample, a tiny model, the real MultiNLI file named by NLI_REAL_DATA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_task  # noqa: F401  (re-exported for older imports)

pytest_plugins = ["tests.gcs_emulator"]  # a real Cloud Storage emulator on loopback

# Offline everywhere: the hub is unreachable on the build machines, fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def real_data_path() -> Path:
    """The real MultiNLI dev_matched file. Unset variable: skip. Set but missing: fail, never skip."""
    value = os.environ.get("NLI_REAL_DATA")
    if not value:
        pytest.skip("NLI_REAL_DATA is not set (make test and .ci/run set it)")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"NLI_REAL_DATA={value} does not exist; see ../shared/data/README.md")
    return path


@pytest.fixture(scope="session")
def sample_splits():
    from nli_helpers.data import load_nli_splits

    return load_nli_splits("sample")


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from nli_helpers.model import tiny_random_path

    return str(tiny_random_path())
