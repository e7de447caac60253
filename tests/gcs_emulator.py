"""Pytest fixtures over localcloud's Cloud Storage emulator (localcloud/gcs.py).

Enabled from tests/conftest.py with `pytest_plugins = ["tests.gcs_emulator"]`. Then:

    def test_round_trip(gcs_bucket):          # a fresh, empty bucket per test
        files.put("model/", f"gs://{gcs_bucket}/model")

`gcs_emulator` (session-scoped) starts the emulator once and points google-cloud-storage (and gcsfs) at it
through STORAGE_EMULATOR_HOST; the environment is restored when the session ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator:
    """The session's in-process Cloud Storage emulator, with the environment pointing at it. Its packages are
    imported here, by the tests that use it: the GPU check runs the rest where they are not installed."""
    from localcloud import environment
    from localcloud.gcs import start_emulator

    emulator = start_emulator()
    try:
        with environment(emulator.env):
            yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
    """A new, empty bucket for this test; returns its name (no gs:// prefix)."""
    return gcs_emulator.make_bucket(f"test-bucket-{next(_bucket_numbers)}")
