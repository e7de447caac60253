"""Use a trained model: load it (local or gs://), evaluate it on any split or file, check its calibration, look at
its worst errors, compare it with a hypothesis-only baseline, and predict on pairs or on a whole file.

    >>> trained = load_trained("runs/train-.../")        # or "gs://BUCKET/nli-jobs/run-1/model"
    >>> splits = run_splits(trained)                     # the run's own split: its validation pairs are held out
    >>> evals = evaluate(trained, {k: v for k, v in splits.items() if k != "train"})
    >>> scores_table(evals); calibration_table(evals["validation_matched"].probs, ...)
    >>> predict_file(trained, "pairs.jsonl", "predictions.jsonl")      # JSONL with label probabilities

Predictions go through `model.predict_proba` in batches of similar length (less padding), with a progress bar,
and come back in input order. Scores come from `metrics.classification_scores`, the same as training reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import storage
from .config import ConfigError, NLIError, TrainConfig
from .data import COLUMN_ALIASES, LABELS, DataError, LoadReport, load_nli_splits, normalise_frame, read_table
from .metrics import classification_scores
from .model import PROB_COLUMNS, load_model_and_tokenizer, predict


# -- the model --------------------------------------------------------------------------------------------
@dataclass
class TrainedModel:
    """A saved run: the model on this machine's device, its tokenizer, and the run's config and metrics if saved."""

    model: torch.nn.Module
    tokenizer: object
    source: str  # where it was loaded from: a local folder or gs://
    config: TrainConfig | None = None
    metrics: dict | None = None


def load_trained(source: str | Path, device: str | None = None) -> TrainedModel:
    """Load a run directory written by `run_training` (or any saved classifier) from a local path or gs://."""
    source = str(source)
    with storage.local_copy(source.rstrip("/") if storage.is_gcs_uri(source) else Path(source).expanduser()) as path:
        model, tokenizer = load_model_and_tokenizer(str(path))  # a clear ModelError for a wrong path
        cfg_file, metrics_file = path / "train_config.json", path / "metrics.json"
        cfg = _saved_config(cfg_file) if cfg_file.is_file() else None
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()
    return TrainedModel(model, tokenizer, source, cfg, metrics)


def _saved_config(path: Path) -> TrainConfig | None:
    """The run's TrainConfig; fields this version does not know are ignored, an invalid one gives None."""
    saved = json.loads(path.read_text())
    try:
        return TrainConfig(**{k: v for k, v in saved.items() if k in TrainConfig.field_names()})
    except (ConfigError, TypeError):
        return None


# -- data -----------------------------------------------------------------------------------------------------
def run_splits(trained: TrainedModel, data: str | None = None, *, max_eval_samples: int | None = None
               ) -> dict[str, pd.DataFrame]:
    """The splits of the run's data (or of `data`), cut as the run cut them: same seed, same eval fraction.

    So the validation pairs of a single file are pairs this model never trained on, and `train` holds the pairs
    it trained on (the same seeded subset when the run capped them).
    """
    cfg = trained.config
    if data is None and cfg is None:
        raise NLIError(f"{trained.source} has no train_config.json, so its data is unknown: pass data=...")
    source = data or cfg.data or "sample"
    same = {"eval_fraction": cfg.eval_fraction, "seed": cfg.seed} if cfg else {}
    if cfg and data is None:  # the very pairs it trained on (a seeded subset when the run capped them)
        same.update(fraction_of_train_data=cfg.fraction_of_train_data, max_train_samples=cfg.max_train_samples)
    splits = load_nli_splits(source, max_eval_samples=max_eval_samples, **same)
    return {name: ds.to_pandas() for name, ds in splits.items()}


def read_pairs(path: str | Path, *, labelled: bool = False) -> pd.DataFrame:
    """Pairs from a jsonl/csv/tsv/parquet file (local or gs://). `labelled`: labels as ids, unlabelled rows dropped;
    otherwise only premise and hypothesis are needed and every row is kept."""
    source = str(path)
    with storage.local_copy(source) as local:
        df = read_table(local)
    if labelled:
        return normalise_frame(df, source, LoadReport(source))
    df = df.rename(columns={k: v for k, v in COLUMN_ALIASES.items() if v not in df.columns})
    missing = [c for c in ("premise", "hypothesis") if c not in df.columns]
    if missing:
        raise DataError(f"{source} lacks column(s) {', '.join(missing)}: name them premise/hypothesis "
                        "(or sentence1/sentence2)")
    return df.assign(premise=df["premise"].astype(str), hypothesis=df["hypothesis"].astype(str)).reset_index(drop=True)


# -- predicting ----------------------------------------------------------------------------------------------------
def predict_file(trained: TrainedModel, source: str | Path, output: str | Path, *, batch_size: int = 64,
                 max_length: int = 128, progress: bool = True) -> dict:
    """Label every pair of a file and write JSONL (local or gs://), one line per input row, in order:
    {"premise", "hypothesis", "label": predicted, "probs": {label: p}} plus "gold_label" / "genre" when present."""
    df = read_pairs(source)
    table = predict(list(zip(df["premise"], df["hypothesis"])), trained, batch_size=batch_size, max_length=max_length,
                    progress=progress, as_table=True)
    folder, _, name = str(output).rstrip("/").rpartition("/")
    with storage.staged_output(folder or ".") as staged, open(staged / name, "w", encoding="utf-8") as f:
        for i, row in table.iterrows():
            line = {"premise": row["premise"], "hypothesis": row["hypothesis"], "label": row["predicted"],
                    "probs": {label: round(float(row[f"p_{label}"]), 6) for label in LABELS}}
            line.update({key: _plain(df.at[i, col]) for key, col in (("gold_label", "label"), ("genre", "genre"))
                         if col in df.columns})
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return {"output": str(output), "pairs": len(table), "labels": table["predicted"].value_counts().to_dict()}


