"""What `data` refuses, each with one clear error naming the file and line or row. Where `datasets`
refuses a file or would read it unlike the json module, pandas or the json module reads it again
and names the line that is wrong.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import json
import logging
import re
import shutil
import warnings
import zlib
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
from datasets import Dataset, Features, Value

from .config import LABELS, ConfigError, NLIError

log = logging.getLogger(__name__)

LABEL2ID = {name: i for i, name in enumerate(LABELS)}
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")
COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
UNLABELLED, UNLABELLED_ID = {"-", "-1", ""}, -1
# Numeric labels as text: "1", "-1", and "1.0" (a label column with gaps, as pandas gives it back).
LABEL_NUMBER = re.compile(r"-?[0-9]+(\.0*)?")
# An unpaired surrogate (JSON can spell one as "\ud800") is not Unicode text: nothing can encode it.
SURROGATE = re.compile(r"[\ud800-\udfff]")


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


# -- a file ---------------------------------------------------------------------------------------
def local_copy(path: Path, folder: Path) -> tuple[Path, str]:
    """(copy, suffix): the file, under a plain name in `folder` (data_files takes glob patterns) and
    decompressed whole (datasets reads a gzip cut short as if it ended there); or a DataError."""
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; pass --data with an existing file, a "
                        "directory of split files, a gs:// URI, a hub name or 'sample'")
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty; it needs premise, hypothesis and label")
    gz = path.suffix == ".gz"
    kind = path.suffixes[-2] if gz and len(path.suffixes) > 1 else path.suffix
    if kind not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {kind!r}; use {'/'.join(SUFFIXES)}(.gz)")
    copy = folder / f"data{kind}"
    if not gz:
        copy.symlink_to(path.resolve())
        return copy, kind
    try:
        with gzip.open(path, "rb") as src, open(copy, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise unreadable(path, kind, e) from e
    return copy, kind


def unreadable(path: Path, kind: str, error: Exception, copy: Path | None = None) -> DataError:
    """The error a library gave for `path`, naming it rather than its temporary `copy`."""
    if isinstance(error, UnicodeDecodeError):
        return DataError(f"{path} is not valid UTF-8 ({error.reason} at byte {error.start}); "
                         "re-encode it as UTF-8")
    said = str(error).replace(str(copy), str(path)) if copy else error
    gz = " (gzip)" if path.suffix == ".gz" else ""
    return DataError(f"could not read {path} as {kind[1:]}{gz}: {said}. Is the file complete? "
                     "Copy or download it again")


def read_options(path: Path, kind: str) -> tuple[dict, pd.Index | None]:
    """`load_dataset` options that read a file as the json module, or pandas with dtype=str, do;
    and JSON Lines' line numbers. A ValueError for JSON that is not lines of objects (an array, a
    `null` line): pyarrow's reader crashes the process on a `null` line (apache/arrow#47409), so
    the json module reads those."""
    if kind in (".json", ".jsonl"):
        lines = object_lines(path)
        if lines is None:
            raise ValueError(f"{path} is not JSON Lines of objects")
        # A column of mixed types (a premise that is sometimes 7) fails instead of becoming the
        # Json type (datasets 4.7, huggingface/datasets#8027): the json module then names the line.
        return {"on_mixed_types": None}, lines
    if kind == ".parquet":
        return {}, None
    options = _csv_options(path, kind)  # every cell as text, "" as "": "1999" stays a string
    header = pd.read_csv(path, nrows=0, **options).columns
    return {**options, "keep_default_na": False,
            "features": Features(dict.fromkeys(header, Value("string")))}, None


def _csv_options(path: Path, kind: str) -> dict:
    if kind == ".csv":
        return {}
    # Standard CSV quoting only for a TSV that parses strictly so: raw MultiNLI's quotes are text,
    # often unbalanced (`"Hello," he said.`).
    text = path.read_text(encoding="utf-8-sig")
    try:
        if '"' in text:
            for _ in csv.reader(text.splitlines(keepends=True), delimiter="\t", strict=True):
                pass
    except csv.Error:
        return {"sep": "\t", "quoting": csv.QUOTE_NONE}
    return {"sep": "\t", "quoting": csv.QUOTE_MINIMAL if '"' in text else csv.QUOTE_NONE}


@contextlib.contextmanager
def datasets_quiet():
    """datasets logs a file it cannot read, under its temporary name, before it raises; and draws a
    "Generating train split" bar for a read into memory that takes a blink."""
    logger, bars_were_on = logging.getLogger("datasets"), not datasets.are_progress_bars_disabled()
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    with warnings.catch_warnings():  # it warns where HF_DATASETS_DISABLE_PROGRESS_BARS decides
        warnings.simplefilter("ignore")
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars_were_on:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                datasets.enable_progress_bars()


def as_read(ds: Dataset, kind: str, lines: pd.Index | None) -> pd.DataFrame | None:
    """The rows as Python values, JSON Lines' `lines` as the index; None where pyarrow read JSON
    otherwise than the json module would: dates as timestamps, two objects on one line."""
    if kind in (".json", ".jsonl") and (lines is None or len(lines) != len(ds) or any(
            getattr(f, "dtype", "").startswith("timestamp") for f in ds.features.values())):
        return None
    return pd.DataFrame(ds.to_dict(), index=lines, dtype=object)


def object_lines(path: Path) -> pd.Index | None:
    """The number of each nonblank line of JSON Lines; None if one does not start an object."""
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).strip()
            if line and not line.startswith(b"{"):
                return None
            lines += [number] if line else []
    return pd.Index(lines, name="line")


def read_strictly(path: Path, kind: str, name: Path) -> pd.DataFrame:
    """A file datasets refused, read by pandas or the json module: its rows, or a DataError naming
    `name` (and the line of JSON Lines)."""
    try:
        if kind == ".parquet":  # a saved index would confuse row numbers in errors
            df = pd.read_parquet(path).reset_index(drop=True)
        elif kind in (".json", ".jsonl"):
            df = _read_json(path, name)
        else:
            df = pd.read_csv(path, dtype=str, keep_default_na=False, **_csv_options(path, kind))
    except (ValueError, OSError, csv.Error) as e:  # ParserError and ArrowInvalid are ValueErrors
        raise unreadable(name, kind, e, copy=path) from e
    if len(df) == 0 and len(df.columns) == 0:
        raise DataError(f"data file {name} is empty (no rows); it needs premise, hypothesis, label")
    return df


def _read_json(path: Path, name: Path) -> pd.DataFrame:
    """JSON Lines (the index holds line numbers) or one JSON array of objects."""
    with open(path, "rb") as f:
        if f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"["):
            f.seek(0)
            try:
                records = json.loads(f.read().removeprefix(codecs.BOM_UTF8).decode("utf-8"))
            except (json.JSONDecodeError, RecursionError) as e:
                where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
                raise DataError(f"{name} is not valid JSON ({getattr(e, 'msg', e)}{where})") from e
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise DataError(f"{name} must be a JSON array of objects (or JSON Lines: an "
                                "object a line)")
            return pd.DataFrame(records, dtype=object)
        f.seek(0)
        lines, rows = [], []
        for number, raw in enumerate(f, 1):
            try:
                line = (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{name} line {number} is not valid UTF-8 ({e.reason} at byte "
                                f"{e.start} of the line); re-encode the file as UTF-8") from e
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as e:
                where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                raise DataError(f"{name} line {number} is not valid JSON ({getattr(e, 'msg', e)}"
                                f"{where}); each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise DataError(f"{name} line {number} is a JSON {json_type(row)}, not an object;"
                                ' each line must be one object like {"premise": ..., "hypothesis":'
                                ' ..., "label": ...}')
            lines.append(number)
            rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(lines, name="line"), dtype=object)


# -- a folder of splits ---------------------------------------------------------------------------
SPLIT_ALIASES = {"train": "train", "validation_matched": "validation_matched",
                 "dev_matched": "validation_matched", "validation": "validation_matched",
                 "dev": "validation_matched", "validation_mismatched": "validation_mismatched",
                 "dev_mismatched": "validation_mismatched"}


def split_files(folder: Path) -> dict[str, Path]:
    """{split: its file} in a folder of `train.*`, `dev_matched.*`, ... files, raw MultiNLI's names
    too; never a silent pick (train.csv over train.jsonl, a backup over the real file)."""
    found: dict[str, list[Path]] = {}
    for file in sorted(folder.iterdir()):
        stem = file.name.split(".")[0].removeprefix("multinli_1.0_")
        if stem in SPLIT_ALIASES and any(s in SUFFIXES for s in file.suffixes):
            found.setdefault(SPLIT_ALIASES[stem], []).append(file)
    several = [f"{k}: {', '.join(f.name for f in fs)}" for k, fs in found.items() if len(fs) > 1]
    if several:
        raise DataError(f"directory {folder} has several files for one split "
                        f"({'; '.join(several)}); keep one file per split there (move the others "
                        "out), or pass the file you mean with --data")
    if "train" not in found:
        raise DataError(f"directory {folder} has no train.* file; expected train.jsonl (or .csv/"
                        ".tsv/.parquet) and optionally validation_matched.* and "
                        "validation_mismatched.*")
    return {split: files[0] for split, files in found.items()}


# -- the rows -------------------------------------------------------------------------------------
def check_columns(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """premise/hypothesis/label(/genre) from either schema, or a DataError listing what is there.
    Rows mixing both schemas make one table: each row takes whichever it has; both must agree."""
    seen = [str(c) for c in df.columns]
    for alias, name in COLUMN_ALIASES.items():
        if alias in df.columns and name in df.columns:
            mine, theirs = (df[c].map(lambda v: not missing(v) and v != "") for c in (name, alias))
            clash = mine & theirs & df[name].combine(df[alias], lambda a, b: str(a) != str(b))
            if clash.any():
                raise DataError(f"{source} has both {name!r} and {alias!r} on "
                                f"{where(df, clash.idxmax())} with different values; keep one "
                                "schema (premise/hypothesis/label or sentence1/sentence2/"
                                "gold_label) per row")
            df = df.assign(**{name: df[name].where(mine, df[alias])})
    df = df.rename(columns={k: v for k, v in COLUMN_ALIASES.items() if v not in df.columns})
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
    """0/1/2, UNLABELLED_ID for -1/'-'/''/null, or None when not a label. Names in any case, 0/1/2
    as ints, integral floats (an int column with gaps) or text; booleans are not labels."""
    if missing(value):
        return UNLABELLED_ID
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, float, np.number)):
        return None
    text = str(value).strip().lower()  # 1 -> "1", 1.0 -> "1.0", " Neutral" -> "neutral"
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
            raise DataError(f"{source}: the {col} on {where(texts, at)} is not valid Unicode "
                            "(it holds an unpaired surrogate, such as a JSON \\ud800 escape); "
                            "fix or remove that row")
        raise DataError(f"{source}: the {col} on {where(texts, at)} is {_shown(texts[at])} "
                        f"({'an' if what[0] in 'aeiou' else 'a'} {what}), not text; "
                        f"every {col} must be a string")
    return kinds == "blank"


def missing(value) -> bool:
    return (value is None or value is pd.NA or value is pd.NaT
            or (isinstance(value, (float, np.floating)) and np.isnan(value)))


def _text_kind(value) -> str:
    """'ok', 'blank' (null, empty or whitespace), 'surrogate' (unencodable) or its JSON type."""
    if isinstance(value, str):
        return "blank" if not value.strip() else "surrogate" if SURROGATE.search(value) else "ok"
    return "blank" if missing(value) else json_type(value)


def json_type(value) -> str:
    """A Python value's JSON type name, for error messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _shown(value) -> str:
    """A value for an error message: short, and printable whatever it holds."""
    if isinstance(value, str):
        text = repr(value.strip().lower())
    elif isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        text = repr(str(value))
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def where(rows: pd.Series | pd.DataFrame, label) -> str:
    """'line N' for JSON Lines (the index holds line numbers), else 'row N' counting rows from 1."""
    return f"line {label}" if rows.index.name == "line" else f"row {label + 1}"


# -- tokenising: the settings ---------------------------------------------------------------------
def check_tokenizer(tokenizer, max_length: int) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; "
                        "use a fast one (AutoTokenizer default)")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 1_000_000 and max_length > limit:
        raise ConfigError(f"max_length={max_length} is more than this model takes "
                          f"({limit} tokens); use --max_length {limit} or less")
