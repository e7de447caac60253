"""Local paths and Cloud Storage (`gs://`) through the same calls: fsspec.

    >>> fs, path = filesystem("gs://my-bucket/runs/1")   # or "runs/1": the same methods
    >>> put("staged/", "gs://my-bucket/runs/1", last="metrics.json")

A local path loads no Cloud Storage code; a gs:// one loads gcsfs, which follows
STORAGE_EMULATOR_HOST (tests, localcloud) and otherwise uses Application Default Credentials.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from .config import NLIError

CREDENTIALS_HELP = (
    "no Google Cloud credentials found: run `gcloud auth application-default login` (on a "
    "Workbench notebook the VM's service account is used), or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file; on Vertex AI give the job a service account")


def is_gcs_uri(path: object) -> bool:
    return isinstance(path, str) and path.startswith("gs://")


def filesystem(path: str | os.PathLike[str]) -> tuple[AbstractFileSystem, str]:
    """(filesystem, path in it) for a local path or a gs:// URI."""
    path = str(path)
    if not is_gcs_uri(path):
        return url_to_fs(os.path.expanduser(path))
    # Never gcsfs's silent anonymous fallback; no listings cache: other processes write here too.
    token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else "google_default"
    try:
        return url_to_fs(path, token=token, consistency="md5", use_listings_cache=False)
    except Exception as e:  # google.auth's DefaultCredentialsError, without importing google.auth
        if type(e).__name__ == "DefaultCredentialsError":
            raise NLIError(CREDENTIALS_HELP) from e
        raise


def join(*parts: str) -> str:
    return "/".join([str(parts[0]).rstrip("/"), *(p.strip("/") for p in parts[1:])])


def put(local: str | os.PathLike[str], target: str, *, last: str | None = None) -> None:
    """Copy a local file or folder's files to `target` (a local path or gs:// URI), the file
    named `last` after all others: a reader that waits for it sees whole results only."""
    local = Path(local)
    files = sorted((f for f in local.rglob("*") if f.is_file()), key=lambda f: f.name == last) \
        if local.is_dir() else [local]
    fs, root = filesystem(target)
    for file in files:
        dest = join(root, file.relative_to(local).as_posix()) if local.is_dir() else root
        fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(file), dest)


def check_writable(path: str, flag: str) -> None:
    """Fail before training, not after, when `path` cannot be written: write and delete a file.
    The local folders it makes go again: a run that fails later leaves none behind."""
    created: list[Path] = []
    try:
        fs, root = filesystem(path)
        if not is_gcs_uri(path):
            created = [p for p in (Path(root), *Path(root).parents) if not p.exists()]
        fs.makedirs(root, exist_ok=True)
        probe = join(root, f".nli-write-check-{os.getpid()}")
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except NLIError:
        raise
    except Exception as e:  # OSError locally; gcsfs's HttpError, a refused or unreachable bucket
        why = "no such bucket" if is_gcs_uri(path) and isinstance(e, FileNotFoundError) \
            else getattr(e, "strerror", None) or e  # gcsfs's 404 names only the request's URL
        raise NLIError(f"{path} cannot be written ({why}); pass {flag} with a folder you can "
                       "write") from None
    finally:
        for folder in created:  # deepest first; the run makes them again when it writes
            with contextlib.suppress(OSError):
                folder.rmdir()
