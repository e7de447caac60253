"""A real, local Cloud Storage: gcp-storage-emulator, in this process, on a free loopback port.

    emulator = start_emulator()          # google-cloud-storage and gcsfs follow STORAGE_EMULATOR_HOST
    os.environ.update(emulator.env)
    emulator.make_bucket("my-bucket")
    ...
    emulator.stop()

No credentials or network are needed. tests/gcs_emulator.py wraps it in pytest fixtures; LocalCloud uses it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gcp_storage_emulator.server import Server, create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

EMULATOR_ENV = {
    "GOOGLE_CLOUD_PROJECT": "local-test",
    # gcsfs probes each bucket for hierarchical-namespace support, which the emulator does not
    # answer, and waits 60 s per bucket unless told not to.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}


@dataclass
class GcsEmulator:
    """A running emulator: `host` is the STORAGE_EMULATOR_HOST value (http://127.0.0.1:PORT)."""

    host: str
    server: Server

    @property
    def env(self) -> dict[str, str]:
        """The variables that point google-cloud-storage and gcsfs at this emulator."""
        return {"STORAGE_EMULATOR_HOST": self.host, **EMULATOR_ENV}

    def client(self) -> storage.Client:
        """A client bound to this emulator whatever the environment says."""
        return storage.Client(project=EMULATOR_ENV["GOOGLE_CLOUD_PROJECT"],
                              credentials=AnonymousCredentials(), client_options={"api_endpoint": self.host})

    def make_bucket(self, name: str, location: str | None = None) -> str:
        """Create bucket `name` (a no-op if it exists) in `location` (the emulator's default, "US", without one) and
        return the name."""
        client = self.client()
        if client.lookup_bucket(name) is None:
            client.create_bucket(name, location=location)
            if location:  # the emulator's insert keeps its own "US" whatever the request says
                self.server._storage.buckets[name].update(location=location.upper(), locationType="region")
        return name

    def corrupt_checksums(self, bucket: str, name: str) -> None:
        """Make the emulator report wrong CRC32C/MD5 for an object, as if it had rotted on disk.

        Reaches into the emulator's in-memory metadata: the JSON API has no way to do this.
        """
        metadata = self.server._storage.objects[bucket][name]
        metadata["crc32c"] = "AAAAAA=="
        metadata["md5Hash"] = "AAAAAAAAAAAAAAAAAAAAAA=="

    def stop(self) -> None:
        self.server.stop()


def start_emulator() -> GcsEmulator:
    """Start an in-memory emulator on a free loopback port."""
    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)  # a warning per JSON response otherwise
    # Port 0 lets the OS pick a free port at bind time, with no race against other processes;
    # the emulator does not expose the bound port, so read it from its HTTP server.
    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    httpd = getattr(server._api, "_httpd", None)
    if httpd is None:
        server.stop()
        raise RuntimeError("gcp-storage-emulator changed its internals: cannot find its bound port")
    # One thread answers every request, behind socketserver's backlog of 5: a burst of connections
    # (gcsfs uploads a folder's files at once, a job's ranks write beside the test) overflowed it
    # (the kernel's ListenOverflows counter), and a connection the kernel dropped waited out TCP's
    # retransmissions, minutes, with no timeout to cut it short (gcsfs passes requests_timeout=None
    # to aiohttp: no limit). listen() again with a deep queue: they wait their turn instead.
    httpd.socket.listen(1024)
    return GcsEmulator(host=f"http://127.0.0.1:{httpd.server_address[1]}", server=server)
