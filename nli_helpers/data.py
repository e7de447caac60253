"""Load NLI pairs from anywhere into one shape, tokenise them once, and batch them without waste.

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
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from datasets import Dataset, DatasetDict

from .config import NLIError

log = logging.getLogger(__name__)

LABELS = ("entailment", "neutral", "contradiction")
LABEL2ID = {name: i for i, name in enumerate(LABELS)}
UNLABELLED = {"-", "-1", ""}
SAMPLE_PATH = Path(__file__).parent / "sample" / "mnli_sample.jsonl"
# MultiNLI's genres: the five seen in training ("matched") and the five held out.
MATCHED_GENRES = ("fiction", "government", "slate", "telephone", "travel")
MISMATCHED_GENRES = ("facetoface", "letters", "nineeleven", "oup", "verbatim")
COLUMN_ALIASES = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
SPLIT_ALIASES = {
    "train": "train",
    "validation_matched": "validation_matched", "dev_matched": "validation_matched",
    "validation": "validation_matched", "dev": "validation_matched",
    "validation_mismatched": "validation_mismatched", "dev_mismatched": "validation_mismatched",
}
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


class DataError(NLIError):
    """The data could not be read or has the wrong shape; the message says how to fix it."""


@dataclass
class LoadReport:
    """What the loader dropped, so a notebook can show it instead of hiding it."""

    source: str
    dropped_unlabelled: int = 0
    rows: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v:,}" for k, v in self.rows.items())
        return f"{self.source}: {sizes}; dropped {self.dropped_unlabelled:,} unlabelled rows (-1 or '-')"


# -- reading tables ----------------------------------------------------------------------
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
            return pd.read_json(path, lines=kind == ".jsonl" or _looks_like_jsonl(path))
        if kind == ".csv":
            return pd.read_csv(path, keep_default_na=False)
        if kind in (".tsv", ".txt"):
            # Raw MultiNLI .txt/.tsv files contain unbalanced quotes: read them literally.
            return pd.read_csv(path, sep="\t", quoting=3, keep_default_na=False)
        if kind == ".parquet":
            return pd.read_parquet(path)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "re-encode it as UTF-8") from e
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"could not read {path} as {kind[1:]}: {e}") from e
    raise DataError(f"{path}: unsupported file type {kind!r}; use one of {', '.join(SUFFIXES)} "
                    "(optionally .gz)")


def _looks_like_jsonl(path: Path) -> bool:
    opener = __import__("gzip").open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return not f.read(1).startswith("[")


def normalise_frame(df: pd.DataFrame, source: str, report: LoadReport) -> pd.DataFrame:
    """Rename columns to premise/hypothesis/label(/genre), map labels to ids, drop unlabelled."""
    df = df.rename(columns={k: v for k, v in COLUMN_ALIASES.items() if v not in df.columns})
    missing = [c for c in ("premise", "hypothesis", "label") if c not in df.columns]
    if missing:
        raise DataError(f"{source} lacks column(s) {', '.join(missing)} (found: {', '.join(map(str, df.columns))}); "
                        "name them premise/hypothesis/label or sentence1/sentence2/gold_label")
    keep = ["premise", "hypothesis", "label"] + (["genre"] if "genre" in df.columns else [])
    df = df[keep].copy()
    labels = df["label"].map(lambda v: str(v).strip().lower())
    unlabelled = labels.isin(UNLABELLED)
    report.dropped_unlabelled += int(unlabelled.sum())
    df, labels = df[~unlabelled], labels[~unlabelled]
    ids = labels.map(lambda s: LABEL2ID.get(s, int(s) if s.isdigit() and int(s) < len(LABELS) else None))
    unknown = sorted(set(labels[ids.isna()]))
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5])
        raise DataError(f"{source} has unknown label value(s) {shown}; labels must be "
                        f"{'/'.join(LABELS)} or 0/1/2 (rows labelled -1 or '-' are dropped)")
    df["label"] = ids.astype("int64")
    for col in ("premise", "hypothesis"):
        df[col] = df[col].astype(str)
    if df.empty:
        raise DataError(f"{source} has no labelled rows left")
    return df.reset_index(drop=True)


# -- splitting ---------------------------------------------------------------------------
def premise_bucket(premise: str, seed: int) -> float:
    """A stable number in [0, 1) from the premise text: the same premise always lands together."""
    digest = hashlib.sha1(f"{seed}:{premise}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_by_premise(df: pd.DataFrame, eval_fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out about `eval_fraction` of rows by premise, so no premise is in both parts.

    MultiNLI repeats each premise with up to six hypotheses scattered through a file; a split by
    row position would put most held-out premises into training.
    """
    held_out = df["premise"].map(lambda p: premise_bucket(p, seed) < eval_fraction).to_numpy()
    return df[~held_out].reset_index(drop=True), df[held_out].reset_index(drop=True)


