"""Look at NLI data before training on it: the tables behind notebooks/01_explore_mnli.ipynb.

Every function takes the `DatasetDict` that `data.load_nli_splits` returns (or one split of it)
and returns a pandas table or numbers that `plots` draws. Nothing here trains or downloads a
model except `load_tokenizer`, which loads only the tokenizer a profile names.

    >>> splits = load_nli_splits("sample")
    >>> label_table(splits)                          # pairs per label and split
    >>> lengths = pair_lengths(splits["train"], load_tokenizer("minilm-l6"))
    >>> padding_comparison(lengths, batch_size=32, max_length=128)

Data without a `genre` column (such as the real dev_matched file) gives empty genre tables,
not errors, so a notebook runs unchanged on either.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

import numpy as np
import pandas as pd

from .batching import LengthGroupedBatchSampler, padding_stats
from .data import LABELS, MATCHED_GENRES, MISMATCHED_GENRES

# Negation and its contractions: annotators wrote contradictions by negating the premise, so these
# words in a hypothesis alone predict "contradiction" (Gururangan et al., 2018; Poliak et al., 2018).
NEGATION_WORDS = frozenset({"not", "no", "never", "nobody", "nothing", "none", "nowhere", "neither",
                            "nor", "cannot", "n't"})
WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|n't")


def words(text: str) -> list[str]:
    """Lower-cased words, with contractions split so that "didn't" yields "did" and "n't"."""
    out = []
    for w in WORD_RE.findall(text.lower().replace("\u2019", "'")):
        if w.endswith("n't") and len(w) > 3:
            out.extend((w[:-3], "n't"))
        else:
            out.append(w)
    return out


def has_negation(text: str) -> bool:
    return any(w in NEGATION_WORDS for w in words(text))


def load_tokenizer(model_name: str):
    """Only the fast tokenizer of a model (hub name, local dir, `minilm-l6` or `tiny-random`)."""
    from transformers import AutoTokenizer

    from .model import ModelError, resolve_model_path

    path = resolve_model_path(model_name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"no tokenizer for {model_name!r} ({type(e).__name__}); offline, use "
                         "model_name='minilm-l6' or 'tiny-random'") from e


# -- sizes, labels, genres -------------------------------------------------------------------
def label_table(splits: Mapping) -> pd.DataFrame:
    """Pairs per label (columns) and split (rows), with a total column."""
    rows = {}
    for name, ds in splits.items():
        counts = np.bincount(np.asarray(ds["label"], dtype=np.int64), minlength=len(LABELS))
        rows[name] = dict(zip(LABELS, counts.tolist()))
    table = pd.DataFrame.from_dict(rows, orient="index", columns=list(LABELS))
    table["total"] = table.sum(axis=1)
    return table


def genre_table(splits: Mapping) -> pd.DataFrame:
    """Pairs per genre (rows) and split (columns), with a `set` column: matched or mismatched.

    Empty (no rows) when the data has no genre column.
    """
    counts = {name: Counter(ds["genre"]) for name, ds in splits.items() if "genre" in ds.column_names}
    if not counts:
        return pd.DataFrame(columns=["set", *splits.keys()])
    table = pd.DataFrame(counts).fillna(0).astype(int).sort_index()
    sets = ["matched" if g in MATCHED_GENRES else "mismatched" if g in MISMATCHED_GENRES else "other"
            for g in table.index]
    table.insert(0, "set", sets)
    return table.sort_values("set", kind="stable")


def examples_per_label(ds, per_label: int = 2, seed: int = 0) -> pd.DataFrame:
    """A few random pairs of each label, for reading."""
    df = ds.to_pandas()
    rng = np.random.default_rng(seed)  # one generator for all labels: different rows per label
    picked = pd.concat([g.sample(min(per_label, len(g)), random_state=rng) for _, g in df.groupby("label")])
    picked["label"] = picked["label"].map(dict(enumerate(LABELS)))
    cols = ["label", "premise", "hypothesis"] + (["genre"] if "genre" in df.columns else [])
    return picked[cols].reset_index(drop=True)


def premise_overlap(splits: Mapping) -> dict[str, float]:
    """Share of each validation split's pairs whose premise also occurs in train.

    0 when `load_nli_splits` split the data by premise; MultiNLI's official dev sets may share a
    handful of very short spoken premises ("yeah") with train.
    """
    train = set(splits["train"]["premise"])
    return {name: sum(p in train for p in ds["premise"]) / max(len(ds), 1)
            for name, ds in splits.items() if name != "train"}


# -- token lengths and padding -----------------------------------------------------------------
def pair_lengths(ds, tokenizer, batch_size: int = 1000) -> np.ndarray:
    """Tokens per premise+hypothesis pair, special tokens included, before any truncation."""
    out = []
    for start in range(0, len(ds), batch_size):
        batch = ds[start:start + batch_size]
        enc = tokenizer(batch["premise"], batch["hypothesis"], truncation=False, verbose=False)
        out.extend(len(ids) for ids in enc["input_ids"])
    return np.asarray(out, dtype=np.int64)


def length_summary(lengths: np.ndarray, max_length: int) -> dict[str, float]:
    """Mean, percentiles, longest, and the share of pairs that `max_length` truncates."""
    lengths = np.asarray(lengths)
    return {"pairs": int(lengths.size), "mean": float(lengths.mean()), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()), "max_length": max_length,
            "truncated_fraction": truncated_fraction(lengths, max_length)}


def truncated_fraction(lengths: np.ndarray, max_length: int) -> float:
    lengths = np.asarray(lengths)
    return float((lengths > max_length).mean()) if lengths.size else 0.0


def padding_comparison(lengths: np.ndarray, batch_size: int, max_length: int = 512,
                       seed: int = 42) -> pd.DataFrame:
    """Tokens a model processes for one epoch under three ways of padding, after truncation.

    - whole split padded to its longest pair (the old recipe: one `tokenizer(..., padding=True)`
      over the split);
    - dynamic padding: random batches, each padded to its own longest pair;
    - length-grouped: batches of similar length (`batching.LengthGroupedBatchSampler`, what `train` uses).

    `waste` is the share of processed tokens that are padding; `cost` is processed / real tokens.
    """
    lengths = np.minimum(np.asarray(lengths), max_length)
    rows = {"whole split padded to longest": {"real_tokens": int(lengths.sum()),
                                              "padded_tokens": int(lengths.size * lengths.max())}}
    for name, group in (("dynamic padding, random batches", False), ("length-grouped batches", True)):
        batches = LengthGroupedBatchSampler(lengths, batch_size, seed=seed, group_by_length=group).batches()
        stats = padding_stats(lengths, batches)
        rows[name] = {"real_tokens": stats["real_tokens"], "padded_tokens": stats["padded_tokens"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["waste"] = 1 - table["real_tokens"] / table["padded_tokens"]
    table["cost"] = table["padded_tokens"] / table["real_tokens"]
    return table


# -- annotation artefacts ----------------------------------------------------------------------
def artefact_table(ds) -> pd.DataFrame:
    """Per label: hypotheses with a negation word, hypothesis length, and word overlap with the premise.

    Each column is a cue a model can use without reading the premise properly: negation marks
    contradictions, neutral hypotheses add details (longer), entailed ones reuse premise words.
    """
    df = ds.to_pandas()
    hyp_words = df["hypothesis"].map(words)
    prem_words = df["premise"].map(lambda t: set(words(t)))
    df["negation"] = hyp_words.map(lambda ws: any(w in NEGATION_WORDS for w in ws))
    df["hypothesis_words"] = hyp_words.map(len)
    df["overlap"] = [sum(w in p for w in h) / max(len(h), 1) for h, p in zip(hyp_words, prem_words)]
    table = df.groupby("label").agg(pairs=("label", "size"), negation=("negation", "mean"),
                                    hypothesis_words=("hypothesis_words", "mean"), overlap=("overlap", "mean"))
    table.index = [LABELS[i] for i in table.index]
    return table


def label_given_negation(ds) -> pd.Series:
    """Share of each label among hypotheses that contain a negation word (chance is about 1/3)."""
    neg = [has_negation(h) for h in ds["hypothesis"]]
    labels = np.asarray(ds["label"])[np.asarray(neg, dtype=bool)]
    counts = np.bincount(labels, minlength=len(LABELS))
    return pd.Series(counts / max(counts.sum(), 1), index=list(LABELS), name=f"of {counts.sum()} negated")


def indicative_words(ds, top: int = 5, min_count: int | None = None) -> pd.DataFrame:
    """Hypothesis words that most predict each label on their own: P(label | word) for words seen
    in at least `min_count` hypotheses (default: 1 in 500, at least 5). High values are cues a
    hypothesis-only model can learn."""
    min_count = min_count or max(5, len(ds) // 500)
    per_word: dict[str, np.ndarray] = {}
    for hyp, label in zip(ds["hypothesis"], ds["label"]):
        for w in set(words(hyp)):
            per_word.setdefault(w, np.zeros(len(LABELS), dtype=np.int64))[label] += 1
    rows = []
    for w, counts in per_word.items():
        if counts.sum() >= min_count:
            rows += [{"label": LABELS[i], "word": w, "hypotheses": int(counts.sum()),
                      "p_label": counts[i] / counts.sum()} for i in range(len(LABELS))]
    if not rows:
        return pd.DataFrame(columns=["label", "word", "hypotheses", "p_label"])
    table = pd.DataFrame(rows).sort_values(["label", "p_label", "hypotheses"], ascending=[True, False, False])
    return table.groupby("label", sort=False).head(top).reset_index(drop=True)
