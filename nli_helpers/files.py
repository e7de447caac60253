"""Local paths and Cloud Storage (`gs://`) through the same calls: fsspec.

    >>> fs, path = filesystem("gs://my-bucket/runs/1")   # or "runs/1": the same methods
    >>> put("staged/", "gs://my-bucket/runs/1", last="metrics.json")

A local path loads no Cloud Storage code; a gs:// one loads gcsfs, which follows
STORAGE_EMULATOR_HOST (tests, localcloud) and otherwise uses Application Default Credentials.
A request that Cloud Storage does not answer is retried a few times, each retry said on stderr,
then ends in one `StorageError` line that names the endpoint and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
from pathlib import Path

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from .config import NLIError

CREDENTIALS_HELP = (
    "no Google Cloud credentials found: run `gcloud auth application-default login` (on a "
    "Workbench notebook the VM's service account is used), or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file; on Vertex AI give the job a service account")


# Seconds before each retry of a request Cloud Storage did not answer (a refused connection, a
# timeout, a 429 or 5xx): a fault is one line within about 10 s, where gcsfs alone retries each
# request 6 times over ~35 s, silently, and a caller's next request does the same again.
RETRY_DELAYS = (1, 2, 4)


class StorageError(NLIError):
    """Cloud Storage did not answer, after the retries."""


def is_gcs_uri(path: object) -> bool:
    return isinstance(path, str) and path.startswith("gs://")


def filesystem(path: str | os.PathLike[str]) -> tuple[AbstractFileSystem, str]:
    """(filesystem, path in it) for a local path or a gs:// URI."""
    path = str(path)
    if not is_gcs_uri(path):
        return url_to_fs(os.path.expanduser(path))
    # Never gcsfs's silent anonymous fallback; no listings cache: other processes write here too.
    token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else "google_default"
    import aiohttp

    # A connection that never opens, or an answer that stops, fails the try (gcsfs sets no timeout).
    timeout = aiohttp.ClientTimeout(sock_connect=5, sock_read=60)
    try:
        fs = _storage_class()(token=token, consistency="md5", use_listings_cache=False,
                              requests_timeout=timeout)
    except Exception as e:  # google.auth's DefaultCredentialsError, without importing google.auth
        if type(e).__name__ == "DefaultCredentialsError":
            raise NLIError(CREDENTIALS_HELP) from e
        raise
    return fs, fs._strip_protocol(path)


@functools.cache
def _storage_class() -> type:
    """gcsfs's file system, its requests retried as RETRY_DELAYS says, each retry said."""
    import gcsfs
    from gcsfs.retry import is_retriable

    one_try = gcsfs.GCSFileSystem._request.__wrapped__  # gcsfs's request, without its retries

    class Storage(gcsfs.GCSFileSystem):
        said = ""  # the last retry line printed

        async def _request(self, method, path, *args, **kwargs):
            for retry, delay in enumerate((*RETRY_DELAYS, None), 1):
                try:
                    return await one_try(self, method, path, *args, **kwargs)
                except Exception as e:
                    if not is_retriable(e):  # a 404, a 403: an answer, not a fault
                        raise
                    cause = " ".join(str(e).split())[:200] or type(e).__name__
                    if delay is None:
                        raise StorageError(
                            f"Cloud Storage at {self._location} did not answer ({cause}) after "
                            f"{retry} tries over {sum(RETRY_DELAYS)} s; check the network and "
                            "the bucket (or STORAGE_EMULATOR_HOST), then rerun") from None
                    said = (f"warning: Cloud Storage at {self._location}: {cause}; retry "
                            f"{retry}/{len(RETRY_DELAYS)} in {delay} s")
                    if said != self.said:  # requests sent together fail together: one line
                        print(said, file=sys.stderr, flush=True)
                        self.said = said
                    await asyncio.sleep(delay)

    return Storage


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


def reason(e: Exception) -> str:
    """A failed read or write in a few words: the OS's reason, or the library's message."""
    if isinstance(e, FileNotFoundError) and not e.strerror:  # gcsfs's 404 names only the URL
        return f"not found: {e} (is the bucket there?)"
    return getattr(e, "strerror", None) or " ".join(str(e).split())[:300] or type(e).__name__


def what_is_kept(root: str, newest) -> str:
    """What a failed save leaves: `newest(root)`, the newest complete checkpoint under `root`, or
    where Cloud Storage does not answer, the checkpoints it holds (asking again would not help)."""
    if is_gcs_uri(root):
        return (f"the checkpoints already in {root} are kept: rerun with "
                "--resume_from_checkpoint auto once Cloud Storage answers")
    kept = newest(root)
    return (f"the newest checkpoint, {kept}, is kept: rerun with --resume_from_checkpoint auto to "
            "continue from it" if kept else "there is no checkpoint to resume from")


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
