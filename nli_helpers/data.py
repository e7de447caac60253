"""The data path, one way: read a file, normalise its rows, split by premise, load a source,
tokenise (cached across runs), batch pairs of similar length and pad them.

    >>> splits = load_nli_splits("dev_matched.jsonl")  # or "sample", a folder, gs://, a hub name
    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)  # truncated, not padded
    >>> sampler = LengthGroupedBatchSampler(tokenized["train"]["length"], batch_size=32, seed=42)
    >>> PaddedCollator(tokenized["train"], tokenizer)([3, 1, 4])        # a padded batch of rows

Splits: `train`, `validation_matched` (held out by premise when the source has none) and maybe
`validation_mismatched`, with `premise`, `hypothesis`, `label` (0 entailment, 1 neutral,
2 contradiction: the hub's order) and `genre` when known; raw MultiNLI's column names work too.
"""

from __future__ import annotations

import codecs
import csv
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset, DatasetDict
from filelock import FileLock
from tokenizers import Tokenizer

from . import mnli
from .config import LABELS, ConfigError, NLIError
from .config import cache_dir as package_cache_dir

log = logging.getLogger(__name__)

LABEL2ID = {name: i for i, name in enumerate(LABELS)}
SAMPLE_PATH = Path(__file__).parent / "sample" / "mnli_sample.jsonl"  # 360 hand-written test pairs
# Real MultiNLI pairs for smoke: found on this machine or the hub (mnli.py), never shipped.
MNLI_SUBSET = "mnli-subset"


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


@dataclass
class LoadReport:
    """What the loader dropped, so a notebook can show it instead of hiding it."""

    source: str
    dropped_unlabelled: int = 0   # gold label -1, '-', empty or null
    dropped_blank: int = 0        # premise or hypothesis null, empty or whitespace only
    dropped_duplicates: int = 0   # repeats of an earlier (premise, hypothesis, label) in one file
    conflicting_labels: int = 0   # kept: rows whose (premise, hypothesis) also has another label
    rows: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v:,}" for k, v in self.rows.items())
        text = (f"{self.source}: {sizes}; dropped {self.dropped_unlabelled:,} unlabelled rows "
                f"(-1, '-' or empty), {self.dropped_blank:,} with a blank premise or hypothesis, "
                f"{self.dropped_duplicates:,} exact duplicates")
        if self.conflicting_labels:
            text += (f"; kept {self.conflicting_labels:,} rows whose premise and hypothesis "
                     "also appear with a different label")
        return text


# -- reading a file -------------------------------------------------------------------------------
COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
KNOWN_COLUMNS = frozenset({"premise", "hypothesis", "label", "genre", *COLUMN_ALIASES})
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


