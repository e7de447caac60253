"""Scores for NLI predictions: accuracy, macro-F1, per-class precision/recall, confusion matrix,
and per-genre accuracy when the split has genres.

    >>> classification_scores([0, 1, 2, 2], [0, 1, 1, 2])["accuracy"]
    0.75
    >>> scores_table(run_metrics)          # one row per validation split, for a notebook
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from .data import LABELS


def classification_scores(labels: Sequence[int], preds: Sequence[int],
                          genres: Sequence[str] | None = None) -> dict:
    """All scores for one split as plain JSON-able Python values."""
    labels, preds = np.asarray(labels), np.asarray(preds)
    if labels.shape != preds.shape:
        raise ValueError(f"labels {labels.shape} and predictions {preds.shape} differ in length")
    ids = list(range(len(LABELS)))
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, preds, labels=ids, zero_division=0)
    scores = {
        "n": int(labels.size),
        "accuracy": float((labels == preds).mean()) if labels.size else 0.0,
        "macro_f1": float(f1.mean()),
        "per_class": {name: {"precision": float(precision[i]), "recall": float(recall[i]),
                             "f1": float(f1[i]), "support": int(support[i])}
                      for i, name in enumerate(LABELS)},
        "confusion_matrix": confusion_matrix(labels, preds, labels=ids).tolist(),
    }
    if genres is not None:
        scores["per_genre"] = per_genre_accuracy(labels, preds, genres)
    return scores


def per_genre_accuracy(labels: Sequence[int], preds: Sequence[int], genres: Sequence[str]) -> dict:
    hits, counts = defaultdict(int), defaultdict(int)
    for y, p, g in zip(labels, preds, genres):
        counts[g] += 1
        hits[g] += int(y == p)
    return {g: {"accuracy": hits[g] / counts[g], "n": counts[g]} for g in sorted(counts)}


def majority_baseline(labels: Sequence[int]) -> float:
    """Accuracy of always predicting the most frequent label: the floor a model must beat."""
    counts = np.bincount(np.asarray(labels), minlength=len(LABELS))
    return float(counts.max() / counts.sum()) if counts.sum() else 0.0


def summary_line(split_scores: dict[str, dict]) -> str:
    """`validation_matched acc 0.812 F1 0.809 | ...` for logs and progress bars."""
    return " | ".join(f"{name} acc {s['accuracy']:.3f} F1 {s['macro_f1']:.3f}" for name, s in split_scores.items())


def scores_table(metrics: Mapping[str, dict], baseline: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """One row per validation split: pairs, accuracy, macro-F1, and what else is there: ECE, the majority baseline
    (a run's metrics.json), the hypothesis-only baseline's accuracy (`baseline`, {split: scores}).

    `metrics` is a run's metrics.json, or {split: scores} (evaluation.metrics_of).
    """
    majority = metrics.get("majority_baseline", {})
    rows = {}
    for name, scores in metrics.items():
        if not isinstance(scores, dict) or "accuracy" not in scores or name == "train":
            continue
        row = {"pairs": scores["n"], "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"]}
        if "ece" in scores:
            row["ece"] = scores["ece"]
        if name in majority:
            row["majority_baseline"] = majority[name]
        if baseline and name in baseline:
            row["hypothesis_only_accuracy"] = baseline[name]["accuracy"]
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")
