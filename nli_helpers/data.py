"""The data path, one way: read a file (`tables`), normalise its rows, split by premise, tokenise
(cached across runs); `step` batches the pairs.

    >>> splits = load_nli_splits("dev_matched.jsonl")  # or "sample", a folder, gs://, a hub name
    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)  # truncated, not padded
    >>> loader = step.make_train_loader(tokenized["train"], cfg, tokenizer, device)  # step.py

Splits: `train`, `validation_matched` (held out by premise when the source has none) and maybe
`validation_mismatched`, with `premise`, `hypothesis`, `label` (0 entailment, 1 neutral,
2 contradiction: the hub's order) and `genre` when known; raw MultiNLI's column names work too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
from datasets import Dataset, DatasetDict, load_dataset
from tokenizers import Tokenizer

from . import files, tables
from .config import cache_dir as package_cache_dir
from .tables import DataError

log = logging.getLogger(__name__)
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


def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Columns premise/hypothesis/label(/genre), labels as ids; drop and count in `report` what
    can't train: unlabelled rows, blank texts, exact repeats. The same pair under two labels is
    kept and counted (crowd labels disagree). Anything else: a DataError naming the line/row."""
    df = tables.check_columns(df, source)
    read = len(df)
    ids = tables.label_ids(df["label"], source)
    unlabelled = ids == tables.UNLABELLED_ID
    df = df[~unlabelled].assign(label=ids[~unlabelled].astype("int64"))
    blank = tables.blank_texts(df["premise"], source) | tables.blank_texts(df["hypothesis"], source)
    df = df[~blank].astype({"premise": str, "hypothesis": str})
    if "genre" in df.columns:  # a tag for per-genre scores: anything goes, as encodable text
        df["genre"] = df["genre"].map(lambda v: "unknown" if tables.missing(v) else
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
        return {split: normalise_frame(tables.read_pairs(f), f, report)
                for split, f in split_files(fs, inside, source).items()}
    if info["type"] == "other":  # reading a named pipe would wait for a writer
        mode = info.get("mode", 0)
        what = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) \
            else "a device"
        raise DataError(f"--data {source} is {what}, not a regular file; write the pairs to a "
                        "file and pass that")
    if info["type"] == "file":
        name = "bundled sample" if source == "sample" else source
        return {"train": normalise_frame(tables.read_pairs(os.path.expanduser(path)), name, report)}
    if tables.file_kind(path) or files.is_gcs_uri(path) or path.startswith((".", "/", "~")):
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
        if stem in SPLIT_ALIASES and tables.file_kind(name):
            found.setdefault(SPLIT_ALIASES[stem], []).append(files.join(source, name))
    several = [f"{k}: {', '.join(fs_)}" for k, fs_ in found.items() if len(fs_) > 1]
    if several:
        raise DataError(f"folder {source} has several files for one split ({'; '.join(several)});"
                        " keep one per split there, or pass the file you mean with --data")
    if "train" not in found:
        raise DataError(f"folder {source} has no train.* file; expected train.jsonl (or "
                        f"{'/'.join(tables.SUFFIXES[1:])}) and optionally validation_matched.* and "
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
    df = normalise_frame(tables.read_pairs(str(found.path)), str(found.path), report)
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


# -- tokenising, once per machine -----------------------------------------------------------------
# Texts are cut to this many characters per token of max_length: the same tokens for any real text,
# but the fast tokenizer's pair truncation builds every combination of both texts' overflow windows
# (huggingface/tokenizers#2035): tens of GB for two 20,000-token texts.
CHARS_PER_TOKEN_CAP = 32
CACHE_FORMAT = 2  # part of every key: bump it when tokenize_splits gives other columns or values


def content_hash(split) -> str:
    """SHA-256 of a split's rows in order (Arrow IPC bytes, without datasets' metadata): the token
    cache's key and a resume's check that its data did not change."""
    table = split.with_format("arrow")[:].combine_chunks().replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def cache_key(split, tokenizer, max_length: int) -> str:
    """A hash of all the tokens depend on: the rows, the whole tokenizer (less the truncation and
    padding its last call left set), max_length and this code's format."""
    saved = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    saved.no_truncation()
    saved.no_padding()
    parts = (f"format {CACHE_FORMAT} cap {CHARS_PER_TOKEN_CAP} max_length {max_length}",
             type(tokenizer).__name__, tokenizer.truncation_side,
             " ".join(tokenizer.model_input_names), saved.to_str(), content_hash(split))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class TokenizedSplits(DatasetDict):
    cache_hits: dict[str, bool]  # split -> read back from the token cache


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128, *,
                    cache_dir: str | Path | None = None, use_cache: bool = True
                    ) -> TokenizedSplits:
    """Tokenise every split, truncated but never padded (padding is per batch), with a `length`.
    Kept in `cache_dir` (else `config.cache_dir()`/tokens) for the next run and the other ranks
    (`.cache_hits` says which were read back); `use_cache=False` writes nothing."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; use a fast one "
                        "(AutoTokenizer's default)")
    cap = CHARS_PER_TOKEN_CAP * max_length

    def encode(batch):
        enc = tokenizer([t[:cap] for t in batch["premise"]], [t[:cap] for t in batch["hypothesis"]],
                        truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    folder = Path(cache_dir or package_cache_dir() / "tokens") if use_cache else None
    name = "_".join(Path(str(tokenizer.name_or_path)).parts[-2:]) or type(tokenizer).__name__
    prefix = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{max_length}"
    tokenized, tokenized.cache_hits = TokenizedSplits(), {}
    for split, ds in splits.items():
        drop = [c for c in ds.column_names if c not in ("label", "genre")]

        def tokenise(split=split, ds=ds, drop=drop, **cache):
            return ds.map(encode, batched=True, batch_size=1000, remove_columns=drop,
                          desc=f"tokenise {split}", **cache)

        path = folder / f"{prefix}-{cache_key(ds, tokenizer, max_length)}.arrow" if folder else None
        tokenized[split], tokenized.cache_hits[split] = _cached(tokenise, path, len(ds))
    return tokenized


def _cached(tokenise, path: Path | None, rows: int) -> tuple[Dataset, bool]:
    """(split, hit): datasets reads `path` back when it exists (written aside and renamed, so a
    killed run leaves no entry); a damaged entry is tokenised again, an unwritable cache skipped."""
    if path is None:
        return tokenise(), False
    hit = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            split = tokenise(cache_file_name=str(path))
            if len(split) == rows:
                return split, hit
        except Exception as e:  # pyarrow raises several types for a damaged file, OSError too
            if not hit:
                raise
            log.warning("token cache entry %s is damaged (%s); tokenising again", path, e)
        return tokenise(cache_file_name=str(path), load_from_cache_file=False), False
    except OSError as e:  # a read-only or full disk must not stop a run
        log.warning("token cache %s unusable (%s); tokenising without it", path.parent, e)
        return tokenise(), False
