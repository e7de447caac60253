"""Load NLI pairs from anywhere into one shape: the labels, the premise split, the sources.

Every loader returns a `datasets.DatasetDict` whose splits (`train`, `validation_matched` and,
when the source has it, `validation_mismatched`) hold the columns `premise`, `hypothesis`,
`label` (0 entailment, 1 neutral, 2 contradiction: the hub's order) and `genre` when known.

    >>> splits = load_nli_splits("sample")                   # bundled, offline
    >>> splits = load_nli_splits("dev_matched.jsonl")        # one file: split by premise
    >>> splits = load_nli_splits("nyu-mll/multi_nli")        # the hub (needs network)

Sources: `sample`; a local jsonl/csv/tsv/parquet file (optionally .gz); a directory of split
files (`train.*`, `validation_matched.*` or `dev_matched.*`, `validation_mismatched.*`); a
`gs://` file or directory; a hub dataset name. Column names may be the hub's
(`premise/hypothesis/label/genre`) or raw MultiNLI's (`sentence1/sentence2/gold_label/genre`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from datasets import Dataset, DatasetDict

from .config import LABELS
from .tables import COLUMN_ALIASES, SUFFIXES, DataError, json_type, read_table

log = logging.getLogger(__name__)

LABEL2ID = {name: i for i, name in enumerate(LABELS)}
UNLABELLED = {"-", "-1", ""}
UNLABELLED_ID = -1
# Numeric labels as text: "1", "-1", and "1.0" (how a label column with gaps comes back from
# pandas).
LABEL_NUMBER = re.compile(r"-?[0-9]+(\.0*)?")
# An unpaired surrogate (JSON can spell one as "\ud800") is not Unicode text: nothing can encode it.
SURROGATE = re.compile(r"[\ud800-\udfff]")
# Texts are cut to this many characters per token of max_length before tokenising (see
# tokenize_splits).
CHARS_PER_TOKEN_CAP = 32
SAMPLE_PATH = Path(__file__).parent / "sample" / "mnli_sample.jsonl"  # 360 hand-written test pairs
# 2,994 real MultiNLI dev_matched pairs chosen by premise (sample/README.md): the offline default of
# `smoke`.
MNLI_SUBSET_PATH = Path(__file__).parent / "sample" / "mnli_dev_matched_subset.jsonl"
BUNDLED = {"sample": (SAMPLE_PATH, "bundled sample"),
           "mnli-subset": (MNLI_SUBSET_PATH, "bundled MultiNLI subset")}
# MultiNLI's genres: the five seen in training ("matched") and the five held out.
MATCHED_GENRES = ("fiction", "government", "slate", "telephone", "travel")
MISMATCHED_GENRES = ("facetoface", "letters", "nineeleven", "oup", "verbatim")
_Frames = dict[str, pd.DataFrame]  # split name -> its normalised rows
SPLIT_ALIASES = {
    "train": "train",
    "validation_matched": "validation_matched", "dev_matched": "validation_matched",
    "validation": "validation_matched", "dev": "validation_matched",
    "validation_mismatched": "validation_mismatched", "dev_mismatched": "validation_mismatched",
}


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


# -- normalising a table ---------------------------------------------------------------


def _merge_schemas(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """A file mixing both schemas (premise/label on some rows, raw MultiNLI's sentence1/gold_label
    on others) is one table: each row takes whichever it has (if it has both, they must agree)."""
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


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and value != ""


def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Rename columns to premise/hypothesis/label(/genre), map labels to ids, drop what can't train.

    Dropped and counted in `report` (the run prints it): unlabelled rows (-1, '-', empty or null
    label: MultiNLI's "no gold label"), rows whose premise or hypothesis is null, empty or only
    whitespace (no pair to learn from; one such row must not sink a 400k-row file), and exact
    repeats of an earlier (premise, hypothesis, label) row in the same file (they would count twice
    in training and evaluation). The same pair under different labels is kept, both rows, and
    counted: crowd labels disagree, and the benchmark's splits keep such rows.

    Anything else raises one DataError naming the first bad line (JSON Lines) or row: a missing
    column, an unknown label, a premise or hypothesis that is not a string or not valid Unicode.
    """
    seen = df.attrs.get("columns_seen") or [str(c) for c in df.columns]
    df = _merge_schemas(df, source)
    df = df.rename(columns={k: v for k, v in COLUMN_ALIASES.items() if v not in df.columns})
    missing = [c for c in ("premise", "hypothesis", "label") if c not in df.columns]
    if missing:
        found = ", ".join(repr(c) for c in seen[:20]) + (", ..." if len(seen) > 20 else "")
        raise DataError(f"{source} lacks column(s) {', '.join(missing)} (found: {found or 'none'})"
                        "; name them premise/hypothesis/label or sentence1/sentence2/gold_label")
    keep = ["premise", "hypothesis", "label"] + (["genre"] if "genre" in df.columns else [])
    if df.columns.duplicated().any():
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
            if kinds[at] == "surrogate":
                raise DataError(f"{source}: the {col} on {_where(df, at)} is not valid Unicode "
                                "(it holds an unpaired surrogate, such as a JSON \\ud800 escape); "
                                "fix or remove that row")
            kind = kinds[at]
            raise DataError(f"{source}: the {col} on {_where(df, at)} is {_shown(df.at[at, col])} "
                            f"({'an' if kind[0] in 'aeiou' else 'a'} {kind}), not text; "
                            f"every {col} must be a string")
        blank |= kinds == "blank"
    report.dropped_blank += int(blank.sum())
    df = df[~blank]
    for col in ("premise", "hypothesis"):
        df[col] = df[col].astype(str)
    if "genre" in df.columns:
        df["genre"] = df["genre"].map(_genre)

    duplicate = df.duplicated(["premise", "hypothesis", "label"])
    report.dropped_duplicates += int(duplicate.sum())
    df = df[~duplicate]
    report.conflicting_labels += int(df.duplicated(["premise", "hypothesis"], keep=False).sum())
    if df.empty:
        raise DataError(f"{source} has no usable rows left: of {read:,} rows, "
                        f"{int(unlabelled.sum()):,} are unlabelled and {int(blank.sum()):,} have a "
                        "blank premise or hypothesis")
    return df.reset_index(drop=True)