def splits_from_single_frame(df: pd.DataFrame, eval_fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    """One table → train / validation_matched (by premise) / validation_mismatched (held-out genres)."""
    splits = {}
    if "genre" in df.columns and df["genre"].isin(MISMATCHED_GENRES).any() and df["genre"].isin(MATCHED_GENRES).any():
        splits["validation_mismatched"] = df[df["genre"].isin(MISMATCHED_GENRES)].reset_index(drop=True)
        df = df[~df["genre"].isin(MISMATCHED_GENRES)]
    train, held_out = split_by_premise(df, eval_fraction, seed)
    if held_out.empty or train.empty:
        raise DataError(f"splitting {len(df)} rows by premise with eval_fraction={eval_fraction} left an "
                        "empty part; use more data or another eval_fraction")
    return {"train": train, "validation_matched": held_out, **splits}


# -- sources -----------------------------------------------------------------------------
def load_nli_splits(source: str = "sample", *, eval_fraction: float = 0.1, seed: int = 42,
                    fraction_of_train_data: float = 1.0, max_train_samples: int | None = None,
                    max_eval_samples: int | None = None) -> DatasetDict:
    """Load `source` into train / validation_matched (/ validation_mismatched) splits."""
    report = LoadReport(str(source))
    frames = _load_frames(str(source), report, eval_fraction, seed)
    splits = DatasetDict({name: Dataset.from_pandas(df, preserve_index=False) for name, df in frames.items()})
    splits = subsample(splits, fraction_of_train_data, max_train_samples, max_eval_samples, seed)
    report.rows = {name: len(ds) for name, ds in splits.items()}
    log.info("%s", report)
    splits.report = report  # type: ignore[attr-defined]
    return splits


def _load_frames(source: str, report: LoadReport, eval_fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    if source == "sample":
        return splits_from_single_frame(normalise_frame(read_table(SAMPLE_PATH), "bundled sample", report),
                                        eval_fraction, seed)
    if source.startswith("gs://"):
        return _load_gcs(source, report, eval_fraction, seed)
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_directory(path, report, eval_fraction, seed)
    if path.is_file() or path.suffix in SUFFIXES or path.suffix == ".gz" or source.startswith((".", "/")):
        df = normalise_frame(read_table(path), str(path), report)
        return splits_from_single_frame(df, eval_fraction, seed)
    return _load_hub(source, report, eval_fraction, seed)


def _load_directory(path: Path, report: LoadReport, eval_fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    found: dict[str, Path] = {}
    for file in sorted(path.iterdir()):
        stem = file.name.split(".")[0].removeprefix("multinli_1.0_")
        if stem in SPLIT_ALIASES and any(s in SUFFIXES for s in file.suffixes):
            found.setdefault(SPLIT_ALIASES[stem], file)
    if "train" not in found:
        raise DataError(f"directory {path} has no train.* file; expected train.jsonl (or .csv/.tsv/"
                        "/.parquet) and optionally validation_matched.* and validation_mismatched.*")
    frames = {name: normalise_frame(read_table(f), str(f), report) for name, f in found.items()}
    if "validation_matched" not in frames:
        frames["train"], frames["validation_matched"] = split_by_premise(frames["train"], eval_fraction, seed)
    return frames


def _load_gcs(uri: str, report: LoadReport, eval_fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    from . import storage

    local = Path(tempfile.mkdtemp(prefix="nli-data-"))
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    is_file = any(name.endswith(s) or name.endswith(s + ".gz") for s in SUFFIXES)
    target = storage.download(uri, local / name if is_file else local / "data")
    return _load_frames(str(target), report, eval_fraction, seed)


def _load_hub(name: str, report: LoadReport, eval_fraction: float, seed: int) -> dict[str, pd.DataFrame]:
    from datasets import load_dataset

    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name):
        raise DataError(f"--data {name!r} is neither an existing file or directory, a gs:// URI nor a hub name")
    try:
        raw = load_dataset(name)
    except Exception as e:  # the hub raises many types; all mean "could not load this name"
        raise DataError(f"could not load {name!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
                        "Offline? Pass a local file or directory with --data, or 'sample'") from e
    frames = {}
    for split, ds in raw.items():
        if split in SPLIT_ALIASES:
            frames[SPLIT_ALIASES[split]] = normalise_frame(ds.to_pandas(), f"{name}[{split}]", report)
    if "train" not in frames:
        raise DataError(f"hub dataset {name!r} has no train split (it has {', '.join(raw)})")
    if "validation_matched" not in frames:
        frames["train"], frames["validation_matched"] = split_by_premise(frames["train"], eval_fraction, seed)
    return frames


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


# -- tokenising and batching ---------------------------------------------------------------
def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128) -> DatasetDict:
    """Tokenise every split once, in batches, truncated but never padded (padding is per batch)."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; use a fast one (AutoTokenizer default)")

    def encode(batch):
        enc = tokenizer(batch["premise"], batch["hypothesis"], truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    keep = {"label", "genre"}
    return DatasetDict({
        name: ds.map(encode, batched=True, batch_size=1000, desc=f"tokenise {name}",
                     remove_columns=[c for c in ds.column_names if c not in keep])
        for name, ds in splits.items()
    })


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of similar length in a random order: the padding per batch shrinks, the order stays random.

    Each epoch: shuffle all indices (seed + epoch), cut them into mega-batches of
    `batch_size * mega_batches` examples, sort each mega-batch by length, cut it into batches and
    shuffle the batches. With `num_replicas > 1` the batches are global (`batch_size *
    num_replicas` examples) and each rank takes its interleaved share of every one, so N processes
    see exactly the examples one process would at N times the batch size; every rank draws the
    same permutation (same seed), so no communication is needed.
    """

    def __init__(self, lengths: list[int] | np.ndarray, batch_size: int, *, seed: int = 0,
                 group_by_length: bool = True, mega_batches: int = 50, num_replicas: int = 1, rank: int = 0):
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.group = batch_size, seed, group_by_length
        self.mega, self.num_replicas, self.rank = mega_batches, num_replicas, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> list[np.ndarray]:
        """This epoch's batches of `batch_size * num_replicas` examples, the same on every rank."""
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.lengths))
        size = self.batch_size * self.num_replicas
        if self.group:
            mega = size * self.mega
            chunks = [order[i:i + mega] for i in range(0, len(order), mega)]
            order = np.concatenate([c[np.argsort(-self.lengths[c], kind="stable")] for c in chunks])
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        if self.group:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        # A last batch too small to give every rank an example is dropped, so all ranks step together.
        return [b for b in batches if len(b) >= self.num_replicas]

    def batches(self) -> list[np.ndarray]:
        """This rank's share of every global batch."""
        return [b[self.rank::self.num_replicas] for b in self.global_batches()]

    def __iter__(self) -> Iterator[list[int]]:
        return (b.tolist() for b in self.batches())

    def __len__(self) -> int:
        size = self.batch_size * self.num_replicas
        n = len(self.lengths)
        return n // size + (n % size >= self.num_replicas)


def padding_stats(lengths: list[int] | np.ndarray, batches: list[np.ndarray]) -> dict[str, float]:
    """Real vs padded tokens when each batch is padded to its longest member."""
    lengths = np.asarray(lengths)
    real = int(lengths.sum())
    padded = int(sum(len(b) * lengths[b].max() for b in batches if len(b)))
    return {"real_tokens": real, "padded_tokens": padded, "pad_fraction": 1 - real / padded if padded else 0.0}
