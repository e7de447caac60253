"""A real, local Cloud Storage: gcp-storage-emulator, in this process, on a free loopback port.

    emulator = start_emulator()          # google-cloud-storage and gcsfs follow STORAGE_EMULATOR_HOST
    os.environ.update(emulator.env)
    emulator.make_bucket("my-bucket")
    ...
    emulator.stop()

No credentials or network are needed. tests/gcs_emulator.py wraps it in pytest fixtures; LocalCloud uses it.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.server import Server, create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

EMULATOR_ENV = {
    "GOOGLE_CLOUD_PROJECT": "local-test",
    # gcsfs probes each bucket for hierarchical-namespace support, which the emulator does not
    # answer, and waits 60 s per bucket unless told not to.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}


_emulator_read_data = emulator_server._read_data


def _read_data(request_handler, query):
    """The emulator's request reader, but an upload's multipart/related body is split here. The emulator's (Python's
    email parser) takes a "\r" that ends the file for half of a "\r\n" before the closing boundary, so a file ending
    in "\r" lost its last byte: 1 binary file in 256, a TensorBoard event file's CRC among them, then failed gcsfs's
    MD5 check. Here each part ends before the line break the body's own first line uses (gcsfs writes "\n",
    google-cloud-storage "\r\n")."""
    content_type = request_handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _emulator_read_data(request_handler, query)
    raw = emulator_server._decode_raw_data(emulator_server._read_raw_data(request_handler), request_handler)
    boundary = b"--" + content_type.split("boundary=", 1)[1].strip('"').encode()
    eol = b"\r\n" if raw.split(b"\n", 1)[0].endswith(b"\r") else b"\n"
    (_, meta), (head, content) = (part[len(eol):-len(eol)].split(eol * 2, 1) for part in raw.split(boundary)[1:3])
    part_type = next((line.split(b":", 1)[1].strip().decode() for line in head.split(eol)
                      if line.lower().startswith(b"content-type:")), "application/octet-stream")
    return {"meta": json.loads(meta), "content": content, "content-type": part_type}


emulator_server._read_data = _read_data

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
    # A client that hangs up before the answer is written (gcsfs closes a read early) is no error,
    # yet socketserver prints a 25-line traceback for each: make demo's terminal filled with them.
    httpd.handle_error = lambda request, address, report=httpd.handle_error: (
        None if isinstance(sys.exc_info()[1], ConnectionError) else report(request, address))
    return GcsEmulator(host=f"http://127.0.0.1:{httpd.server_address[1]}", server=server)
