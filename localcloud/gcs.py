"""Pytest fixtures that run a real, local Cloud Storage: gcp-storage-emulator, in-process.

Enable them from tests/conftest.py with `pytest_plugins = ["tests.gcs_emulator"]` (or on the
command line: `pytest -p tests.gcs_emulator`). Then:

    def test_round_trip(gcs_bucket):          # a fresh, empty bucket per test
        upload("model/", f"gs://{gcs_bucket}/model")

`gcs_emulator` (session-scoped) starts the emulator once on a free loopback port and points
google-cloud-storage (and gcsfs) at it through STORAGE_EMULATOR_HOST; no credentials or network
are needed, and the environment is restored when the session ends.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from gcp_storage_emulator.server import Server, create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from nli_helpers.storage import get_client

EMULATOR_ENV = {
    "GOOGLE_CLOUD_PROJECT": "local-test",
    # gcsfs probes each bucket for hierarchical-namespace support, which the emulator does not
    # answer, and waits 60 s per bucket unless told not to.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}
_bucket_numbers = itertools.count()


@dataclass
class GcsEmulator:
    """A running emulator: `host` is the STORAGE_EMULATOR_HOST value (http://127.0.0.1:PORT)."""

    host: str
    server: Server

    def client(self) -> storage.Client:
        """A client bound to this emulator whatever the environment says."""
        return storage.Client(project=EMULATOR_ENV["GOOGLE_CLOUD_PROJECT"],
                              credentials=AnonymousCredentials(), client_options={"api_endpoint": self.host})

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (a no-op if it exists) and return the name."""
        client = self.client()
        if client.lookup_bucket(name) is None:
            client.create_bucket(name)
        return name

    def corrupt_checksums(self, bucket: str, name: str) -> None:
        """Make the emulator report wrong CRC32C/MD5 for an object, as if it had rotted on disk.

        Reaches into the emulator's in-memory metadata: the JSON API has no way to do this.
        """
        metadata = self.server._storage.objects[bucket][name]
        metadata["crc32c"] = "AAAAAA=="
        metadata["md5Hash"] = "AAAAAAAAAAAAAAAAAAAAAA=="


def _start_on_free_port() -> tuple[Server, int]:
    # Port 0 lets the OS pick a free port at bind time, with no race against other processes;
    # the emulator does not expose the bound port, so read it from its HTTP server.
    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    httpd = getattr(server._api, "_httpd", None)
    if httpd is None:
        server.stop()
        raise RuntimeError("gcp-storage-emulator changed its internals: cannot find its bound port")
    return server, httpd.server_address[1]


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """The session's in-process Cloud Storage emulator, with the environment pointing at it."""
    # It logs a warning for every JSON response; keep test logs readable.
    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    server, port = _start_on_free_port()
    host = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": host, **EMULATOR_ENV}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    get_client.cache_clear()
    try:
        yield GcsEmulator(host=host, server=server)
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_client.cache_clear()


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator) -> str:
    """A new, empty bucket for this test; returns its name (no gs:// prefix)."""
    return gcs_emulator.make_bucket(f"test-bucket-{next(_bucket_numbers)}")
