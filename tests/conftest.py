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


def skip_without_real_data(why: str) -> None:
    """Skip, saying why, on a clone with no MultiNLI beside it; where NLI_REQUIRE_REAL_DATA=1 (.ci/run, which has
    ../shared/data), fail instead: there a missing file is a broken set-up, not a newcomer's machine."""
    if os.environ.get("NLI_REQUIRE_REAL_DATA") == "1":
        pytest.fail(f"{why}, and NLI_REQUIRE_REAL_DATA=1 says it must be here")
    pytest.skip(f"{why}: this test needs real MultiNLI (../shared/data/README.md; make test sets NLI_REAL_DATA "
                "where ../shared/data has it)")


@pytest.fixture(scope="session")
def real_data_path() -> Path:
    """The real MultiNLI dev_matched file. Unset variable: skip (fail under NLI_REQUIRE_REAL_DATA=1). Set but
    missing: fail, never skip."""
    value = os.environ.get("NLI_REAL_DATA")
    if not value:
        skip_without_real_data("NLI_REAL_DATA is not set")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"NLI_REAL_DATA={value} does not exist; see ../shared/data/README.md")
    return path


@pytest.fixture(scope="session")
def mnli_subset():
    """The `mnli-subset` splits: real MultiNLI from ../shared/data (or a cached hub copy); skip where neither is."""
    from nli_helpers import mnli
    from nli_helpers.data import MNLI_SUBSET, load_nli_splits

    try:
        mnli.find_dev_matched()
    except mnli.NotFound as e:
        skip_without_real_data(str(e))
    return load_nli_splits(MNLI_SUBSET)


@pytest.fixture(scope="session")
def sample_splits():
    from nli_helpers.data import load_nli_splits

    return load_nli_splits("sample")


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from tests.tiny_model import tiny_model

    return tiny_model()