def read_table(path: str | Path) -> pd.DataFrame:
    """One jsonl/json/csv/tsv/parquet file (optionally gzipped) as a DataFrame; any failure is one
    DataError naming the file. JSON keeps each value's type; csv/tsv cells stay text."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; pass --data with an existing file, a "
                        "directory of split files, a gs:// URI, a hub name or 'sample'")
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty; it needs premise, hypothesis and label")
    gz = path.suffix == ".gz"
    kind = path.suffixes[-2] if gz and len(path.suffixes) > 1 else path.suffix
    if kind not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {kind!r}; use {'/'.join(SUFFIXES)}(.gz)")
    try:
        df = _READERS.get(kind, _read_json)(path)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "re-encode it as UTF-8") from e
    # Truncated or corrupt files: gzip raises EOFError, BadGzipFile (an OSError) or zlib.error;
    # pyarrow ArrowInvalid (a ValueError) or OSError; pandas' csv parser ParserError (a ValueError).
    except (ValueError, OSError, EOFError, zlib.error, csv.Error) as e:
        raise DataError(f"could not read {path} as {kind[1:]}{' (gzip)' if gz else ''}: {e}. "
                        "Is the file complete? Copy or download it again") from e
    if len(df) == 0 and len(df.columns) == 0:
        raise DataError(f"data file {path} is empty (no rows); it needs premise, hypothesis, label")
    return df


def _read_csv(path: Path, **options) -> pd.DataFrame:
    # Text stays text: a premise "1" or a label "1.0" is not guessed into a number, "" stays "".
    return pd.read_csv(path, dtype=str, keep_default_na=False, **options)


def _read_tsv(path: Path) -> pd.DataFrame:
    standard = _standard_quoting(path)
    df = _read_csv(path, sep="\t", quoting=csv.QUOTE_MINIMAL if standard else csv.QUOTE_NONE)
    df.attrs["quoting"] = "standard CSV quoting" if standard else "literal"
    return df


def _standard_quoting(path: Path) -> bool:
    """Does this TSV quote fields the CSV way (pandas, Excel)? Raw MultiNLI's quotes are text, often
    unbalanced (`"Hello," he said.`), so only a file that parses strictly that way is read so."""
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
    """JSON Lines or one JSON array of objects, through the json module: pandas' reader names no
    line, refuses a byte-order mark, drops unpaired surrogates and turns a premise "1" into 1. Rows
    keep only the known columns (the first keys seen are kept for errors); the index holds JSON
    Lines' line numbers."""
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
        text = f.read().removeprefix(codecs.BOM_UTF8).decode("utf-8")  # read_table words an error
        try:
            records = json.loads(text)
        except (ValueError, RecursionError) as e:
            where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
            raise DataError(f"{path} is not valid JSON ({getattr(e, 'msg', e)}{where})") from e
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise DataError(f"{path} must be a JSON array of objects (or JSON Lines: an object a "
                            "line)")
        yield from ((None, record) for record in records)
        return
    f.seek(0)
    for number, raw in enumerate(f, 1):
        try:
            line = (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path} line {number} is not valid UTF-8 ({e.reason} at byte "
                            f"{e.start} of the line); re-encode the file as UTF-8") from e
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise DataError(f"{path} line {number} is not valid JSON ({getattr(e, 'msg', e)}"
                            f"{where}); each line must be one JSON object") from e
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number} is a JSON {_json_type(row)}, not an object; "
                            'each line must be one object like {"premise": ..., "hypothesis": ..., '
                            '"label": ...}')
        yield number, row


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _json_type(value) -> str:
    """A Python value's JSON type name, for error messages."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
               float: "number", type(None): "null"}
# A parquet file's saved index would confuse row numbers in errors.
_READERS = {".csv": _read_csv, ".tsv": _read_tsv, ".txt": _read_tsv,
            ".parquet": lambda path: pd.read_parquet(path).reset_index(drop=True)}


# -- normalising a table --------------------------------------------------------------------------
UNLABELLED, UNLABELLED_ID = {"-", "-1", ""}, -1
# Numeric labels as text: "1", "-1", and "1.0" (a label column with gaps, as pandas gives it back).
LABEL_NUMBER = re.compile(r"-?[0-9]+(\.0*)?")
# An unpaired surrogate (JSON can spell one as "\ud800") is not Unicode text: nothing can encode it.
SURROGATE = re.compile(r"[\ud800-\udfff]")


def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Rename columns to premise/hypothesis/label(/genre), map labels to ids, drop what can't train.

    Dropped and counted in `report`: unlabelled rows, blank texts (one must not sink a 400k-row
    file), exact repeats (they would count twice). The same pair under two labels is kept and
    counted (crowd labels disagree). Anything else is a DataError naming the first bad line/row."""
    seen = df.attrs.get("columns_seen") or [str(c) for c in df.columns]
    df = _merge_schemas(df, source)
    df = df.rename(columns={k: v for k, v in COLUMN_ALIASES.items() if v not in df.columns})
    missing = [c for c in ("premise", "hypothesis", "label") if c not in df.columns]
    if missing:
        found = ", ".join(repr(c) for c in seen[:20]) + (", ..." if len(seen) > 20 else "")
        raise DataError(f"{source} lacks column(s) {', '.join(missing)} (found: {found or 'none'})"
                        "; name them premise/hypothesis/label or sentence1/sentence2/gold_label")
    keep = ["premise", "hypothesis", "label"] + (["genre"] if "genre" in df.columns else [])
    twice = sorted({c for c in df.columns[df.columns.duplicated()] if c in keep})
    if twice:
        raise DataError(f"{source} has the column(s) {', '.join(twice)} more than once; "
                        "keep one of each")
    df = df[keep].copy()
    read = len(df)

    ids = df["label"].map(label_id)
    unknown = ids.isna()
    if unknown.any():
        bad = df.loc[unknown, "label"]
        shown = ", ".join(sorted({_shown(v) for v in bad})[:5])
        raise DataError(f"{source} has unknown label value(s) {shown} "
                        f"(first on {_where(df, bad.index[0])}); labels must be {'/'.join(LABELS)} "
                        "or 0/1/2 (rows labelled -1, '-' or nothing are dropped)")
    unlabelled = ids == UNLABELLED_ID
    report.dropped_unlabelled += int(unlabelled.sum())
    df = df[~unlabelled].assign(label=ids[~unlabelled].astype("int64"))

    blank = pd.Series(False, index=df.index)
    for col in ("premise", "hypothesis"):
        kinds = df[col].map(_text_kind)
        bad = ~kinds.isin(("ok", "blank"))
        if bad.any():
            at = bad.idxmax()
            kind = kinds[at]
            if kind == "surrogate":
                raise DataError(f"{source}: the {col} on {_where(df, at)} is not valid Unicode "
                                "(it holds an unpaired surrogate, such as a JSON \\ud800 escape); "
                                "fix or remove that row")
            raise DataError(f"{source}: the {col} on {_where(df, at)} is {_shown(df.at[at, col])} "
                            f"({'an' if kind[0] in 'aeiou' else 'a'} {kind}), not text; "
                            f"every {col} must be a string")
        blank |= kinds == "blank"
    report.dropped_blank += int(blank.sum())
    df = df[~blank]
    for col in ("premise", "hypothesis"):
        df[col] = df[col].astype(str)
    if "genre" in df.columns:  # a tag for per-genre scores: anything goes, as encodable text
        df["genre"] = df["genre"].map(lambda v: "unknown" if _missing(v) else
                                      str(v).encode("utf-8", "replace").decode("utf-8"))

    duplicate = df.duplicated(["premise", "hypothesis", "label"])
    report.dropped_duplicates += int(duplicate.sum())
    df = df[~duplicate]
    report.conflicting_labels += int(df.duplicated(["premise", "hypothesis"], keep=False).sum())
    if df.empty:
        raise DataError(f"{source} has no usable rows left: of {read:,} rows, "
                        f"{int(unlabelled.sum()):,} are unlabelled and {int(blank.sum()):,} have a "
                        "blank premise or hypothesis")
    return df.reset_index(drop=True)


