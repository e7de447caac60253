"""The pairs, one way: read a file (`files.read_pairs`), check and normalise its rows (one clear
error naming the line or row that is wrong), split by premise; `model.tokenize_splits` tokenises
them and `step` batches them.

    >>> splits = load_nli_splits("dev_matched.jsonl")  # or "sample", a folder, gs://, a hub name
    >>> tokenized = model.tokenize_splits(splits, tokenizer, max_length=128)  # model.py

Splits: `train`, `validation_matched` (held out by premise when the source has none) and maybe
`validation_mismatched`, with `premise`, `hypothesis`, `label` (0 entailment, 1 neutral,
2 contradiction: the hub's order) and `genre` when known; raw MultiNLI's column names work too.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from datasets import Dataset, DatasetDict, load_dataset

from . import files
from .config import LABEL2ID, LABELS, DataError

SAMPLE_PATH = Path(__file__).parent / "sample" / "mnli_sample.jsonl"  # 360 hand-written pairs
MNLI_SUBSET = "mnli-subset"  # real MultiNLI pairs, found on this machine or the hub (mnli.py)
# MultiNLI's genres: the five seen in training ("matched") and the five held out.
MATCHED_GENRES = ("fiction", "government", "slate", "telephone", "travel")
MISMATCHED_GENRES = ("facetoface", "letters", "nineeleven", "oup", "verbatim")
SPLIT_ALIASES = {"train": "train", "validation_matched": "validation_matched",
                 "dev_matched": "validation_matched", "validation": "validation_matched",
                 "dev": "validation_matched", "validation_mismatched": "validation_mismatched",
                 "dev_mismatched": "validation_mismatched"}
SPLIT_ORDER = ("train", "validation_matched", "validation_mismatched")
COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
UNLABELLED = {"-", "-1", ""}  # gold label values that mean "no label"
UNLABELLED_ID = -1
LABEL_NUMBER = re.compile(r"-?[0-9]+(\.0*)?")  # "1", "-1", "1.0" (an int column with gaps)
SURROGATE = re.compile(r"[\ud800-\udfff]")  # JSON can spell one ("\ud800"); nothing encodes it


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
        return (f"{self.source}: {sizes}; dropped {self.dropped_unlabelled:,} unlabelled rows "
                f"(-1, '-' or empty), {self.dropped_blank:,} with a blank premise or hypothesis, "
                f"{self.dropped_duplicates:,} exact duplicates" + (
                    f"; kept {self.conflicting_labels:,} rows whose premise and hypothesis also "
                    "appear with a different label" if self.conflicting_labels else ""))


class NLISplits(DatasetDict):
    report: LoadReport  # what load_nli_splits dropped


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
        what = kinds[at]
        col = texts.name
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
    return "blank" if missing(value) else files.json_type(value)


def _shown(value) -> str:
    """A value for an error message: short, and printable whatever it holds."""
    text = repr(value.strip().lower()) if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def where(rows: pd.Series | pd.DataFrame, label) -> str:
    """'line N' for JSON Lines (the index holds line numbers), else 'row N' counting rows from 1."""
    return f"line {label}" if rows.index.name == "line" else f"row {label + 1}"


def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Columns premise/hypothesis/label(/genre), labels as ids; drop and count in `report` what
    can't train: unlabelled rows, blank texts, exact repeats. The same pair under two labels is
    kept and counted (crowd labels disagree). Anything else: a DataError naming the line/row."""
    df = check_columns(df, source)
    read = len(df)
    ids = label_ids(df["label"], source)
    unlabelled = ids == UNLABELLED_ID
    df = df[~unlabelled].assign(label=ids[~unlabelled].astype("int64"))
    blank = blank_texts(df["premise"], source) | blank_texts(df["hypothesis"], source)
    df = df[~blank].astype({"premise": str, "hypothesis": str})
    if "genre" in df.columns:  # a tag for per-genre scores: anything goes, as encodable text
        df["genre"] = df["genre"].map(lambda v: "unknown" if missing(v) else
                                      str(v).encode("utf-8", "replace").decode("utf-8"))
    duplicate = df.duplicated(["premise", "hypothesis", "label"])
    df = df[~duplicate]
    report.dropped_unlabelled += int(unlabelled.sum())
    report.dropped_blank += int(blank.sum())
    report.dropped_duplicates += int(duplicate.sum())
    report.conflicting_labels += int(df.duplicated(["premise", "hypothesis"], keep=False).sum())
    if df.empty:
        raise DataError(f"{source} has no usable rows left: of {read:,} rows, "
                        f"{int(unlabelled.sum()):,} are unlabelled and {int(blank.sum()):,} have a "
                        "blank premise or hypothesis")
    return df.reset_index(drop=True)


