"""The data path, one way: read a file with `datasets`, normalise its rows, split by premise,
tokenise (cached across runs), batch pairs of similar length and pad them.

    >>> splits = load_nli_splits("dev_matched.jsonl")  # or "sample", a folder, gs://, a hub name
    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)  # truncated, not padded
    >>> sampler = LengthGroupedBatchSampler(tokenized["train"]["length"], batch_size=32, seed=42)
    >>> PaddedCollator(tokenized["train"], tokenizer)([3, 1, 4])        # a padded batch of rows

Splits: `train`, `validation_matched` (held out by premise when the source has none) and maybe
`validation_mismatched`, with `premise`, `hypothesis`, `label` (0 entailment, 1 neutral,
2 contradiction: the hub's order) and `genre` when known; raw MultiNLI's column names work too.
What the path refuses, and the one clear error it gives instead, is in `data_checks`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import torch
from datasets import Dataset, DatasetDict, load_dataset

from . import data_checks, mnli, storage, token_cache
from .config import LABELS
from .config import cache_dir as package_cache_dir
from .data_checks import SPLIT_ALIASES, SUFFIXES, UNLABELLED_ID, DataError

log = logging.getLogger(__name__)
LABEL2ID = data_checks.LABEL2ID  # {"entailment": 0, "neutral": 1, "contradiction": 2}
SAMPLE_PATH = Path(__file__).parent / "sample" / "mnli_sample.jsonl"  # 360 hand-written test pairs
# Real MultiNLI pairs for smoke: found on this machine or the hub (mnli.py), never shipped.
MNLI_SUBSET = "mnli-subset"


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


class NLISplits(DatasetDict):
    report: LoadReport  # what load_nli_splits dropped


# -- reading a file -------------------------------------------------------------------------------
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".txt": "csv",
            ".parquet": "parquet"}


def read_table(path: str | Path) -> pd.DataFrame:
    """One jsonl/json/csv/tsv/parquet file (.gz too) read by `load_dataset` (else by pandas or the
    json module), or one DataError naming the file and, for JSON Lines, the line (the index)."""
    path = Path(path)
    # datasets' cache for this one read: a user's file, which may change, leaves nothing in ~/.cache
    with tempfile.TemporaryDirectory(prefix="nli-read-") as tmp:
        local, kind = data_checks.local_copy(path, Path(tmp))  # or a DataError: missing, empty...
        try:
            options, lines = data_checks.read_options(local, kind)  # or raises
            with data_checks.datasets_quiet():
                # local files, no hub: huggingface.co/docs/datasets/loading#local-and-remote-files
                ds = load_dataset(BUILDERS[kind], data_files=str(local), split="train",
                                  cache_dir=tmp, keep_in_memory=True, **options)
            df = data_checks.as_read(ds, kind, lines)
        except Exception:  # datasets, pyarrow and pandas raise many types: read again, strictly
            df = None
        return df if df is not None else data_checks.read_strictly(local, kind, path)


# -- normalising a table --------------------------------------------------------------------------
def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Rename columns to premise/hypothesis/label(/genre), map labels to ids, drop what can't train.

    Dropped and counted in `report`: unlabelled rows, blank texts (one must not sink a 400k-row
    file), exact repeats (they would count twice). The same pair under two labels is kept and
    counted (crowd labels disagree). Anything else is a DataError naming the first bad line/row."""
    df = data_checks.check_columns(df, source)
    read = len(df)
    ids = data_checks.label_ids(df["label"], source)
    unlabelled = ids == UNLABELLED_ID
    report.dropped_unlabelled += int(unlabelled.sum())
    df = df[~unlabelled].assign(label=ids[~unlabelled].astype("int64"))

    blank = data_checks.blank_texts(df["premise"], source)
    blank |= data_checks.blank_texts(df["hypothesis"], source)
    report.dropped_blank += int(blank.sum())
    df = df[~blank].astype({"premise": str, "hypothesis": str})
    if "genre" in df.columns:  # a tag for per-genre scores: anything goes, as encodable text
        df["genre"] = df["genre"].map(lambda v: "unknown" if data_checks.missing(v) else
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
def load_nli_splits(source: str = "sample", *, eval_fraction: float = 0.1, seed: int = 42,
                    fraction_of_train_data: float = 1.0, max_train_samples: int | None = None,
                    max_eval_samples: int | None = None) -> NLISplits:
    """Load `source` into train / validation_matched (/ validation_mismatched) splits; what was
    dropped is in `splits.report`. Sources: `sample` (bundled), `mnli-subset` (`mnli` finds it),
    a jsonl/json/csv/tsv/parquet file (.gz too), a folder of `train.*`, `validation_matched.*`
    (`dev_matched.*`) and `validation_mismatched.*` files, a `gs://` file or folder, a hub name."""
    report = LoadReport(str(source))
    frames = _load_frames(str(source), report, eval_fraction, seed)
    splits = DatasetDict({name: Dataset.from_pandas(df, preserve_index=False)
                          for name, df in frames.items()})
    splits = NLISplits(subsample(splits, fraction_of_train_data, max_train_samples,
                                 max_eval_samples, seed))
    if len(splits["train"].unique("label")) < 2:  # it would learn that label, and score 1.000
        raise DataError(f"the {len(splits['train'])} training pairs of {source} (after any "
                        "--max_train_samples) have one label: a classifier needs two or more to "
                        "learn from. Check the label column, or train on more pairs")
    report.rows = {name: len(ds) for name, ds in splits.items()}
    log.info("%s", report)
    splits.report = report
    return splits


def _load_frames(source: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
    if source.startswith("gs://"):
        uri = source.rstrip("/")
        with storage.local_copy(uri) as local:  # the frames are in memory once it is removed
            try:
                return _load_frames(str(local), report, eval_fraction, seed)
            except DataError as e:  # name the object the user passed, not the local copy
                raise DataError(str(e).replace(str(local), uri)) from e
    if source == MNLI_SUBSET:
        return _single_frame(_mnli_subset_frame(report), MNLI_SUBSET, eval_fraction, seed)
    path = SAMPLE_PATH if source == "sample" else Path(source).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as e:  # a NUL byte or a name too long for the filesystem
        raise DataError(f"--data {source!r} is not a usable path ({e})") from e
    if is_dir:
        files = data_checks.split_files(path)  # {split: its one file}
        frames = {split: normalise_frame(read_table(f), str(f), report)
                  for split, f in files.items()}
        return _held_out(frames, str(files["train"]), eval_fraction, seed)
    if is_file or path.suffix in (*SUFFIXES, ".gz") or source.startswith((".", "/")):
        name = "bundled sample" if source == "sample" else str(path)
        return _single_frame(normalise_frame(read_table(path), name, report), name, eval_fraction,
                             seed)
    return _load_hub(source, report, eval_fraction, seed)


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


def _load_hub(name: str, report: LoadReport, eval_fraction: float, seed: int) -> _Frames:
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
cache_key, content_hash = token_cache.cache_key, token_cache.content_hash  # imported from here


class TokenizedSplits(DatasetDict):
    cache_hits: dict[str, bool]  # split -> read back from the token cache


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128, *,
                    cache_dir: str | os.PathLike | None = None,
                    use_cache: bool = True) -> TokenizedSplits:
    """Tokenise every split, truncated but never padded (padding is per batch), with a `length`.
    Kept in `cache_dir` (else `config.cache_dir()`/tokens: never evicted, safe to delete) for the
    next run and the other ranks (`.cache_hits` says which were read back); `use_cache=False`
    writes nothing."""
    data_checks.check_tokenizer(tokenizer, max_length)
    cap = token_cache.CHARS_PER_TOKEN_CAP * max_length  # a 20,000-token text costs no more

    def encode(batch):
        premises = [t[:cap] for t in batch["premise"]]
        hypotheses = [t[:cap] for t in batch["hypothesis"]]
        enc = tokenizer(premises, hypotheses, truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    folder = Path(cache_dir or package_cache_dir() / "tokens") if use_cache else None
    # The readable part of an entry's name: the tokenizer's name or folder, and max_length.
    name = "_".join(Path(str(tokenizer.name_or_path)).parts[-2:]) or type(tokenizer).__name__
    prefix = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{max_length}"
    tokenized, hits = TokenizedSplits(), {}
    for split, ds in splits.items():
        drop = [c for c in ds.column_names if c not in ("label", "genre")]
        tokenise = functools.partial(ds.map, encode, batched=True, batch_size=1000,
                                     remove_columns=drop, desc=f"tokenise {split}")
        if folder is None:
            tokenized[split], hits[split] = tokenise(), False
        else:
            path = folder / f"{prefix}-{cache_key(ds, tokenizer, max_length)}.arrow"
            tokenized[split], hits[split] = token_cache.cached_map(tokenise, path, len(ds))
    tokenized.cache_hits = hits
    return tokenized


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

