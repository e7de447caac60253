"""Copy files and directories between local paths and Cloud Storage (`gs://`), through gcsfs.

    >>> upload("runs/smoke", "gs://my-bucket/runs/smoke")        # a directory, recursively
    >>> download("gs://my-bucket/runs/smoke/metrics.json", "metrics.json")
    >>> with local_copy("gs://b/data.jsonl") as path: ...          # a gs:// input as a local path
    >>> with staged_output("gs://b/runs/1/model") as folder: ...  # written locally, then uploaded

A `gs://bucket/dir` URI names the object `dir` or, when there is none, everything under `dir/`
(Cloud Storage has only object names). Uploads are checked against the MD5 Cloud Storage computes
and downloads land under a temporary name first, so a checkpoint is whole or absent on either side.
With STORAGE_EMULATOR_HOST set (tests, localcloud) calls go to that emulator, anonymously;
otherwise they use Application Default Credentials (gcloud login, or the job's service account).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

from aiohttp import ClientError
from fsspec.callbacks import TqdmCallback
from gcsfs.core import GCSFileSystem
from gcsfs.retry import ChecksumError, HttpError
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from requests.exceptions import RequestException
from tqdm.auto import tqdm

from nli_helpers.config import NLIError

# gcsfs and the Google client libraries load on the first gs:// call: a local run never needs them.

GCS_SCHEME = "gs://"
READ_ROLE = "roles/storage.objectViewer"
WRITE_ROLE = "roles/storage.objectUser"  # create, read, list, delete; no ACL or IAM rights
# Vertex AI mounts the buckets a job can read here with Cloud Storage FUSE: gs://b/x is /gcs/b/x
# (https://cloud.google.com/vertex-ai/docs/training/cloud-storage-file-system).
FUSE_ROOT = Path("/gcs")
PROGRESS_MIN_FILES = 4  # a progress bar for a handful of files is noise in a notebook
BLOCK = 32 << 20  # bytes an upload sends per request
# gcsfs retries each request on connection errors, 408, 429 and 500-504 (gcsfs/retry.py,
# retry_request: 6 tries, waiting 1, 2, 4, 8, 16 s plus up to 1 s each): about 31 s in all.
RETRY_S = 31
CREDENTIALS_HELP = (
    "no Google Cloud credentials found: run `gcloud auth application-default login` (on a "
    "Workbench notebook the VM's service account is used), or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file; on Vertex AI give the job a service account "
    "(service_account=...)"
)
# gcsfs logs each request it gives up on with a traceback; each reaches the user once, as a
# StorageError. Unless someone has set its level, only its critical logs show.
if logging.getLogger("gcsfs").level == logging.NOTSET:
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


class StorageError(NLIError):
    """A copy to or from Cloud Storage failed; the message says what to do."""


def is_gcs_uri(s: str | os.PathLike[str]) -> bool:
    """True for a `gs://...` URI (local paths, including `pathlib.Path`, are False)."""
    return isinstance(s, str) and s.startswith(GCS_SCHEME)


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """`gs://bucket/a/b.txt` -> `("bucket", "a/b.txt")`; the path is "" for a bare bucket."""
    if not is_gcs_uri(uri):
        raise StorageError(f"not a Cloud Storage URI: {uri!r} (expected gs://BUCKET/PATH)")
    bucket, _, path = uri[len(GCS_SCHEME) :].partition("/")
    if not bucket:
        raise StorageError(f"no bucket name in {uri!r} (expected gs://BUCKET/PATH)")
    return bucket, path


def filesystem():
    """gcsfs for the emulator (anonymous) or Cloud Storage (ADC); fsspec caches the instance."""
    host = os.environ.get("STORAGE_EMULATOR_HOST") or None
    try:
        # gcsfs.core's class, not the one gcsfs/__init__.py exports by default: that one asks the
        # storage-control API for each bucket's layout, which the emulator never answers (60 s).
        # No listings cache: other processes (replicas, a notebook) write the same prefixes.
        token = "anon" if host else "google_default"  # never gcsfs's silent anonymous fallback
        return GCSFileSystem(
            token=token, endpoint_url=host, consistency="md5", use_listings_cache=False
        )
    except DefaultCredentialsError as err:
        raise StorageError(CREDENTIALS_HELP) from err


def exists(uri: str) -> bool:
    """True if `uri` is an object, a "directory" with an object under it, or an existing bucket."""
    bucket, path = split_gcs_uri(uri)
    with _errors(bucket, READ_ROLE, f"looking up {uri}"):
        if not path:
            return filesystem().exists(bucket)
        try:
            return bool(_objects(uri))
        except FileNotFoundError:  # gcsfs's find raises it for a missing bucket only
            return False


def list_uris(prefix_uri: str) -> list[str]:
    """Sorted `gs://` URIs of the object `prefix_uri` and of every object under `prefix_uri/`."""
    with _errors(split_gcs_uri(prefix_uri)[0], READ_ROLE, f"listing {prefix_uri}"):
        return [GCS_SCHEME + name for name in _objects(prefix_uri)]


def delete(uri: str) -> int:
    """Delete the object `uri` and every object under `uri/`; returns how many were deleted."""
    names = list_uris(uri)
    with _errors(split_gcs_uri(uri)[0], WRITE_ROLE, f"deleting {uri}"):
        for name in names:  # one by one: fs.rm would read [, * and ? in a name as a glob
            filesystem().rm_file(name)
    return len(names)


def upload(local_path: str | os.PathLike[str], uri: str) -> list[str]:
    """Copy a file to `uri`, or a directory recursively under the prefix `uri`; returns the URIs.
    A file uploaded to a URI ending in "/" keeps its name."""
    source = Path(local_path)
    bucket, path = split_gcs_uri(uri)
    prefix = f"{GCS_SCHEME}{bucket}/{path.rstrip('/') + '/' if path else ''}"
    if source.is_file():
        targets = {source: prefix + source.name if path.endswith("/") or not path else uri}
    elif source.is_dir():
        files = sorted(f for f in source.rglob("*") if f.is_file())
        targets = {f: prefix + f.relative_to(source).as_posix() for f in files}
    else:
        raise StorageError(f"cannot upload {source}: no such file or directory")
    with _errors(bucket, WRITE_ROLE, f"upload of {source} to {uri}"):
        for file, target in tqdm(targets.items(), **_bar(targets, "upload")):
            # gcsfs's file object uploads in a resumable session (raw bytes) whatever the size; its
            # one-shot put_file frames small files with bare LFs, cutting a trailing CR.
            with open(file, "rb") as src, filesystem().open(target, "wb", block_size=BLOCK) as dst:
                shutil.copyfileobj(src, dst, BLOCK)
    return sorted(targets.values())


def download(uri: str, local_path: str | os.PathLike[str]) -> Path:
    """Copy an object to `local_path` (inside it, when that is a directory), or a "directory"'s
    objects under `local_path` at their paths relative to `uri`. Returns where it landed."""
    bucket, path = split_gcs_uri(uri)
    target, key = Path(local_path), f"{bucket}/{path}"
    with _errors(bucket, READ_ROLE, f"download of {uri}"):
        objects = _objects(uri)
        if key in objects:  # an object, even when others sit under key/ too
            landed = target / Path(path).name if target.is_dir() else target
            _get_atomically({key: landed}, objects)
            return landed
        if not objects:
            raise StorageError(f"{uri} does not exist: no object of that name and nothing under it")
        start = len(key.rstrip("/") + "/")
        _get_atomically({n: _local_path_under(target, n[start:], uri) for n in objects}, objects)
    return target


@contextlib.contextmanager
def local_copy(source: str | os.PathLike[str], *, staging: str | None = None) -> Iterator[Path]:
    """A local path for `source`: the path itself; for a gs:// object or "directory", its /gcs/
    path where Vertex AI mounts it, else a download into a temporary folder (under `staging`, e.g.
    /dev/shm) removed when the block ends. The one place a gs:// input becomes a local file."""
    if not is_gcs_uri(source):
        yield Path(source)
        return
    bucket, path = split_gcs_uri(str(source))
    if path and (FUSE_ROOT / bucket / path).exists():
        yield FUSE_ROOT / bucket / path
        return
    with tempfile.TemporaryDirectory(prefix="nli-gcs-", dir=staging) as tmp:
        name = path.rstrip("/").rsplit("/", 1)[-1] or "object"
        yield download(str(source), Path(tmp) / name)