def split_by_premise(df: pd.DataFrame, eval_fraction: float,
                     seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out about `eval_fraction` of rows by a hash of the premise, so no premise is in both
    parts: MultiNLI scatters a premise's hypotheses through a file, so a split by position leaks."""
    def held(premise: str) -> bool:
        digest = hashlib.sha1(f"{seed}:{premise}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction

    held_out = df["premise"].map(held).to_numpy()
    return df[~held_out].reset_index(drop=True), df[held_out].reset_index(drop=True)


Frames = dict[str, pd.DataFrame]  # split name -> its normalised rows


def _held_out(frames: Frames, source: str, eval_fraction: float, seed: int) -> Frames:
    """One table: MultiNLI's held-out genres become validation_mismatched; without a
    validation_matched split, part of train is held out by premise."""
    genre = frames["train"].get("genre", pd.Series(dtype=object))
    if genre.isin(MISMATCHED_GENRES).any() and genre.isin(MATCHED_GENRES).any():
        mismatched = genre.isin(MISMATCHED_GENRES)
        frames = {"train": frames["train"][~mismatched],
                  "validation_mismatched": frames["train"][mismatched].reset_index(drop=True)}
    if "validation_matched" not in frames:
        kept, held_out = split_by_premise(frames["train"], eval_fraction, seed)
        if kept.empty or held_out.empty:
            raise DataError(f"splitting {source} by premise with eval_fraction={eval_fraction} "
                            f"left an empty part (of {len(frames['train']):,} rows); use more data "
                            "or another eval_fraction, or give validation_matched its own file")
        frames = {**frames, "train": kept, "validation_matched": held_out}
    return {k: frames[k] for k in SPLIT_ORDER if k in frames}


def load_nli_splits(source: str = "sample", *, eval_fraction: float = 0.1, seed: int = 42,
                    max_train_samples: int | None = None, max_eval_samples: int | None = None
                    ) -> NLISplits:
    """Load `source` into train / validation_matched (/ validation_mismatched) splits; what was
    dropped is in `splits.report`. Sources: `sample` (bundled), `mnli-subset`, a jsonl/json/csv/
    tsv/parquet file (.gz too), a folder of `train.*`, `validation_matched.*` (`dev_matched.*`)
    and `validation_mismatched.*` files, the same on gs://, or a hub dataset name."""
    report = LoadReport(str(source))
    frames = _held_out(_load_frames(str(source), report), str(source), eval_fraction, seed)
    splits = DatasetDict({name: Dataset.from_pandas(df, preserve_index=False)
                          for name, df in frames.items()})
    splits = NLISplits(subsample(splits, max_train_samples, max_eval_samples, seed))
    if len(splits["train"].unique("label")) < 2:  # it would learn that label, and score 1.000
        raise DataError(f"the {len(splits['train'])} training pairs of {source} (after any "
                        "--max_train_samples) have one label: a classifier needs two or more to "
                        "learn from. Check the label column, or train on more pairs")
    report.rows = {name: len(ds) for name, ds in splits.items()}
    splits.report = report
    return splits


def _load_frames(source: str, report: LoadReport) -> Frames:
    if source == MNLI_SUBSET:
        return {"train": mnli_subset_frame(report)}
    path = str(SAMPLE_PATH) if source == "sample" else source
    try:
        fs, inside = files.filesystem(path)
        info = fs.info(inside)  # one request: isdir and isfile would each hide a fault as False
    except FileNotFoundError:
        info = {"type": None}
    except (OSError, ValueError) as e:  # a NUL byte or a name too long for the filesystem
        shown = source if len(source) < 200 else source[:200] + "..."
        raise DataError(f"--data {shown!r} is not a usable path "
                        f"({getattr(e, 'strerror', None) or e})") from e
    if info["type"] == "directory":
        return {split: normalise_frame(files.read_pairs(f), f, report)
                for split, f in split_files(fs, inside, source).items()}
    if info["type"] == "other":  # reading a named pipe would wait for a writer
        raise DataError(f"--data {source} is not a regular file (a pipe, a socket or a device); "
                        "write the pairs to a file and pass that")
    if info["type"] == "file":
        name = "bundled sample" if source == "sample" else source
        return {"train": normalise_frame(files.read_pairs(os.path.expanduser(path)), name, report)}
    if files.file_kind(path) or files.is_gcs_uri(path) or path.startswith((".", "/", "~")):
        raise DataError(f"data file {source} does not exist; pass --data with an existing file, a "
                        "folder of split files, a gs:// URI, a hub name or 'sample'")
    return _load_hub(source, report)


def split_files(fs, folder: str, source: str) -> dict[str, str]:
    """{split: its file} in a folder of `train.*`, `dev_matched.*`, ... files (raw MultiNLI's names
    too); never a silent pick between two files for one split."""
    found: dict[str, list[str]] = {}
    for file in sorted(fs.ls(folder, detail=False)):
        name = file.rstrip("/").rsplit("/", 1)[-1]
        stem = name.split(".")[0].removeprefix("multinli_1.0_")
        if stem in SPLIT_ALIASES and files.file_kind(name):
            found.setdefault(SPLIT_ALIASES[stem], []).append(files.join(source, name))
    several = [f"{k}: {', '.join(fs_)}" for k, fs_ in found.items() if len(fs_) > 1]
    if several:
        raise DataError(f"folder {source} has several files for one split ({'; '.join(several)});"
                        " keep one per split there, or pass the file you mean with --data")
    if "train" not in found:
        raise DataError(f"folder {source} has no train.* file; expected train.jsonl (or "
                        f"{'/'.join(files.SUFFIXES[1:])}) and optionally validation_matched.* and "
                        "validation_mismatched.*")
    return {split: paths[0] for split, paths in found.items()}


def mnli_subset_frame(report: LoadReport) -> pd.DataFrame:
    """The subset rule's pairs of MultiNLI dev_matched, from wherever `mnli` finds it."""
    from . import mnli  # only this source looks for MultiNLI on the machine
    try:
        found = mnli.find_dev_matched()
    except mnli.NotFound as e:
        raise DataError(f"--data {MNLI_SUBSET}: {e}; {mnli.WHAT_TO_DO}, or pass --data sample "
                        "(the hand-written pairs)") from e
    report.source = f"{MNLI_SUBSET} (MultiNLI dev_matched from {found.origin})"
    df = normalise_frame(files.read_pairs(str(found.path)), str(found.path), report)
    return df[df["premise"].map(mnli.in_subset)].reset_index(drop=True)


def _load_hub(name: str, report: LoadReport) -> Frames:
    try:
        raw = load_dataset(name)
    except Exception as e:  # the hub raises many types; all mean "could not load this name"
        raise DataError(f"could not load {name!r} from the Hugging Face hub "
                        f"({type(e).__name__}: {e}). Offline? Pass a local file or folder with "
                        "--data, or 'sample'") from e
    frames = {SPLIT_ALIASES[split]: normalise_frame(ds.to_pandas(), f"{name}[{split}]", report)
              for split, ds in raw.items() if split in SPLIT_ALIASES}
    if "train" not in frames:
        raise DataError(f"hub dataset {name!r} has no train split (it has {', '.join(raw)})")
    return frames


def subsample(splits: DatasetDict, max_train: int | None, max_eval: int | None,
              seed: int) -> DatasetDict:
    """Seeded random subsets for quick runs: a cap on train, a cap on each evaluation split."""
    out = {}
    for name, ds in splits.items():
        n = min(len(ds), (max_train if name == "train" else max_eval) or len(ds))
        out[name] = ds if n == len(ds) else ds.shuffle(seed=seed).select(range(n))
    return DatasetDict(out)


def content_hash(split) -> str:
    """SHA-256 of a split's rows in order (Arrow IPC bytes, without datasets' metadata): the token
    cache's key and a resume's check that its data did not change."""
    table = split.with_format("arrow")[:].combine_chunks().replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()
