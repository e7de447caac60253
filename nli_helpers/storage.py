"""Copy files and directories between local paths and Cloud Storage (`gs://`).

Training writes checkpoints and metrics to a local directory or to a `gs://` job dir (Vertex AI
hands one over as $AIP_MODEL_DIR); the notebooks fetch them back. This module is that copy step,
built on google-cloud-storage:

    >>> upload("runs/smoke", "gs://my-bucket/runs/smoke")        # a directory, recursively
    >>> download("gs://my-bucket/runs/smoke/metrics.json", "metrics.json")
    >>> copy(src, dst)                                              # any of local/gs:// -> local/gs://
    >>> with local_copy("gs://b/data.jsonl") as path: ...          # a gs:// input as a local file, cleaned up
    >>> with staged_output("gs://b/runs/1/model") as folder: ...  # written locally, uploaded, cleaned up

A `gs://bucket/dir` URI names the object `dir` or, when there is none, everything under `dir/`
(a "directory"; Cloud Storage has only object names). Uploads are verified against the server's
CRC32C and downloads land atomically, so a checkpoint on either side is whole or absent.

With `STORAGE_EMULATOR_HOST` set (the tests start gcp-storage-emulator on a loopback port) the
client talks to that emulator with anonymous credentials; otherwise it uses Application Default
Credentials (your gcloud login, or the job's service account on Vertex AI).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import google_crc32c
import requests
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption
from google.cloud.storage.retry import DEFAULT_RETRY
from tqdm.auto import tqdm

from nli_helpers.config import NLIError

GCS_SCHEME = "gs://"
READ_ROLE = "roles/storage.objectViewer"
WRITE_ROLE = "roles/storage.objectUser"  # create, read, list, delete; no ACL or IAM rights
# A progress bar for a handful of files is noise in a notebook.
PROGRESS_MIN_FILES = 4
_CHUNK_BYTES = 1 << 20
# Transient errors are retried with the library's backoff, but for 30 s, not its 120: an unreachable endpoint or a
# vanished emulator becomes one StorageError within about half a minute instead of minutes of silence.
RETRY_S = 30.0
RETRY = DEFAULT_RETRY.with_timeout(RETRY_S)
CREDENTIALS_HELP = (
    "no Google Cloud credentials found: run `gcloud auth application-default login` (on a Workbench "
    "notebook the VM's service account is used), or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "service-account key file; on Vertex AI give the job a service account (service_account=...)"
)


T = TypeVar("T")


class StorageError(NLIError):
    """A copy to or from Cloud Storage failed; the message says what to do."""


def is_gcs_uri(s: str | os.PathLike[str]) -> bool:
    """True for a `gs://...` URI (local paths, including `pathlib.Path`, are False)."""
    return isinstance(s, str) and s.startswith(GCS_SCHEME)


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """`gs://bucket/a/b.txt` -> `("bucket", "a/b.txt")`; the path is "" for a bare bucket."""
    if not is_gcs_uri(uri):
        raise StorageError(f"not a Cloud Storage URI: {uri!r} (expected gs://BUCKET/PATH)")
    bucket, _, blob_path = uri[len(GCS_SCHEME):].partition("/")
    if not bucket:
        raise StorageError(f"no bucket name in {uri!r} (expected gs://BUCKET/PATH)")
    return bucket, blob_path


def get_client(project: str | None = None) -> storage.Client:
    """A cached storage client: the emulator's when STORAGE_EMULATOR_HOST is set, else ADC.

    `get_client.cache_clear()` forgets cached clients (tests do it when they start an emulator).
    """
    emulator_host = os.environ.get("STORAGE_EMULATOR_HOST") or None
    if emulator_host and project is None:
        project = os.environ.get("GOOGLE_CLOUD_PROJECT", "local-test")
    return _make_client(emulator_host, project)


@functools.lru_cache(maxsize=8)
def _make_client(emulator_host: str | None, project: str | None) -> storage.Client:
    # The host is part of the cache key so a test that starts a new emulator gets a new client;
    # the client itself reads STORAGE_EMULATOR_HOST for its endpoint.
    if emulator_host:
        return storage.Client(project=project, credentials=AnonymousCredentials())
    try:
        return storage.Client(project=project)
    except DefaultCredentialsError as err:
        raise StorageError(CREDENTIALS_HELP) from err


get_client.cache_clear = _make_client.cache_clear  # type: ignore[attr-defined]


def exists(uri: str) -> bool:
    """True if `uri` is an object, a "directory" with an object under it, or an existing bucket."""
    bucket_name, blob_path = split_gcs_uri(uri)
    bucket = get_client().bucket(bucket_name)
    with _storage_errors(bucket_name, READ_ROLE):
        if not blob_path:
            return bucket.exists(retry=RETRY)
        if not blob_path.endswith("/") and bucket.blob(blob_path).exists(retry=RETRY):
            return True
        try:
            # Lazy paging: stops at the first real object; "dir/" console placeholders hold nothing.
            return any(not b.name.endswith("/") for b in bucket.list_blobs(prefix=_dir_prefix(blob_path), retry=RETRY))
        except api_exceptions.NotFound:  # the bucket itself is missing
            return False


def list_uris(prefix_uri: str) -> list[str]:
    """Sorted `gs://` URIs of the object `prefix_uri` and of every object under `prefix_uri/`."""
    bucket_name, blob_path = split_gcs_uri(prefix_uri)
    return [f"{GCS_SCHEME}{bucket_name}/{blob.name}" for blob in _list_blobs(bucket_name, blob_path)]


def delete(uri: str) -> int:
    """Delete the object `uri` and every object under `uri/`; returns how many were deleted."""
    bucket_name, blob_path = split_gcs_uri(uri)
    with _storage_errors(bucket_name, WRITE_ROLE):
        blobs = _list_blobs(bucket_name, blob_path)
        for blob in blobs:
            blob.delete(retry=RETRY)
    return len(blobs)


def download(uri: str, local_path: str | os.PathLike[str]) -> Path:
    """Copy an object to a file, or a "directory" recursively into a local directory.

    An object lands at `local_path` (inside it, when that is an existing directory); a directory's
    objects land under `local_path` at their paths relative to `uri`. Returns where it landed.
    """
    return _download(uri, Path(local_path))[0]


def upload(local_path: str | os.PathLike[str], uri: str) -> list[str]:
    """Copy a file to `uri`, or a directory recursively under the prefix `uri`; returns the URIs.

    A file uploaded to a URI ending in "/" keeps its name. Each object is checked against the
    file's CRC32C after the upload.
    """
    source = Path(local_path)
    bucket_name, blob_path = split_gcs_uri(uri)
    if source.is_file():
        name = blob_path + source.name if blob_path.endswith("/") or not blob_path else blob_path
        pairs = [(source, name)]
    elif source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file())
        pairs = [(f, _join(blob_path, f.relative_to(source).as_posix())) for f in files]
    else:
        raise StorageError(f"cannot upload {source}: no such file or directory")
    bucket = get_client().bucket(bucket_name)
    uris = []
    with _storage_errors(bucket_name, WRITE_ROLE):
        for file, name in _progress(pairs, f"upload to gs://{bucket_name}"):
            blob = bucket.blob(name)
            blob.upload_from_filename(str(file), retry=RETRY)
            verify_upload(file, blob)
            uris.append(f"{GCS_SCHEME}{bucket_name}/{name}")
    return uris


@contextlib.contextmanager
def local_copy(source: str | os.PathLike[str], *, suffix: str = "", staging: str | None = None) -> Iterator[Path]:
    """A local path for `source`: the path itself, or a gs:// object or "directory" downloaded into a temporary
    folder (under `staging`, e.g. /dev/shm) that is removed when the block ends. The one place a gs:// input becomes
    a local file: data files, models, checkpoints all come through here.

        >>> with local_copy("gs://b/runs/1/model") as path:
        ...     model = load(path)
    """
    if not is_gcs_uri(source):
        yield Path(source)
        return
    with tempfile.TemporaryDirectory(prefix="nli-gcs-", dir=staging) as tmp:
        name = split_gcs_uri(str(source))[1].rstrip("/").rsplit("/", 1)[-1] or "object"
        yield download(str(source), Path(tmp) / f"{name}{suffix}")


@contextlib.contextmanager
def staged_output(target: str | os.PathLike[str], *, staging: str | None = None) -> Iterator[Path]:
    """A local folder to write `target`'s files into: `target` itself, or, for a gs:// target, a temporary folder
    that is uploaded to it when the block ends without an error, then removed. The one place a gs:// output is
    written from: runs, checkpoints, predictions and TensorBoard logs all go through here.

        >>> with staged_output("gs://b/runs/1/model") as folder:
        ...     model.save_pretrained(folder)
    """
    if not is_gcs_uri(target):
        Path(target).mkdir(parents=True, exist_ok=True)
        yield Path(target)
        return
    with tempfile.TemporaryDirectory(prefix="nli-gcs-", dir=staging) as tmp:
        yield Path(tmp)
        upload(tmp, str(target))


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[str]:
    """Copy a file or directory local->gs://, gs://->local or local->local; returns what it wrote."""
    if is_gcs_uri(src) and is_gcs_uri(dst):
        raise StorageError(f"copying {src} to {dst} (bucket to bucket) is not supported here: "
                           "use `gcloud storage cp -r SRC DST`")
    if is_gcs_uri(dst):
        return upload(src, str(dst))
    if is_gcs_uri(src):
        return [str(p) for p in _download(str(src), Path(dst))[1]]
    return _copy_local(Path(src), Path(dst))