def _merge_schemas(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Rows mixing both schemas (premise/label here, sentence1/gold_label there) make one table:
    each row takes whichever it has; a row with both must agree."""
    for alias, name in COLUMN_ALIASES.items():
        if alias not in df.columns or name not in df.columns:
            continue
        mine, theirs = df[name].map(_present), df[alias].map(_present)
        clash = mine & theirs & (df[name].astype(str) != df[alias].astype(str))
        if clash.any():
            raise DataError(f"{source} has both {name!r} and {alias!r} on "
                            f"{_where(df, clash.idxmax())} with different values; keep one schema "
                            "(premise/hypothesis/label or sentence1/sentence2/gold_label) per row")
        df = df.assign(**{name: df[name].where(mine, df[alias])}).drop(columns=alias)
    return df


def label_id(value) -> int | None:
    """0/1/2, UNLABELLED_ID for -1/'-'/''/null, or None when not a label. Names in any case, 0/1/2
    as ints, integral floats (an int column with gaps) or text; booleans are not labels."""
    if _missing(value):
        return UNLABELLED_ID
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            return None
        value = int(value)
    if isinstance(value, (int, np.integer)):
        return int(value) if -1 <= value < len(LABELS) else None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in UNLABELLED:
            return UNLABELLED_ID
        if text in LABEL2ID:
            return LABEL2ID[text]
        if LABEL_NUMBER.fullmatch(text) and len(text) < 20:
            return label_id(int(text.split(".")[0]))
    return None


def _missing(value) -> bool:
    return (value is None or value is pd.NA or value is pd.NaT
            or (isinstance(value, (float, np.floating)) and math.isnan(value)))


def _present(value) -> bool:
    return not _missing(value) and value != ""


def _text_kind(value) -> str:
    """'ok', 'blank' (null, empty or whitespace), 'surrogate' (unencodable) or its JSON type."""
    if isinstance(value, str):
        if not value.strip():
            return "blank"
        return "surrogate" if SURROGATE.search(value) else "ok"
    return "blank" if _missing(value) else _json_type(value)


def _shown(value) -> str:
    """A value for an error message: short, and printable whatever it holds."""
    if isinstance(value, str):
        text = repr(value.strip().lower())
    elif (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_))):
        text = repr(str(value))
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _where(df: pd.DataFrame, label) -> str:
    """'line N' for JSON Lines (the index holds line numbers), else 'row N' counting rows from 1."""
    if df.index.name == "line":
        return f"line {label}"
    return f"row {label + 1}" if isinstance(label, (int, np.integer)) else f"row {label!r}"


# -- the premise split ----------------------------------------------------------------------------
_Frames = dict[str, pd.DataFrame]  # split name -> its normalised rows
# MultiNLI's genres: the five seen in training ("matched") and the five held out.
MATCHED_GENRES = ("fiction", "government", "slate", "telephone", "travel")
MISMATCHED_GENRES = ("facetoface", "letters", "nineeleven", "oup", "verbatim")


def split_by_premise(df: pd.DataFrame, eval_fraction: float,
                     seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out about `eval_fraction` of rows by a hash of the premise, so no premise is in both
    parts: MultiNLI scatters a premise's hypotheses through a file, so a split by position leaks."""
    def held(premise: str) -> bool:
        digest = hashlib.sha1(f"{seed}:{premise}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction

    held_out = df["premise"].map(held).to_numpy()
    return df[~held_out].reset_index(drop=True), df[held_out].reset_index(drop=True)


def _held_out(frames: _Frames, train: str, eval_fraction: float, seed: int) -> _Frames:
    """Without a validation_matched split, hold out part of train by premise."""
    if "validation_matched" in frames:
        return frames
    kept, held_out = split_by_premise(frames["train"], eval_fraction, seed)
    if kept.empty or held_out.empty:
        raise DataError(f"splitting {train} by premise with eval_fraction={eval_fraction} left an "
                        f"empty part (of {len(frames['train']):,} rows); use more data or another "
                        "eval_fraction, or give validation_matched its own file")
    return {**frames, "train": kept, "validation_matched": held_out}


def _single_frame(df: pd.DataFrame, name: str, eval_fraction: float, seed: int) -> _Frames:
    """One table: MultiNLI's held-out genres become validation_mismatched, the rest is split."""
    genre = df["genre"] if "genre" in df.columns else pd.Series(dtype=object)
    mismatched = genre.isin(MISMATCHED_GENRES)
    if not (mismatched.any() and genre.isin(MATCHED_GENRES).any()):
        return _held_out({"train": df}, name, eval_fraction, seed)
    return {**_held_out({"train": df[~mismatched]}, name, eval_fraction, seed),
            "validation_mismatched": df[mismatched].reset_index(drop=True)}


# -- sources --------------------------------------------------------------------------------------
SPLIT_ALIASES = {"train": "train", "validation_matched": "validation_matched",
                 "dev_matched": "validation_matched", "validation": "validation_matched",
                 "dev": "validation_matched", "validation_mismatched": "validation_mismatched",
                 "dev_mismatched": "validation_mismatched"}


def load_nli_splits(source: str = "sample", *, eval_fraction: float = 0.1, seed: int = 42,
                    fraction_of_train_data: float = 1.0, max_train_samples: int | None = None,
                    max_eval_samples: int | None = None) -> DatasetDict:
    """Load `source` into train / validation_matched (/ validation_mismatched) splits; what was
    dropped is in `splits.report`. Sources: `sample` (bundled), `mnli-subset` (`mnli` finds it),
    a jsonl/json/csv/tsv/parquet file (.gz too), a folder of `train.*`, `validation_matched.*`
    (`dev_matched.*`) and `validation_mismatched.*` files, a `gs://` file or folder, a hub name."""
    report = LoadReport(str(source))
    frames = _load_frames(str(source), report, eval_fraction, seed)
    splits = DatasetDict({name: Dataset.from_pandas(df, preserve_index=False)
                          for name, df in frames.items()})
    splits = subsample(splits, fraction_of_train_data, max_train_samples, max_eval_samples, seed)
    if len(splits["train"].unique("label")) < 2:  # it would learn that label, and score 1.000
        raise DataError(f"the {len(splits['train'])} training pairs of {source} (after any "
                        "--max_train_samples) have one label: a classifier needs two or more to "
                        "learn from. Check the label column, or train on more pairs")
    report.rows = {name: len(ds) for name, ds in splits.items()}
    log.info("%s", report)
    splits.report = report  # type: ignore[attr-defined]
    return splits


def _load_frames(source: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    if source.startswith("gs://"):
        return _load_gcs(source.rstrip("/"), report, eval_fraction, seed)
    if source == MNLI_SUBSET:
        return _load_mnli_subset(report, eval_fraction, seed)
    path = SAMPLE_PATH if source == "sample" else Path(source).expanduser()
    name = "bundled sample" if source == "sample" else None
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as e:  # a NUL byte or a name too long for the filesystem
        raise DataError(f"--data {source!r} is not a usable path ({e})") from e
    if is_dir:
        return _load_directory(path, report, eval_fraction, seed)
    if is_file or path.suffix in (*SUFFIXES, ".gz") or source.startswith((".", "/")):
        name = name or str(path)
        df = normalise_frame(read_table(path), name, report)
        return _single_frame(df, name, eval_fraction, seed)
    return _load_hub(source, report, eval_fraction, seed)


def _load_mnli_subset(report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    return _single_frame(_mnli_subset_frame(report), MNLI_SUBSET, eval_fraction, seed)


def _mnli_subset_frame(report: LoadReport) -> pd.DataFrame:
    """The subset rule's pairs of MultiNLI dev_matched, from wherever `mnli` finds it."""
    try:
        found = mnli.find_dev_matched()
    except mnli.NotFound as e:
        raise DataError(f"--data {MNLI_SUBSET}: {e}; {mnli.WHAT_TO_DO}, or pass --data sample "
                        "(the hand-written pairs)") from e
    report.source = f"{MNLI_SUBSET} (MultiNLI dev_matched from {found.origin})"
    df = normalise_frame(read_table(found.path), str(found.path), report)
    return df[df["premise"].map(mnli.in_subset)].reset_index(drop=True)


def write_mnli_subset(out: str | Path) -> Path:
    """Write the `mnli-subset` pairs as JSON Lines to `out`, for a job to read (a Vertex job cannot
    see this machine's files): loading that file gives the same splits as `mnli-subset`."""
    df = _mnli_subset_frame(LoadReport(MNLI_SUBSET))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.assign(label=[LABELS[i] for i in df["label"]]).to_json(
        out, orient="records", lines=True, force_ascii=False)
    return out


def _load_directory(path: Path, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    found: dict[str, list[Path]] = {}
    for file in sorted(path.iterdir()):
        stem = file.name.split(".")[0].removeprefix("multinli_1.0_")
        if stem in SPLIT_ALIASES and any(s in SUFFIXES for s in file.suffixes):
            found.setdefault(SPLIT_ALIASES[stem], []).append(file)
    # Never pick silently (train.csv over train.jsonl, a backup over the real file): name them all.
    several = [f"{k}: {', '.join(f.name for f in fs)}" for k, fs in found.items() if len(fs) > 1]
    if several:
        raise DataError(f"directory {path} has several files for one split ({'; '.join(several)});"
                        " keep one file per split there (move the others out), or pass the file "
                        "you mean with --data")
    if "train" not in found:
        raise DataError(f"directory {path} has no train.* file; expected train.jsonl (or .csv/"
                        ".tsv/.parquet) and optionally validation_matched.* and "
                        "validation_mismatched.*")
    frames = {split: normalise_frame(read_table(f), str(f), report) for split, [f] in found.items()}
    return _held_out(frames, str(found["train"][0]), eval_fraction, seed)


def _load_gcs(uri: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    from . import storage

    with storage.local_copy(uri) as local:  # the frames are in memory once it is removed
        try:
            return _load_frames(str(local), report, eval_fraction, seed)
        except DataError as e:  # name the object the user passed, not the local copy
            raise DataError(str(e).replace(str(local), uri)) from e


def _load_hub(name: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    from datasets import load_dataset

    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name):
        raise DataError(f"--data {name!r} is neither an existing file or directory, a gs:// URI "
                        "nor a hub name")
    try:
        raw = load_dataset(name)
    except Exception as e:  # the hub raises many types; all mean "could not load this name"
        raise DataError(f"could not load {name!r} from the Hugging Face hub "
                        f"({type(e).__name__}: {e}). Offline? Pass a local file or directory "
                        "with --data, or 'sample'") from e
    frames = {SPLIT_ALIASES[split]: normalise_frame(ds.to_pandas(), f"{name}[{split}]", report)
              for split, ds in raw.items() if split in SPLIT_ALIASES}
    if "train" not in frames:
        raise DataError(f"hub dataset {name!r} has no train split (it has {', '.join(raw)})")
    return _held_out(frames, f"{name}[train]", eval_fraction, seed)


def subsample(splits: DatasetDict, fraction: float, max_train: int | None, max_eval: int | None,
              seed: int) -> DatasetDict:
    """Seeded random subsets for quick runs: a fraction and/or a cap on train, a cap on eval."""
    out = {}
    for name, ds in splits.items():
        n = len(ds)
        if name == "train":
            n = max(1, int(n * fraction))
            n = min(n, max_train) if max_train else n
        elif max_eval:
            n = min(n, max_eval)
        out[name] = ds if n == len(ds) else ds.shuffle(seed=seed).select(range(n))
    return DatasetDict(out)


# -- tokenising and the token cache ---------------------------------------------------------------
# Texts are cut to this many characters per token of max_length before tokenising: the same tokens
# for any real text, but the fast tokenizer's pair truncation builds every combination of both
# texts' overflow windows (huggingface/tokenizers#2035): tens of GB for two 20,000-token texts.
CHARS_PER_TOKEN_CAP = 32
CACHE_FORMAT = 1  # part of every key: bump it when tokenize_splits gives other columns or values


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128, *,
                    cache_dir: str | os.PathLike | None = None,
                    use_cache: bool = True) -> DatasetDict:
    """Tokenise every split, truncated but never padded (padding is per batch), with a `length`.

    Kept in `cache_dir` (else `token_cache_dir()`) under `cache_key`, for the next run and the other
    ranks (`tokenized.cache_hits` says which were read back); `use_cache=False` writes nothing."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; "
                        "use a fast one (AutoTokenizer default)")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 1_000_000 and max_length > limit:
        raise ConfigError(f"max_length={max_length} is more than this model takes "
                          f"({limit} tokens); use --max_length {limit} or less")
    cap = CHARS_PER_TOKEN_CAP * max_length

    def encode(batch):
        premises = [t[:cap] for t in batch["premise"]]
        hypotheses = [t[:cap] for t in batch["hypothesis"]]
        enc = tokenizer(premises, hypotheses, truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    folder = Path(cache_dir or token_cache_dir()) if use_cache else None
    # The readable part of an entry's name: the tokenizer's name or folder, and max_length.
    name = "_".join(Path(str(tokenizer.name_or_path)).parts[-2:]) or type(tokenizer).__name__
    prefix = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{max_length}"
    tokenized, hits = DatasetDict(), {}
    for split, ds in splits.items():
        drop = [c for c in ds.column_names if c not in ("label", "genre")]
        tokenise = functools.partial(ds.map, encode, batched=True, batch_size=1000,
                                     remove_columns=drop, desc=f"tokenise {split}")
        if folder is None:
            tokenized[split], hits[split] = tokenise(), False
        else:
            path = folder / f"{prefix}-{cache_key(ds, tokenizer, max_length)}.arrow"
            tokenized[split], hits[split] = _cached_map(tokenise, path, len(ds))
    tokenized.cache_hits = hits  # type: ignore[attr-defined]
    return tokenized


def token_cache_dir() -> Path:
    """`config.cache_dir()`/tokens. Never evicted; safe to delete."""
    return package_cache_dir() / "tokens"


def cache_key(split, tokenizer, max_length: int) -> str:
    """A hash of all the tokens depend on: the split's content, the whole tokenizer (not its name:
    two copies give the same tokens), max_length and this code's format."""
    digest = hashlib.sha256()
    # The tokenizer as saved, less the truncation and padding that its last call left set.
    saved = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    saved.no_truncation()
    saved.no_padding()
    for part in (f"format {CACHE_FORMAT} cap {CHARS_PER_TOKEN_CAP} max_length {max_length}",
                 type(tokenizer).__name__, tokenizer.truncation_side,
                 " ".join(tokenizer.model_input_names), saved.to_str(),
                 content_hash(split)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def content_hash(split) -> str:
    """SHA-256 of a split's rows in order (Arrow IPC bytes, less datasets' fingerprint of how it was
    made, e.g. the tokenizer's folder): the token cache's key and a resume's check of its data."""
    table = split.with_format("arrow")[:].combine_chunks().replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def _cached_map(tokenise, path: Path, rows: int) -> tuple[Dataset, bool]:
    """(split, hit): read from `path` if it holds all `rows`, else tokenised into it. A file lock
    makes one process tokenise while the others wait; datasets writes a temporary file and renames
    it, so a killed run leaves no entry; a damaged one is rebuilt."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if path.exists():
                try:
                    cached = Dataset.from_file(str(path))
                    problem = f"{len(cached):,} rows instead of {rows:,}"
                    if len(cached) == rows:
                        log.info("tokens read from the cache: %s", path)
                        return cached, True
                except Exception as e:  # pyarrow and datasets raise several types for damage
                    problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("token cache entry %s is damaged (%s); tokenising again", path.name,
                            problem)
            return tokenise(cache_file_name=str(path), load_from_cache_file=False), False
    except OSError as e:  # a read-only or full disk must not stop a run: tokenise in memory
        log.warning("token cache %s unusable (%s); tokenising without it", path.parent, e)
        return tokenise(), False


# -- batches --------------------------------------------------------------------------------------
class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of similar length in a random order: the padding shrinks, the order stays random.

    Each epoch: shuffle, sort each mega-batch of `batch_size * mega_batches` by length, cut into
    batches, shuffle those. `batch_size` is global: each of `num_replicas` ranks takes its share,
    drawing the same order (same seed), so N processes see exactly the batches one would."""

    def __init__(self, lengths: list[int] | np.ndarray, batch_size: int, *, seed: int = 0,
                 group_by_length: bool = True, mega_batches: int = 50, num_replicas: int = 1,
                 rank: int = 0):
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.group = batch_size, seed, group_by_length
        self.mega, self.num_replicas, self.rank = mega_batches, num_replicas, rank
        self.epoch = self.skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Choose the epoch's order; `skip_batches` resumes mid-epoch (after a checkpoint)."""
        self.epoch, self.skip = epoch, skip_batches

    def batches(self) -> list[np.ndarray]:
        """This rank's share of each of this epoch's batches."""
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.lengths))
        size = self.batch_size
        if self.group:
            mega = size * self.mega
            chunks = [order[i:i + mega] for i in range(0, len(order), mega)]
            order = np.concatenate([c[np.argsort(-self.lengths[c], kind="stable")] for c in chunks])
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        if self.group:
            batches = [batches[i] for i in rng.permutation(len(batches))]
            # The longest batch first, as Hugging Face's sampler does: an out-of-memory shows at
            # step 1, and the allocator sizes its pools once.
            longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i]].max())
            batches[0], batches[longest] = batches[longest], batches[0]
        # A last batch too small to give every rank an example is dropped: all ranks step together.
        return [b[self.rank::self.num_replicas] for b in batches if len(b) >= self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        return (b.tolist() for b in self.batches()[self.skip:])

    def __len__(self) -> int:
        """Batches in a whole epoch (skipped ones included: the loop counts epochs with it)."""
        n, size = len(self.lengths), self.batch_size
        return n // size + (n % size >= self.num_replicas)


class PaddedCollator:
    """Pads rows of a tokenised split, given by row numbers, into what `DataCollatorWithPadding`
    gives, with array operations on flat token arrays: no loop over examples. A DataLoader's
    `collate_fn` over `range(len(split))` with a `batch_sampler`."""

    def __init__(self, split, tokenizer, pad_to_multiple_of: int | None = None):
        table = split.with_format("arrow")[:]  # the rows as the split sees them (select, shuffle)
        pad = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0,
               "token_type_ids": tokenizer.pad_token_type_id}
        self.pad = {name: value for name, value in pad.items() if name in table.column_names}
        self.flat = {name: pc.list_flatten(table.column(name)).to_numpy() for name in self.pad}
        self.lengths = pc.list_value_length(table.column("input_ids")).to_numpy().astype(np.int64)
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.labels = table.column("label").to_numpy() if "label" in table.column_names else None
        self.multiple, self.left = pad_to_multiple_of, tokenizer.padding_side == "left"

    def __call__(self, rows) -> dict[str, torch.Tensor]:
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows][:, None]
        width = int(lengths.max())
        if self.multiple:
            width = -(-width // self.multiple) * self.multiple
        # Column j of a row holds its token j - shift; shift > 0 only when padding on the left.
        token = np.arange(width) - (width - lengths if self.left else 0)
        real = (token >= 0) & (token < lengths)
        where = np.where(real, self.starts[rows][:, None] + token, 0)
        batch = {}
        for name, pad in self.pad.items():
            padded = np.where(real, self.flat[name][where], pad)
            batch[name] = torch.from_numpy(padded.astype(np.int64))
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[rows].astype(np.int64))
        return batch


def padding_stats(lengths: list[int] | np.ndarray, batches: list[np.ndarray]) -> dict[str, float]:
    """Real vs padded tokens when each batch is padded to its longest member."""
    lengths = np.asarray(lengths)
    real = int(lengths.sum())
    padded = int(sum(len(b) * lengths[b].max() for b in batches if len(b)))
    return {"real_tokens": real, "padded_tokens": padded,
            "pad_fraction": 1 - real / padded if padded else 0.0}
