"""Tokenise the splits once (cached across runs), batch pairs of similar length together, pad them.

    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)
    >>> # each split of tokenized: input_ids, attention_mask, label, length
    >>> sampler = LengthGroupedBatchSampler(tokenized["train"]["length"], batch_size=32, seed=42)
    >>> padding_stats(lengths, sampler.batches())                           # real vs padded tokens
    >>> PaddedCollator(tokenized["train"], tokenizer)([3, 1, 4])            # a padded batch of rows

The training loop (`train.make_train_loader`) uses the sampler and the collator;
`explore.padding_comparison` shows what grouping saves.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset, DatasetDict
from filelock import FileLock
from tokenizers import Tokenizer

from .config import ConfigError
from .data import CHARS_PER_TOKEN_CAP
from .tables import DataError

log = logging.getLogger(__name__)


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128, *,
                    cache_dir: str | os.PathLike | None = None,
                    use_cache: bool = True) -> DatasetDict:
    """Tokenise every split once, in batches, truncated but never padded (padding is per batch).

    Each split's tokens are kept in a cache folder (`cache_dir`, else `token_cache_dir()`) under a
    key of everything they depend on (`cache_key`): the next run, and every other torchrun rank of
    this one, reads them back instead of tokenising again. `tokenized.cache_hits` says which splits
    came from the cache. `use_cache=False` tokenises in memory and writes nothing.

    Each text is first cut to `CHARS_PER_TOKEN_CAP * max_length` characters. Truncation keeps at
    most `max_length` tokens, which normal text fits in far fewer characters, so the result is the
    same; but the fast tokenizer's pair truncation builds every combination of the two texts'
    overflow windows (huggingface/tokenizers#2035), so one pair of 20,000-token texts would
    otherwise take tens of GB of memory.
    """
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
    tokenized, hits = DatasetDict(), {}
    for name, ds in splits.items():
        drop = [c for c in ds.column_names if c not in ("label", "genre")]
        tokenise = functools.partial(ds.map, encode, batched=True, batch_size=1000,
                                     remove_columns=drop, desc=f"tokenise {name}")
        if folder is None:
            tokenized[name], hits[name] = tokenise(), False
            continue
        key = cache_key(ds, tokenizer, max_length)
        path = folder / f"{cache_name(tokenizer, max_length)}-{key}.arrow"
        tokenized[name], hits[name] = cached_map(tokenise, path, len(ds))
    tokenized.cache_hits = hits  # type: ignore[attr-defined]
    return tokenized


# -- the token cache ------------------------------------------------------------------------------
CACHE_FORMAT = 1  # part of every key: bump it when tokenize_splits gives other columns or values


def token_cache_dir() -> Path:
    """Where tokenised splits are kept: $NLI_CACHE_DIR/tokens, else ~/.cache/nli-helpers/tokens.
    Entries are never evicted; deleting the folder is safe (they are rebuilt when next needed)."""
    root = os.environ.get("NLI_CACHE_DIR") or Path.home() / ".cache" / "nli-helpers"
    return Path(root) / "tokens"


def cache_key(split, tokenizer, max_length: int) -> str:
    """A hash of everything the tokens depend on: the split's content, the whole tokenizer
    (vocabulary, normaliser, special tokens, truncation side), max_length and this code's format.
    The tokenizer's name is left out: two copies of one tokenizer give the same tokens."""
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


def cache_name(tokenizer, max_length: int) -> str:
    """The readable part of an entry's file name: the tokenizer's name or folder, and max_length."""
    name = "_".join(Path(str(tokenizer.name_or_path)).parts[-2:]) or type(tokenizer).__name__
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{max_length}"


def content_hash(split) -> str:
    """SHA-256 of a split's columns and rows, in order: the bytes of its Arrow IPC stream."""
    table = split.with_format("arrow")[:].combine_chunks()  # after select/shuffle; one chunk
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def cached_map(tokenise, path: Path, rows: int) -> tuple[Dataset, bool]:
    """The split `tokenise` gives, read from `path` when that holds all `rows` rows (a hit), else
    tokenised into it: (dataset, hit). datasets writes a temporary file and renames it, so a run
    killed while writing leaves no entry; a file lock makes one process tokenise while the others
    (torchrun ranks, parallel runs) wait and then read its file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            cached = read_cached(path, rows)
            if cached is not None:
                log.info("tokens read from the cache: %s", path)
                return cached, True
            return tokenise(cache_file_name=str(path), load_from_cache_file=False), False
    except OSError as e:  # a read-only or full disk must not stop a run: tokenise in memory
        log.warning("token cache %s unusable (%s); tokenising without it", path.parent, e)
        return tokenise(), False


def read_cached(path: Path, rows: int) -> Dataset | None:
    """The entry at `path`, or None when there is none or it is damaged (it is then rebuilt)."""
    if not path.exists():
        return None
    try:
        cached = Dataset.from_file(str(path))
        if len(cached) == rows:
            return cached
        problem = f"{len(cached):,} rows instead of {rows:,}"
    except Exception as e:  # pyarrow and datasets raise several types for a damaged file
        problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    log.warning("token cache entry %s is damaged (%s); tokenising again", path.name, problem)
    return None


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Batches of similar length in a random order: the padding shrinks, the order stays random.

    Each epoch: shuffle all indices (seed + epoch), cut them into mega-batches of
    `batch_size * mega_batches` examples, sort each mega-batch by length, cut it into batches and
    shuffle the batches. `batch_size` is the global batch: with `num_replicas > 1` each rank takes
    its interleaved share of every batch (batch_size / num_replicas examples), so N processes see
    exactly the batches one process would; every rank draws the same permutation (same seed), so
    no communication is needed.
    """

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

    def global_batches(self) -> list[np.ndarray]:
        """This epoch's batches of `batch_size` examples, the same on every rank."""
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
            # step 1, not hours in, and the allocator sizes its pools once (on the CPU, random
            # lengths first grew the peak RSS by a third: benchmarks/README.md).
            longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i]].max())
            batches[0], batches[longest] = batches[longest], batches[0]
        # A last batch too small to give every rank an example is dropped, so all ranks step
        # together.
        return [b for b in batches if len(b) >= self.num_replicas]

    def batches(self) -> list[np.ndarray]:
        """This rank's share of every global batch."""
        return [b[self.rank::self.num_replicas] for b in self.global_batches()]

    def __iter__(self) -> Iterator[list[int]]:
        return (b.tolist() for b in self.batches()[self.skip:])

    def __len__(self) -> int:
        """Batches in a whole epoch (skipped ones included: the loop counts epochs with it)."""
        size = self.batch_size
        n = len(self.lengths)
        return n // size + (n % size >= self.num_replicas)


class PaddedCollator:
    """Pads a batch of a tokenised split, given by row numbers, into the tensors that transformers'
    `DataCollatorWithPadding` gives for those rows (int64 `input_ids`, `token_type_ids` where the
    tokenizer has them, `attention_mask`, `labels`), with no Python loop over the examples.

    The split's token lists are kept as flat numpy arrays plus each row's start and length, so a
    batch is a few array operations: a (rows x longest) grid of positions into the flat arrays,
    filled with the pad value where a row has ended. Use it as a DataLoader's `collate_fn` over
    row numbers: `DataLoader(range(len(split)), batch_sampler=..., collate_fn=PaddedCollator(...))`.
    """

    def __init__(self, split, tokenizer, pad_to_multiple_of: int | None = None):
        table = split.with_format("arrow")[:]  # the rows as the split sees them (select, shuffle)
        pad = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0,
               "token_type_ids": tokenizer.pad_token_type_id, "special_tokens_mask": 1}
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