def label_id(value) -> int | None:
    """A label as 0/1/2, UNLABELLED_ID (-1) for "no gold label", or None when it is not a label.

    Accepts the names in any case with spaces around, 0/1/2 as integers, as integral floats (1.0:
    how an integer column with gaps comes back from pandas or parquet) or as strings of either.
    -1, '-', '' and null mean unlabelled. Booleans, other numbers, lists and objects are not labels.
    """
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


def _text_kind(value) -> str:
    """'ok', 'blank' (null, empty or whitespace), 'surrogate' (unencodable) or json_type(value)."""
    if isinstance(value, str):
        if not value.strip():
            return "blank"
        return "surrogate" if SURROGATE.search(value) else "ok"
    return "blank" if _missing(value) else json_type(value)


def _genre(value) -> str:
    # Genre is a tag for per-genre scores: anything goes, but it must be encodable text.
    return "unknown" if _missing(value) else str(value).encode("utf-8", "replace").decode("utf-8")


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


# -- splitting ---------------------------------------------------------------------------
def premise_bucket(premise: str, seed: int) -> float:
    """A stable number in [0, 1) from the premise text: the same premise always lands together."""
    digest = hashlib.sha1(f"{seed}:{premise}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_by_premise(df: pd.DataFrame, eval_fraction: float,
                     seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out about `eval_fraction` of rows by premise, so no premise is in both parts.

    MultiNLI repeats each premise with up to six hypotheses scattered through a file; a split by
    row position would put most held-out premises into training.
    """
    held_out = df["premise"].map(lambda p: premise_bucket(p, seed) < eval_fraction).to_numpy()
    return df[~held_out].reset_index(drop=True), df[held_out].reset_index(drop=True)


def splits_from_single_frame(df: pd.DataFrame, eval_fraction: float,
                             seed: int) -> dict[str, pd.DataFrame]:
    """One table → train, validation_matched (by premise), validation_mismatched (by genre)."""
    splits = {}
    if ("genre" in df.columns and df["genre"].isin(MISMATCHED_GENRES).any()
            and df["genre"].isin(MATCHED_GENRES).any()):
        splits["validation_mismatched"] = (df[df["genre"].isin(MISMATCHED_GENRES)]
                                           .reset_index(drop=True))
        df = df[~df["genre"].isin(MISMATCHED_GENRES)]
    train, held_out = split_by_premise(df, eval_fraction, seed)
    if held_out.empty or train.empty:
        raise DataError(f"splitting {len(df)} rows by premise with eval_fraction={eval_fraction} "
                        "left an empty part; use more data or another eval_fraction")
    return {"train": train, "validation_matched": held_out, **splits}


# -- sources -----------------------------------------------------------------------------
def load_nli_splits(source: str = "sample", *, eval_fraction: float = 0.1, seed: int = 42,
                    fraction_of_train_data: float = 1.0, max_train_samples: int | None = None,
                    max_eval_samples: int | None = None) -> DatasetDict:
    """Load `source` into train / validation_matched (/ validation_mismatched) splits."""
    report = LoadReport(str(source))
    frames = _load_frames(str(source), report, eval_fraction, seed)
    splits = DatasetDict({name: Dataset.from_pandas(df, preserve_index=False)
                          for name, df in frames.items()})
    splits = subsample(splits, fraction_of_train_data, max_train_samples, max_eval_samples, seed)
    report.rows = {name: len(ds) for name, ds in splits.items()}
    log.info("%s", report)
    splits.report = report  # type: ignore[attr-defined]
    return splits


def _load_frames(source: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    if source in BUNDLED:
        path, name = BUNDLED[source]
        df = normalise_frame(read_table(path), name, report)
        return splits_from_single_frame(df, eval_fraction, seed)
    if source.startswith("gs://"):
        return _load_gcs(source.rstrip("/"), report, eval_fraction, seed)
    path = Path(source).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as e:  # a NUL byte or a name too long for the filesystem
        raise DataError(f"--data {source!r} is not a usable path ({e})") from e
    if is_dir:
        return _load_directory(path, report, eval_fraction, seed)
    if is_file or path.suffix in (*SUFFIXES, ".gz") or source.startswith((".", "/")):
        df = normalise_frame(read_table(path), str(path), report)
        return splits_from_single_frame(df, eval_fraction, seed)
    return _load_hub(source, report, eval_fraction, seed)


def _load_directory(path: Path, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    found: dict[str, list[Path]] = {}
    for file in sorted(path.iterdir()):
        stem = file.name.split(".")[0].removeprefix("multinli_1.0_")
        if stem in SPLIT_ALIASES and any(s in SUFFIXES for s in file.suffixes):
            found.setdefault(SPLIT_ALIASES[stem], []).append(file)
    # One rule for an ambiguous directory: never pick silently (train.csv over train.jsonl, a
    # backup over the real file, dev_matched over validation_matched); name them all instead.
    several = [f"{k}: {', '.join(f.name for f in fs)}" for k, fs in found.items() if len(fs) > 1]
    if several:
        raise DataError(
            f"directory {path} has several files for one split ({'; '.join(several)}); keep one "
            "file per split there (move the others out), or pass the file you mean with --data"
        )
    if "train" not in found:
        raise DataError(
            f"directory {path} has no train.* file; expected train.jsonl (or .csv/.tsv/.parquet) "
            "and optionally validation_matched.* and validation_mismatched.*"
        )
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
        raise DataError(
            f"could not load {name!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            "Offline? Pass a local file or directory with --data, or 'sample'"
        ) from e
    frames = {
        SPLIT_ALIASES[split]: normalise_frame(ds.to_pandas(), f"{name}[{split}]", report)
        for split, ds in raw.items()
        if split in SPLIT_ALIASES
    }
    if "train" not in frames:
        raise DataError(f"hub dataset {name!r} has no train split (it has {', '.join(raw)})")
    return _held_out(frames, f"{name}[train]", eval_fraction, seed)


def _held_out(frames: _Frames, train: str, eval_fraction: float, seed: int) -> _Frames:
    """Without a validation_matched split, hold out part of train by premise."""
    if "validation_matched" in frames:
        return frames
    kept, held_out = split_by_premise(frames["train"], eval_fraction, seed)
    if kept.empty or held_out.empty:
        raise DataError(f"splitting {train} by premise with eval_fraction={eval_fraction} left an "
                        "empty part; add a validation_matched file, use more data or another "
                        "eval_fraction")
    return {**frames, "train": kept, "validation_matched": held_out}


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
