"""Local paths and Cloud Storage (`gs://`) through the same calls: fsspec. At the end, the readers
of a file of NLI pairs, one per format, through the same calls.

    >>> fs, path = filesystem("gs://my-bucket/runs/1")   # or "runs/1": the same methods
    >>> put("staged/", "gs://my-bucket/runs/1", last="metrics.json")
    >>> read_pairs("gs://my-bucket/data/train.jsonl.gz")  # a DataFrame, every cell as read

A local path loads no Cloud Storage code; a gs:// one loads gcsfs, which follows
STORAGE_EMULATOR_HOST (tests, localcloud) and otherwise uses Application Default Credentials.
A request that Cloud Storage does not answer is retried a few times, each retry said on stderr,
then ends in one `StorageError` line that names the endpoint and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import io
import json
import os
import re
import sys
from pathlib import Path, PurePosixPath

import pandas as pd
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from .config import DataError, NLIError

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


# -- reading a file of NLI pairs: one reader per format, one clear error naming the file and the
# line (JSON Lines) or row that is wrong. `data.load_nli_splits` calls `read_pairs`. -------------
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


def file_kind(path: str) -> str:
    """The format suffix of `path` (.jsonl for data.jsonl.gz), or ''."""
    suffixes = PurePosixPath(path).suffixes
    gz = suffixes[-1:] == [".gz"] and len(suffixes) > 1
    kind = suffixes[-2] if gz else "".join(suffixes[-1:])
    return kind if kind in SUFFIXES else ""


def read_pairs(path: str) -> pd.DataFrame:
    """The rows of one jsonl/json/csv/tsv/parquet file (.gz too; local or gs://), every cell as
    read (no type guessing: "1999" stays text); JSON Lines' line numbers as the index."""
    kind = file_kind(path)
    if not kind:
        raise DataError(f"{path}: unsupported file type; use {'/'.join(SUFFIXES)} (.gz too)")
    try:
        fs, inside = filesystem(path)
        with fs.open(inside, "rb", compression="infer") as f:
            if kind == ".parquet":  # as Python objects now: a string that is not UTF-8 fails here
                df = pd.read_parquet(f).reset_index(drop=True).astype(object)
            elif kind in (".json", ".jsonl"):
                df = _read_json(f, path)
            elif kind in (".tsv", ".txt"):  # raw MultiNLI's multinli_1.0_*.txt are TSV
                df = _read_tsv(f.read().decode("utf-8-sig"), path)
            else:
                df = pd.read_csv(f, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist; pass --data with an existing file, a "
                        "folder of split files, a gs:// URI, a hub name or 'sample'") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); re-encode it "
                        "as UTF-8") from e
    except Exception as e:  # pandas, pyarrow, gzip and fsspec raise many types for a bad file
        raise DataError(f"could not read {path} as {kind[1:]}: {str(e)[:300] or type(e).__name__}"
                        ". Is the file complete? Copy or download it again") from e
    if df.empty:
        raise DataError(f"data file {path} is empty (no rows); it needs premise, hypothesis, label")
    return df


# A field in standard TSV quoting (pandas' and csv's default) that holds a quote: wrapped in quotes,
# its own doubled. MultiNLI's quotes are text, and never doubled inside a wrapped field.
DOUBLED_QUOTES = re.compile(r'(?:^|\t)"(?:[^"\t\n]|"")*""(?:[^"\t\n]|"")*"\r?(?:\t|$)', re.M)


def _read_tsv(text: str, path: str) -> pd.DataFrame:
    """A TSV in either of two conventions. MultiNLI's own files treat quotes as text (its quotes
    are often unbalanced: `"Hello," he said.`), so each line is a row and each tab a border.
    pandas and csv quote a field that holds a tab, a newline or a quote: read so where a line's
    field count or a doubled quote says the file was written that way."""
    lines = [line.removesuffix("\r") for line in text.split("\n") if line.strip()]
    rows = [line.split("\t") for line in lines]
    if DOUBLED_QUOTES.search(text) or any(len(row) != len(rows[0]) for row in rows):
        reader = csv.reader(io.StringIO(text), delimiter="\t")
        rows = []
        for row in reader:
            if row and rows and len(row) != len(rows[0]):
                raise DataError(f"{path} line {reader.line_num} has {len(row)} fields where the "
                                f"header has {len(rows[0])}, read with quotes as text or as "
                                "standard TSV quoting: a line cut short, or a tab inside a field "
                                "that is not quoted")
            rows += [row] if row else []
    return pd.DataFrame(rows[1:], columns=rows[0]) if rows else pd.DataFrame()


def _read_json(f, name: str) -> pd.DataFrame:
    """JSON Lines (the index holds line numbers) or one JSON array of objects."""
    data = f.read().removeprefix(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # the line, as for any other bad line
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{name} line {line} is not valid UTF-8 ({e.reason}); re-encode it as "
                        "UTF-8") from e
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{name} is not valid JSON ({getattr(e, 'msg', e)})") from e
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise DataError(f"{name} must be a JSON array of objects (or JSON Lines)")
        return pd.DataFrame(records, dtype=object)
    lines = []
    rows = []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 is text
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise DataError(f"{name} line {number} is not valid JSON ({getattr(e, 'msg', e)}"
                            f"{where}); each line must be one JSON object") from e
        if not isinstance(row, dict):
            raise DataError(f"{name} line {number} is a JSON {json_type(row)}, not an object; "
                            'each line must be one object like {"premise": ..., "hypothesis": '
                            '..., "label": ...}')
        lines.append(number)
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(lines, name="line"), dtype=object)


def json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)
