"""Read one file of NLI pairs (jsonl, a JSON array, csv, tsv, parquet; optionally gzipped) into a DataFrame, with
one clear error for a file that is missing, empty, truncated, not UTF-8 or not the shape it claims to be.

    >>> read_table("pairs.jsonl.gz")          # every value keeps its JSON type; csv/tsv cells stay text

`data.normalise_frame` then turns the table into premise / hypothesis / label (/ genre) rows.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import zlib
from pathlib import Path

import pandas as pd

from .config import NLIError

COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


def read_table(path: str | Path) -> pd.DataFrame:
    """Read one jsonl/csv/tsv/parquet file (optionally gzipped) into a DataFrame."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; pass --data with an existing file, "
                        "a directory of split files, a gs:// URI, a hub name or 'sample'")
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty; it needs premise, hypothesis and label columns")
    kind = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    try:
        if kind in (".jsonl", ".json"):
            df = _read_json_records(path)
        # Text columns stay text (dtype=str): a premise "1" or a label "1.0" is not guessed into a number.
        elif kind == ".csv":
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
        elif kind in (".tsv", ".txt"):
            quoting = csv.QUOTE_MINIMAL if standard_quoting(path) else csv.QUOTE_NONE
            df = pd.read_csv(path, sep="\t", quoting=quoting, dtype=str, keep_default_na=False)
            df.attrs["quoting"] = "standard CSV quoting" if quoting == csv.QUOTE_MINIMAL else "literal"
        elif kind == ".parquet":
            df = pd.read_parquet(path).reset_index(drop=True)  # a saved index would confuse row numbers
        else:
            raise DataError(f"{path}: unsupported file type {kind!r}; use one of {', '.join(SUFFIXES)} "
                            "(optionally .gz)")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "re-encode it as UTF-8") from e
    # Truncated or corrupt files: gzip raises EOFError/BadGzipFile(OSError)/zlib.error, pyarrow
    # ArrowInvalid(ValueError)/OSError, the csv parsers ParserError(ValueError)/csv.Error.
    except (ValueError, OSError, EOFError, zlib.error, csv.Error) as e:
        raise DataError(f"could not read {path} as {kind[1:]}{' (gzip)' if path.suffix == '.gz' else ''}: "
                        f"{e}. Is the file complete? Copy or download it again") from e
    if len(df) == 0 and len(df.columns) == 0:
        raise DataError(f"data file {path} is empty (no rows); it needs premise, hypothesis and label columns")
    return df


def standard_quoting(path: Path) -> bool:
    """Does this TSV use standard CSV quoting (what pandas, Excel and Python's csv module write: a field with a tab,
    a newline or a quote is wrapped in quotes, inner quotes doubled)? Raw MultiNLI/GLUE files do not: their quotes
    are text, often unbalanced (`"Hello," he said.`), and must be read literally. The rule: a file with quotes whose
    every quoted field parses strictly as standard quoting is read that way; anything else literally."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        text = f.read()
    if '"' not in text:
        return False
    try:
        for _ in csv.reader(text.splitlines(keepends=True), delimiter="\t", strict=True):
            pass
    except csv.Error:
        return False
    return True


def _read_json_records(path: Path) -> pd.DataFrame:
    """JSON Lines (one object a line) or a JSON array of objects, each value keeping its JSON type.

    Parsed line by line so that a bad line is named by its number (the DataFrame's index is the
    line number), and without pandas' type guessing, which would turn a premise "1" into 1.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        first = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
        if first.startswith(b"["):
            f.seek(0)
            return _json_array(path, f.read())
        f.seek(0)
        rows, lines, seen = [], [], {}
        for number, raw in enumerate(f, 1):
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path} line {number} is not valid UTF-8 ({e.reason} at byte {e.start} of the "
                                "line); re-encode the file as UTF-8") from e
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as e:
                where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                raise DataError(f"{path} line {number} is not valid JSON ({getattr(e, 'msg', e)}{where}); "
                                "each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise DataError(f"{path} line {number} is a JSON {json_type(row)}, not an object; each line "
                                'must be one object like {"premise": ..., "hypothesis": ..., "label": ...}')
            rows.append(_known_columns(row, seen))
            lines.append(number)
    return _records_frame(rows, seen, pd.Index(lines, name="line"))


def _json_array(path: Path, raw: bytes) -> pd.DataFrame:
    try:
        records = json.loads(raw.removeprefix(codecs.BOM_UTF8).decode("utf-8"))
    except UnicodeDecodeError:  # a ValueError too, but read_table words it better
        raise
    except (ValueError, RecursionError) as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise DataError(f"{path} is not valid JSON ({getattr(e, 'msg', e)}{where})") from e
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path} must be a JSON array of objects (or JSON Lines: one object a line)")
    seen: dict[str, None] = {}
    return _records_frame([_known_columns(r, seen) for r in records], seen, None)


KNOWN_COLUMNS = frozenset({"premise", "hypothesis", "label", "genre", *COLUMN_ALIASES})


def _known_columns(row: dict, seen: dict) -> dict:
    # Only the columns the loader uses become DataFrame columns: a file whose every line has new keys
    # would otherwise build a rows x keys table. The first keys seen are kept for error messages.
    if len(seen) < 50:
        seen.update(dict.fromkeys(list(row)[:50]))
    return {k: v for k, v in row.items() if k in KNOWN_COLUMNS}


def _records_frame(rows: list[dict], seen: dict, index) -> pd.DataFrame:
    df = pd.DataFrame(rows, index=index, dtype=object)
    df.attrs["columns_seen"] = list(seen)
    return df


def json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