def _plain(value):
    return value.item() if hasattr(value, "item") else value


# -- evaluating --------------------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """One split: a row per pair (gold, predicted, confidence, probabilities) and its scores."""

    name: str
    predictions: pd.DataFrame
    scores: dict
    probs: np.ndarray


def evaluate_frame(trained: TrainedModel, df: pd.DataFrame, name: str = "pairs", **kwargs) -> Evaluation:
    """Predict a labelled table (premise, hypothesis, label ids, optional genre) and score it."""
    table = predict(list(zip(df["premise"], df["hypothesis"])), trained, as_table=True, **kwargs)
    labels = df["label"].to_numpy()
    preds = table[PROB_COLUMNS].to_numpy().argmax(1)
    genres = df["genre"].tolist() if "genre" in df.columns else None
    scores = classification_scores(labels, preds, genres)
    probs = table[PROB_COLUMNS].to_numpy()
    scores["ece"] = expected_calibration_error(probs, labels)
    table.insert(2, "gold", [LABELS[i] for i in labels])
    table["correct"] = labels == preds
    if genres is not None:
        table["genre"] = genres
    return Evaluation(name, table, scores, probs)


def evaluate(trained: TrainedModel, splits: Mapping[str, pd.DataFrame], **kwargs) -> dict[str, Evaluation]:
    """`evaluate_frame` on every split."""
    return {name: evaluate_frame(trained, df, name, **kwargs) for name, df in splits.items()}


def metrics_of(evals: Mapping[str, Evaluation]) -> dict[str, dict]:
    """{split: scores}: the shape of a run's metrics.json, for `plots.confusion_matrices` and friends."""
    return {name: ev.scores for name, ev in evals.items()}


# -- calibration ---------------------------------------------------------------------------------------------------
def calibration_table(probs: np.ndarray, labels: Sequence[int], n_bins: int = 10) -> pd.DataFrame:
    """Pairs binned by the model's confidence (its top probability): mean confidence vs accuracy per bin.

    A calibrated model is right 70% of the time when it is 70% sure; `gap` > 0 means over-confident.
    """
    probs, labels = np.asarray(probs), np.asarray(labels)
    confidence, correct = probs.max(1), probs.argmax(1) == labels
    bins = np.clip(np.ceil(confidence * n_bins).astype(int) - 1, 0, n_bins - 1)  # (0, 0.1] -> 0 ... (0.9, 1] -> 9
    rows = [{"low": b / n_bins, "high": (b + 1) / n_bins, "pairs": int((bins == b).sum()),
             "confidence": float(confidence[bins == b].mean()), "accuracy": float(correct[bins == b].mean())}
            for b in range(n_bins) if (bins == b).any()]
    table = pd.DataFrame(rows, columns=["low", "high", "pairs", "confidence", "accuracy"])
    return table.assign(gap=table["confidence"] - table["accuracy"])


def expected_calibration_error(probs: np.ndarray, labels: Sequence[int], n_bins: int = 10) -> float:
    """ECE: the pair-weighted mean |confidence - accuracy| over the confidence bins (0 is perfect)."""
    table = calibration_table(probs, labels, n_bins)
    n = table["pairs"].sum()
    return float((table["pairs"] * table["gap"].abs()).sum() / n) if n else 0.0


# -- errors and baselines -------------------------------------------------------------------------------------------
def confidently_wrong(evaluation: Evaluation, top: int = 10) -> pd.DataFrame:
    """The wrong predictions the model was surest of: label noise, annotation artefacts or real blind spots."""
    wrong = evaluation.predictions[~evaluation.predictions["correct"]]
    return wrong.sort_values("confidence", ascending=False).head(top)[
        ["premise", "hypothesis", "gold", "predicted", "confidence"]]


@dataclass
class HypothesisOnlyBaseline:
    """A bag-of-words logistic regression that reads only the hypothesis, and its scores per split."""

    pipeline: object
    scores: dict[str, dict]

    def cues(self, top: int = 5) -> pd.DataFrame:
        """The words that push it hardest towards each label: the annotation artefacts it learnt."""
        vectorizer, classifier = self.pipeline[0], self.pipeline[-1]
        words = vectorizer.get_feature_names_out()
        rows = [{"label": LABELS[cls], "word": words[j], "weight": float(classifier.coef_[k][j])}
                for k, cls in enumerate(classifier.classes_) for j in np.argsort(-classifier.coef_[k])[:top]]
        return pd.DataFrame(rows)


def hypothesis_only_baseline(train: pd.DataFrame, splits: Mapping[str, pd.DataFrame]) -> HypothesisOnlyBaseline:
    """Train on the hypotheses of `train` alone and score every split.

    MultiNLI's annotators left cues in the hypotheses (negation words for contradiction, vague or added details for
    neutral), so a model that never reads the premise beats chance; the fine-tuned model should beat this one.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    if train["label"].nunique() < 2:
        raise NLIError("the training split holds a single label: a baseline needs at least two")
    pipeline = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"(?u)\b\w+\b"),
                             LogisticRegression(max_iter=1000))
    pipeline.fit(train["hypothesis"], train["label"])
    scores = {name: classification_scores(df["label"], pipeline.predict(df["hypothesis"])) for name, df in splits.items()}
    return HypothesisOnlyBaseline(pipeline, scores)
