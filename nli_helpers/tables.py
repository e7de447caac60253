"""Read one file of NLI pairs into a DataFrame, with one clear DataError naming the file.

    >>> read_table("pairs.jsonl.gz")  # every value keeps its JSON type; csv/tsv cells stay text

pandas reads csv, tsv and parquet (gzipped too). JSON goes through the json module, a line at a
time: pandas' JSON reader names no line, refuses a byte-order mark and drops unpaired surrogates
without a word. `data.normalise_frame` then makes premise / hypothesis / label (/ genre) rows.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from .config import NLIError

COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
KNOWN_COLUMNS = frozenset({"premise", "hypothesis", "label", "genre", *COLUMN_ALIASES})
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


def read_table(path: str | Path) -> pd.DataFrame:
    """Read one jsonl/json/csv/tsv/parquet file (optionally gzipped) into a DataFrame."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"data file {path} does not exist; pass --data with an existing file, a directory "
            "of split files, a gs:// URI, a hub name or 'sample'"
        )
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty; it needs premise, hypothesis and label")
    gz = path.suffix == ".gz"
    kind = path.suffixes[-2] if gz and len(path.suffixes) > 1 else path.suffix
    if kind not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {kind!r}; use {'/'.join(SUFFIXES)}(.gz)")
    try:
        df = _READERS.get(kind, _read_json)(path)
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); re-encode it as UTF-8"
        ) from e
    # Truncated or corrupt files: gzip raises EOFError, BadGzipFile (an OSError) or zlib.error;
    # pyarrow ArrowInvalid (a ValueError) or OSError; pandas' csv parser ParserError (a ValueError).
    except (ValueError, OSError, EOFError, zlib.error, csv.Error) as e:
        raise DataError(
            f"could not read {path} as {kind[1:]}{' (gzip)' if gz else ''}: {e}. "
            "Is the file complete? Copy or download it again"
        ) from e
    if len(df) == 0 and len(df.columns) == 0:
        raise DataError(f"data file {path} is empty (no rows); it needs premise, hypothesis, label")
    return df


def _read_csv(path: Path, **options) -> pd.DataFrame:
    # Text stays text: a premise "1" or a label "1.0" is not guessed into a number, "" stays "".
    return pd.read_csv(path, dtype=str, keep_default_na=False, **options)


def _read_tsv(path: Path) -> pd.DataFrame:
    standard = standard_quoting(path)
    df = _read_csv(path, sep="\t", quoting=csv.QUOTE_MINIMAL if standard else csv.QUOTE_NONE)
    df.attrs["quoting"] = "standard CSV quoting" if standard else "literal"
    return df


def standard_quoting(path: Path) -> bool:
    """Does this TSV use standard CSV quoting (what pandas, Excel and Python's csv module write: a
    field with a tab, a newline or a quote is wrapped in quotes, inner quotes doubled)? Raw
    MultiNLI/GLUE files do not: their quotes are text, often unbalanced (`"Hello," he said.`).
    pandas cannot tell, so the rule: a file with quotes whose every quoted field parses strictly
    as standard quoting is read that way, anything else literally."""
    with _open(path) as f:
        text = f.read().decode("utf-8-sig")
    if '"' not in text:
        return False
    try:
        for _ in csv.reader(text.splitlines(keepends=True), delimiter="\t", strict=True):
            pass
    except csv.Error:
        return False
    return True


def _read_json(path: Path) -> pd.DataFrame:
    """JSON Lines (one object a line) or one JSON array of objects, each value keeping its JSON
    type (pandas would turn a premise "1" into 1). Each row keeps only the columns the loader uses,
    so a file whose lines all have new keys builds no rows x keys table; the first keys seen are
    kept for error messages. The index holds JSON Lines' line numbers, for errors naming a line."""
    seen: dict[str, None] = {}
    lines, rows = [], []
    with _open(path) as f:
        for number, row in _json_records(path, f):
            if len(seen) < 50:
                seen.update(dict.fromkeys(list(row)[:50]))
            lines.append(number)
            rows.append({k: v for k, v in row.items() if k in KNOWN_COLUMNS})
    index = pd.Index(lines, name="line") if lines and lines[0] is not None else None
    df = pd.DataFrame(rows, index=index, dtype=object)
    df.attrs["columns_seen"] = list(seen)
    return df


def _json_records(path: Path, f: BinaryIO) -> Iterator[tuple[int | None, dict]]:
    """(line number, object) for JSON Lines; (None, object) for a JSON array."""
    if f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"["):
        f.seek(0)
        yield from ((None, record) for record in _json_array(path, f.read()))
        return
    f.seek(0)
    for number, raw in enumerate(f, 1):
        try:
            line = (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path} line {number} is not valid UTF-8 ({e.reason} at byte {e.start} of the "
                "line); re-encode the file as UTF-8"
            ) from e
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise DataError(
                f"{path} line {number} is not valid JSON ({getattr(e, 'msg', e)}{where}); "
                "each line must be one JSON object"
            ) from e
        if not isinstance(row, dict):
            raise DataError(
                f"{path} line {number} is a JSON {json_type(row)}, not an object; each line must "
                'be one object like {"premise": ..., "hypothesis": ..., "label": ...}'
            )
        yield number, row


def _json_array(path: Path, raw: bytes) -> list[dict]:
    text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")  # read_table words a decode error
    try:
        records = json.loads(text)
    except (ValueError, RecursionError) as e:
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise DataError(f"{path} is not valid JSON ({getattr(e, 'msg', e)}{where})") from e
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path} must be a JSON array of objects (or JSON Lines: an object a line)")
    return records


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def json_type(value) -> str:
    """A Python value's JSON type name, for error messages."""
    if type(value) in (int, float):
        return "number"
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _read_parquet(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path).reset_index(drop=True)  # a saved index would confuse row numbers


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean"}
_READERS = {".csv": _read_csv, ".tsv": _read_tsv, ".txt": _read_tsv, ".parquet": _read_parquet}
