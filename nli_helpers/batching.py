"""Tokenise the splits once, and batch pairs of similar length together: little padding, a random order.

    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)   # input_ids, attention_mask, label, length
    >>> sampler = LengthGroupedBatchSampler(tokenized["train"]["length"], batch_size=32, seed=42)
    >>> padding_stats(lengths, sampler.batches())                           # real vs padded tokens

The training loop (`train.make_train_loader`) uses both; `explore.padding_comparison` shows what they save.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import DatasetDict

from .config import ConfigError
from .data import CHARS_PER_TOKEN_CAP
from .tables import DataError

log = logging.getLogger(__name__)


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128) -> DatasetDict:
    """Tokenise every split once, in batches, truncated but never padded (padding is per batch).

    Each text is first cut to `CHARS_PER_TOKEN_CAP * max_length` characters. Truncation keeps at
    most `max_length` tokens, which normal text fits in far fewer characters, so the result is the
    same; but the fast tokenizer's pair truncation builds every combination of the two texts'
    overflow windows (huggingface/tokenizers#2035), so one pair of 20,000-token texts would
    otherwise take tens of GB of memory.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; use a fast one (AutoTokenizer default)")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 1_000_000 and max_length > limit:
        raise ConfigError(f"max_length={max_length} is more than this model takes ({limit} tokens); "
                          f"use --max_length {limit} or less")
    cap = CHARS_PER_TOKEN_CAP * max_length

    def encode(batch):
        premises = [t[:cap] for t in batch["premise"]]
        hypotheses = [t[:cap] for t in batch["hypothesis"]]
        enc = tokenizer(premises, hypotheses, truncation=True, max_length=max_length)
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
    shuffle the batches. `batch_size` is the global batch: with `num_replicas > 1` each rank takes its
    interleaved share of every batch (batch_size / num_replicas examples), so N processes see exactly
    the batches one process would; every rank draws the same permutation (same seed), so no
    communication is needed.
    """

    def __init__(self, lengths: list[int] | np.ndarray, batch_size: int, *, seed: int = 0,
                 group_by_length: bool = True, mega_batches: int = 50, num_replicas: int = 1, rank: int = 0):
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.group = batch_size, seed, group_by_length
        self.mega, self.num_replicas, self.rank = mega_batches, num_replicas, rank
        self.epoch = self.skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Choose the epoch's order; `skip_batches` resumes part way through it (after a checkpoint)."""
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
            # The longest batch first, as Hugging Face's sampler does: an out-of-memory shows at step 1, not
            # hours in, and the allocator sizes its pools once (on the CPU, random lengths first grew the peak
            # RSS by a third: benchmarks/README.md).
            longest = max(range(len(batches)), key=lambda i: self.lengths[batches[i]].max())
            batches[0], batches[longest] = batches[longest], batches[0]
        # A last batch too small to give every rank an example is dropped, so all ranks step together.
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
        table = split.with_format("arrow")[:]  # the rows as the split sees them (after select/shuffle)
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
        # Column j of a row holds its token j - shift: shift is the row's padding when padding on the left.
        token = np.arange(width) - (width - lengths if self.left else 0)
        real = (token >= 0) & (token < lengths)
        where = np.where(real, self.starts[rows][:, None] + token, 0)
        batch = {name: torch.from_numpy(np.where(real, self.flat[name][where], pad).astype(np.int64))
                 for name, pad in self.pad.items()}
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[rows].astype(np.int64))
        return batch


def padding_stats(lengths: list[int] | np.ndarray, batches: list[np.ndarray]) -> dict[str, float]:
    """Real vs padded tokens when each batch is padded to its longest member."""
    lengths = np.asarray(lengths)
    real = int(lengths.sum())
    padded = int(sum(len(b) * lengths[b].max() for b in batches if len(b)))
    return {"real_tokens": real, "padded_tokens": padded, "pad_fraction": 1 - real / padded if padded else 0.0}