@contextlib.contextmanager
def staged_output(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A local folder to write `target`'s files into: `target` itself, or, for a gs:// target, a
    temporary folder uploaded to it when the block ends without an error, then removed."""
    if not is_gcs_uri(target):
        Path(target).mkdir(parents=True, exist_ok=True)
        yield Path(target)
        return
    with tempfile.TemporaryDirectory(prefix="nli-gcs-") as tmp:
        yield Path(tmp)
        upload(tmp, str(target))


def _objects(uri: str) -> dict[str, dict]:
    """The object `uri` and the objects under `uri/` as {"bucket/name": metadata}, sorted, without
    the console's empty "folder/" placeholders (gcsfs's find keeps `runs-old/` out of `runs`)."""
    found = filesystem().find(uri, detail=True)
    return {name: found[name] for name in sorted(found) if not name.endswith("/")}


def _get_atomically(targets: dict[str, Path], objects: dict[str, dict]) -> None:
    """Download each object to a hidden temporary file beside its target, then rename them all into
    place: a killed or failed download leaves no half-written file under a real name."""
    parts = {}
    try:
        for name, landed in targets.items():
            landed.parent.mkdir(parents=True, exist_ok=True)
            fd, parts[name] = tempfile.mkstemp(dir=landed.parent, prefix=f".{landed.name}.")
            os.close(fd)
        # Composite objects (gcloud's parallel uploads of big files) have only a CRC32C, which
        # gcsfs checks only with crcmod installed (gcsfs/checkers.py): those come unchecked.
        check = "md5" if all(objects[name].get("md5Hash") for name in targets) else "none"
        # One request per file: gcsfs's concurrent path (files over 100 MB) wraps its retried
        # requests in a second retry loop, six tries of six.
        with TqdmCallback(tqdm_kwargs=_bar(targets, "download"), tqdm_cls=tqdm) as bar:
            remote, local = list(targets), list(parts.values())
            filesystem().get(remote, local, callback=bar, consistency=check, concurrency=1)
        for name, landed in targets.items():
            os.replace(parts[name], landed)
    finally:
        for part in parts.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)


def _local_path_under(root: Path, relative: str, uri: str) -> Path:
    # Object names are arbitrary strings; refuse any that would write outside the target dir.
    dest = root / relative
    if not dest.resolve().is_relative_to(root.resolve()):
        raise StorageError(f"refusing to download {uri} object {relative!r}: it escapes {root}")
    return dest


def _bar(files: Collection, verb: str) -> dict:
    return {"desc": verb, "unit": "file", "disable": len(files) < PROGRESS_MIN_FILES}


@contextlib.contextmanager
def _errors(bucket: str, role: str, doing: str) -> Iterator[None]:
    """Turn the errors a user can fix into one StorageError that says how; re-raise the rest."""
    try:
        yield
    except Exception as err:
        message = _explain(err, bucket, role, doing)
        if message is None:
            raise
        raise StorageError(message) from err


def _explain(err: Exception, bucket: str, role: str, doing: str) -> str | None:
    # gcsfs/retry.py, validate_response: 404 is FileNotFoundError, 403 OSError("Forbidden: ..."),
    # 400 "invalid" ValueError("Bad Request: ..."), 401 HttpError; the rest after its retries.
    unreachable = (HttpError, ClientError, RequestException, TransportError, TimeoutError)
    text = str(err)
    if isinstance(err, FileNotFoundError) and _bucket_missing(bucket):
        return (
            f"bucket gs://{bucket} does not exist (or you lack storage.buckets.get): "
            f"check the name/region and IAM role {role}"
        )
    if isinstance(err, FileNotFoundError):
        return f"{doing} failed: {text} is gone (deleted meanwhile?); try again"
    if isinstance(err, ChecksumError):
        return f"{doing} is corrupt: the bytes differ from Cloud Storage's checksum; try again"
    if isinstance(err, (DefaultCredentialsError, RefreshError)) or getattr(err, "code", 0) == 401:
        return f"{CREDENTIALS_HELP} ({text})"
    if isinstance(err, unreachable):
        endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
        return (
            f"cannot reach Cloud Storage at {endpoint} for gs://{bucket} (retried about "
            f"{RETRY_S} s: {type(err).__name__} {text}); check the network, or "
            "STORAGE_EMULATOR_HOST if you use the local emulator"
        )
    if isinstance(err, OSError) and text.startswith("Forbidden"):
        return (
            f"permission denied on gs://{bucket}: grant your account (on Vertex AI, the job's "
            f"service account) {role} on the bucket ({text})"
        )
    if isinstance(err, ValueError) and text.startswith("Bad Request"):
        return f"Cloud Storage refused {doing}: {text}"
    return None


def _bucket_missing(bucket: str) -> bool:
    with contextlib.suppress(Exception):  # only asked to word an error better, never the error
        return not filesystem().exists(bucket)
    return False
