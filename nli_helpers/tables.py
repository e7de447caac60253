"""Reading a file of NLI pairs: one reader per format, and one clear error naming the file and the
line (JSON Lines) or row that is wrong. `data.load_nli_splits` calls `read_pairs`.

Local paths, .gz files and gs:// URIs open through the same call (`files.filesystem(...).open`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import PurePosixPath

import numpy as np
import pandas as pd

from . import files
from .config import LABEL2ID, LABELS, NLIError

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")
COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
UNLABELLED, UNLABELLED_ID = {"-", "-1", ""}, -1
LABEL_NUMBER = re.compile(r"-?[0-9]+(\.0*)?")  # "1", "-1", "1.0" (an int column with gaps)
SURROGATE = re.compile(r"[\ud800-\udfff]")  # JSON can spell one ("\ud800"); nothing encodes it


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


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
        fs, inside = files.filesystem(path)
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
    lines, rows = [], []
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


def check_columns(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """premise/hypothesis/label(/genre) from either schema, or a DataError listing what is there.
    A row with only sentence1/sentence2/gold_label takes those where premise/... are empty."""
    seen = [str(c) for c in df.columns]
    for alias, name in COLUMN_ALIASES.items():
        if alias in df.columns:
            df = df.assign(**{name: df[alias] if name not in df.columns else
                              df[name].where(df[name].map(lambda v: not missing(v)), df[alias])})
    absent = [c for c in ("premise", "hypothesis", "label") if c not in df.columns]
    if absent:
        found = ", ".join(repr(c) for c in seen[:20]) + (", ..." if len(seen) > 20 else "")
        raise DataError(f"{source} lacks column(s) {', '.join(absent)} (found: {found or 'none'})"
                        "; name them premise/hypothesis/label or sentence1/sentence2/gold_label")
    return df[["premise", "hypothesis", "label"] + (["genre"] if "genre" in df.columns else [])]


def label_ids(labels: pd.Series, source: str) -> pd.Series:
    """Each label's id (UNLABELLED_ID for no label), or a DataError naming the first unknown one."""
    ids = labels.map(label_id)
    unknown = ids.isna()
    if unknown.any():
        bad = labels[unknown]
        shown = ", ".join(sorted({_shown(v) for v in bad})[:5])
        raise DataError(f"{source} has unknown label value(s) {shown} (first on "
                        f"{where(labels, bad.index[0])}); labels must be {'/'.join(LABELS)} or "
                        "0/1/2 (rows labelled -1, '-' or nothing are dropped)")
    return ids


def label_id(value) -> int | None:
    """0/1/2, UNLABELLED_ID for -1/'-'/''/null, or None when not a label: names in any case,
    0/1/2 as ints, integral floats or text; booleans are not labels."""
    if missing(value):
        return UNLABELLED_ID
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, float, np.number)):
        return None
    text = str(value).strip().lower()
    if text in UNLABELLED or text in LABEL2ID:
        return LABEL2ID.get(text, UNLABELLED_ID)
    number = int(text.split(".")[0]) if LABEL_NUMBER.fullmatch(text) and len(text) < 20 else None
    return number if number is not None and -1 <= number < len(LABELS) else None


def blank_texts(texts: pd.Series, source: str) -> pd.Series:
    """True where a premise or hypothesis is null, empty or whitespace; a DataError naming the first
    that is not text (a number, list, object) or not valid Unicode."""
    kinds = texts.map(_text_kind)
    bad = ~kinds.isin(("ok", "blank"))
    if bad.any():
        at = bad.idxmax()
        what, col = kinds[at], texts.name
        if what == "surrogate":
            raise DataError(f"{source}: the {col} on {where(texts, at)} is not valid Unicode (an "
                            "unpaired surrogate, such as a JSON \\ud800 escape); fix that row")
        raise DataError(f"{source}: the {col} on {where(texts, at)} is {_shown(texts[at])} "
                        f"({'an' if what[0] in 'aeiou' else 'a'} {what}), not text; "
                        f"every {col} must be a string")
    return kinds == "blank"


def missing(value) -> bool:
    return (value is None or value is pd.NA or value is pd.NaT
            or (isinstance(value, (float, np.floating)) and np.isnan(value)))


def _text_kind(value) -> str:
    if isinstance(value, str):
        return "blank" if not value.strip() else "surrogate" if SURROGATE.search(value) else "ok"
    return "blank" if missing(value) else json_type(value)


def json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _shown(value) -> str:
    """A value for an error message: short, and printable whatever it holds."""
    text = repr(value.strip().lower()) if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def where(rows: pd.Series | pd.DataFrame, label) -> str:
    """'line N' for JSON Lines (the index holds line numbers), else 'row N' counting rows from 1."""
    return f"line {label}" if rows.index.name == "line" else f"row {label + 1}"