def crc32c_of_file(path: str | os.PathLike[str]) -> str:
    """The file's CRC32C as Cloud Storage reports it: base64 of the 4 big-endian bytes."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode("ascii")


def verify_upload(local_file: str | os.PathLike[str], blob: storage.Blob) -> None:
    """Raise StorageError unless the object's server-side CRC32C matches the local file's."""
    if blob.crc32c is None:  # the upload response carries it; reload only if it did not
        blob.reload(retry=RETRY)
    local = crc32c_of_file(local_file)
    if blob.crc32c != local:
        raise StorageError(f"upload of {local_file} to gs://{blob.bucket.name}/{blob.name} is corrupt: "
                           f"CRC32C {blob.crc32c} in the bucket, {local} locally; upload it again")


def _download(uri: str, target: Path) -> tuple[Path, list[Path]]:
    """Download `uri` under `target`; returns the root written to and the files written."""
    bucket_name, blob_path = split_gcs_uri(uri)
    bucket = get_client().bucket(bucket_name)
    with _storage_errors(bucket_name, READ_ROLE):
        blob = bucket.get_blob(blob_path) if blob_path and not blob_path.endswith("/") else None
        if blob is not None:
            dest = target / Path(blob_path).name if target.is_dir() else target
            _download_blob_atomically(blob, dest)
            return dest, [dest]
        blobs = _list_blobs(bucket_name, _dir_prefix(blob_path) if blob_path else "")
    if not blobs:
        raise StorageError(f"{uri} does not exist: no object of that name and nothing under it")
    prefix = _dir_prefix(blob_path) if blob_path else ""
    pairs = [(b, _local_path_under(target, b.name[len(prefix):], uri)) for b in blobs]
    with _storage_errors(bucket_name, READ_ROLE):
        for b, dest in _progress(pairs, f"download from gs://{bucket_name}"):
            _download_blob_atomically(b, dest)
    return target, [dest for _, dest in pairs]


def _download_blob_atomically(blob: storage.Blob, dest: Path) -> None:
    # A killed or failed download must not leave a half checkpoint under the real name, so write
    # a hidden temp file beside it (same filesystem) and rename it into place.
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            blob.download_to_file(f, retry=RETRY)  # also checks the bytes against the object's hash
        os.replace(tmp_name, dest)
    except api_exceptions.NotFound as err:
        raise StorageError(f"gs://{blob.bucket.name}/{blob.name} disappeared while downloading") from err
    except DataCorruption as err:
        raise StorageError(f"download of gs://{blob.bucket.name}/{blob.name} is corrupt (checksum "
                           "mismatch); nothing was written: try again") from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)


def _list_blobs(bucket_name: str, blob_path: str) -> list[storage.Blob]:
    """The object `blob_path` (if any) and the objects under `blob_path/`, sorted by name."""
    with _storage_errors(bucket_name, READ_ROLE):
        found = get_client().list_blobs(bucket_name, prefix=blob_path, retry=RETRY)
        # A bare prefix would also match `runs-old/` for `runs`; keep only the name and its children.
        # Names ending in "/" are folder placeholders made by the console: no content.
        blobs = [b for b in found if _is_at_or_under(b.name, blob_path) and not b.name.endswith("/")]
    return sorted(blobs, key=lambda b: b.name)


def _is_at_or_under(name: str, blob_path: str) -> bool:
    return not blob_path or name == blob_path or name.startswith(_dir_prefix(blob_path))


def _dir_prefix(blob_path: str) -> str:
    return blob_path if blob_path.endswith("/") else blob_path + "/"


def _join(prefix: str, relative: str) -> str:
    return _dir_prefix(prefix) + relative if prefix else relative


def _local_path_under(root: Path, relative: str, uri: str) -> Path:
    # Object names are arbitrary strings; refuse any that would write outside the target dir.
    dest = root / relative
    if not dest.resolve().is_relative_to(root.resolve()):
        raise StorageError(f"refusing to download {uri} object {relative!r}: it escapes {root}")
    return dest


def _copy_local(src: Path, dst: Path) -> list[str]:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
        return sorted(str(dst / p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        return [str(shutil.copy2(src, dst))]
    raise StorageError(f"cannot copy {src}: no such file or directory")


def _progress(items: Sequence[T], desc: str) -> Iterator[T]:
    return iter(tqdm(items, desc=desc, unit="file", disable=len(items) < PROGRESS_MIN_FILES))


@contextlib.contextmanager
def _storage_errors(bucket_name: str, role: str) -> Iterator[None]:
    """Turn the Cloud Storage errors a user can fix into one StorageError saying how."""
    try:
        yield
    except api_exceptions.NotFound as err:
        raise StorageError(
            f"bucket gs://{bucket_name} does not exist (or you lack storage.buckets.get): check the "
            f"name/region and IAM role {role}") from err
    except api_exceptions.Forbidden as err:
        raise StorageError(
            f"permission denied on gs://{bucket_name}: grant your account (on Vertex AI, the job's "
            f"service account) {role} on the bucket ({err.message})") from err
    except (RefreshError, DefaultCredentialsError) as err:
        raise StorageError(f"{CREDENTIALS_HELP} ({err})") from err
    except (api_exceptions.RetryError, requests.exceptions.ConnectionError, requests.exceptions.Timeout,
            TransportError) as err:
        endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
        raise StorageError(f"cannot reach Cloud Storage at {endpoint} for gs://{bucket_name} (retried "
                           f"{RETRY_S:.0f} s: {type(err).__name__}); check the network, or STORAGE_EMULATOR_HOST "
                           "if you use the local emulator") from err
