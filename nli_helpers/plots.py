"""The few matplotlib figures the notebooks show.

Each function takes a table from `explore`, a run's `history` or its `metrics`, the results of
`evaluation.evaluate` or of a tuning job or sweep, and returns a `matplotlib.figure.Figure`: every figure
the notebooks show is here. Figures are built without pyplot, so they are not kept in pyplot's
global state: a notebook shows one by leaving it as the cell's last value (with
`%matplotlib inline`), a script saves it with `fig.savefig(path)`. No GUI back-end is needed.

    >>> fig = plots.label_distribution(explore.label_table(splits))
    >>> fig.savefig("labels.png")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .data import LABELS

LABEL_COLOURS = {"entailment": "#4C9F70", "neutral": "#8C8C8C", "contradiction": "#C8553D"}
SPLIT_COLOURS = ("#3B6EA8", "#E0A526", "#7A4EA3", "#4C9F70")


def _figure(width: float = 7.0, height: float = 3.2, ncols: int = 1):
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def _empty(message: str, width: float = 6.0) -> Figure:
    """A small figure that says why there is nothing to draw (e.g. data without genres)."""
    fig, ax = _figure(width, 1.2)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#555555")
    ax.set_axis_off()
    return fig


# -- data ---------------------------------------------------------------------------------------
def label_distribution(table: pd.DataFrame) -> Figure:
    """Share of each label per split (grouped bars, pair counts on top)."""
    fig, ax = _figure()
    x = np.arange(len(table.index))
    width = 0.8 / len(LABELS)
    for i, label in enumerate(LABELS):
        share = table[label] / table["total"]
        bars = ax.bar(x + (i - 1) * width, share, width, label=label, color=LABEL_COLOURS[label])
        ax.bar_label(bars, labels=[f"{n:,}" for n in table[label]], fontsize=8, padding=1)
    ax.set_xticks(x, [f"{name}\n({n:,} pairs)" for name, n in zip(table.index, table["total"])])
    ax.set_ylabel("share of pairs")
    ax.set_ylim(0, max(0.5, float((table[list(LABELS)].div(table["total"], axis=0)).max().max()) * 1.2))
    ax.axhline(1 / len(LABELS), color="black", lw=0.8, ls=":")
    ax.legend(ncols=3, loc="upper center", frameon=False)
    ax.set_title("Labels per split (dotted: a perfectly balanced third)")
    return fig


def genre_counts(table: pd.DataFrame) -> Figure:
    """Pairs per genre and split; matched genres first, then the held-out (mismatched) ones."""
    if table.empty:
        return _empty("This data has no genre column, so there is nothing to plot per genre.")
    splits = [c for c in table.columns if c != "set"]
    fig, ax = _figure(7.0, 0.35 * len(table) + 1.2)
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for colour, split in zip(SPLIT_COLOURS, splits):
        ax.barh(y, table[split], left=left, color=colour, label=split)
        left += table[split].to_numpy()
    ax.set_yticks(y, [f"{g} ({s})" for g, s in zip(table.index, table["set"])])
    ax.invert_yaxis()
    ax.set_xlabel("pairs")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.set_title("Pairs per genre and split (mismatched genres only validate)")
    return fig


def token_lengths(lengths: Sequence[int], max_length: int) -> Figure:
    """Histogram of tokens per premise+hypothesis pair, with the truncation point marked."""
    lengths = np.asarray(lengths)
    fig, ax = _figure()
    ax.hist(lengths, bins=min(60, max(10, len(np.unique(lengths)))), color="#3B6EA8")
    cut = float((lengths > max_length).mean()) if lengths.size else 0.0
    ax.axvline(max_length, color="#C8553D", lw=1.5, label=f"max_length {max_length}: truncates {cut:.2%}")
    ax.axvline(float(np.median(lengths)), color="black", lw=1, ls=":", label=f"median {np.median(lengths):.0f}")
    ax.set_xlabel("tokens per pair (premise + hypothesis + special tokens)")
    ax.set_ylabel("pairs")
    ax.legend(frameon=False)
    ax.set_title("How long the pairs are")
    return fig


def padding_waste(table: pd.DataFrame) -> Figure:
    """Tokens processed per epoch under each padding strategy: real tokens vs padding."""
    fig, ax = _figure(7.0, 2.6)
    y = np.arange(len(table))
    ax.barh(y, table["real_tokens"], color="#3B6EA8", label="real tokens")
    ax.barh(y, table["padded_tokens"] - table["real_tokens"], left=table["real_tokens"],
            color="#D9D9D9", label="padding")
    for yi, (total, waste, cost) in enumerate(zip(table["padded_tokens"], table["waste"], table["cost"])):
        ax.text(total, yi, f"  {waste:.0%} padding ({cost:.2f}x work)", va="center", fontsize=8)
    ax.set_yticks(y, table.index)
    ax.invert_yaxis()
    ax.set_xlim(0, table["padded_tokens"].max() * 1.75)
    ax.set_xlabel("tokens through the model per epoch")
    ax.legend(frameon=False, loc="center right", fontsize=8)
    ax.set_title("Padding: the same data, three ways to batch it")
    return fig


def artefacts(table: pd.DataFrame) -> Figure:
    """Hypothesis-only cues per label: negation words, hypothesis length, overlap with the premise."""
    panels = (("negation", "hypotheses with a negation word", "{:.0%}"),
              ("hypothesis_words", "mean hypothesis length (words)", "{:.1f}"),
              ("overlap", "hypothesis words found in the premise", "{:.0%}"))
    fig, axes = _figure(9.0, 2.8, ncols=len(panels))
    colours = [LABEL_COLOURS.get(label, "#3B6EA8") for label in table.index]
    for ax, (column, title, fmt) in zip(axes, panels):
        bars = ax.bar(table.index, table[column], color=colours)
        ax.bar_label(bars, labels=[fmt.format(v) for v in table[column]], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(y=0.2)
    fig.suptitle("Cues in the hypothesis alone, per gold label")
    return fig


# -- training -----------------------------------------------------------------------------------
def training_curves(history: Sequence[Mapping], smooth: int = 10) -> Figure:
    """Training loss per step (with a moving average) and the learning-rate schedule."""
    if not history:
        return _empty("No training steps were logged.")
    steps = np.array([row["step"] for row in history])
    loss = np.array([row["loss"] for row in history], dtype=float)
    lr = np.array([row["lr"] for row in history], dtype=float)
    fig, (ax_loss, ax_lr) = _figure(9.0, 3.0, ncols=2)
    ax_loss.plot(steps, loss, color="#9DB9D9", lw=1, label="per step")
    window = max(1, min(smooth, len(loss) // 3))
    if window > 1:
        avg = np.convolve(loss, np.ones(window) / window, mode="valid")
        ax_loss.plot(steps[window - 1:], avg, color="#3B6EA8", lw=2, label=f"mean of {window} steps")
    ax_loss.axhline(np.log(len(LABELS)), color="black", lw=0.8, ls=":", label="ln 3: guessing")
    ax_loss.set(xlabel="optimizer step", ylabel="cross-entropy loss", title="Training loss")
    ax_loss.legend(frameon=False, fontsize=8)
    ax_lr.plot(steps, lr, color="#C8553D")
    ax_lr.set(xlabel="optimizer step", ylabel="learning rate", title="Warmup, then linear decay")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    return fig


def _validation_splits(metrics: Mapping) -> list[str]:
    return [k for k, v in metrics.items() if k.startswith("validation") and isinstance(v, Mapping)]


def confusion_matrices(metrics: Mapping) -> Figure:
    """One confusion matrix per validation split: counts, coloured by share of the true label."""
    names = _validation_splits(metrics)
    if not names:
        return _empty("These metrics hold no validation split.")
    fig, axes = _figure(4.2 * len(names), 3.6, ncols=len(names))
    for ax, name in zip(np.atleast_1d(axes), names):
        cm = np.asarray(metrics[name]["confusion_matrix"])
        share = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
        ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
        for (i, j), n in np.ndenumerate(cm):
            ax.text(j, i, f"{n}", ha="center", va="center", color="white" if share[i, j] > 0.6 else "black")
        ax.set_xticks(range(len(LABELS)), LABELS, fontsize=8)
        ax.set_yticks(range(len(LABELS)), LABELS, fontsize=8)
        ax.set(xlabel="predicted", ylabel="true", title=f"{name}: accuracy {metrics[name]['accuracy']:.1%}")
    return fig


def split_accuracy(metrics: Mapping) -> Figure:
    """Accuracy and macro-F1 per validation split, against the majority-class baseline."""
    names = _validation_splits(metrics)
    if not names:
        return _empty("These metrics hold no validation split.")
    fig, ax = _figure(6.0, 3.0)
    x = np.arange(len(names))
    for offset, key, colour in ((-0.2, "accuracy", "#3B6EA8"), (0.2, "macro_f1", "#E0A526")):
        bars = ax.bar(x + offset, [metrics[n][key] for n in names], 0.4, color=colour, label=key)
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
    baseline = metrics.get("majority_baseline", {})
    for xi, name in zip(x, names):
        if name in baseline:
            ax.hlines(baseline[name], xi - 0.45, xi + 0.45, color="black", ls=":",
                      label="majority baseline" if xi == 0 else None)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.05)
    ax.legend(frameon=False, fontsize=8, ncols=3, loc="upper center")
    ax.set_title("Matched vs mismatched validation")
    return fig


def per_genre_accuracy(metrics: Mapping) -> Figure:
    """Accuracy per genre, coloured by validation split (matched genres vs held-out genres)."""
    rows = [(name, genre, s["accuracy"], s["n"]) for name in _validation_splits(metrics)
            for genre, s in metrics[name].get("per_genre", {}).items()]
    if not rows:
        return _empty("This data has no genre column, so there is no per-genre accuracy.")
    fig, ax = _figure(7.0, 0.35 * len(rows) + 1.2)
    colours = dict(zip(_validation_splits(metrics), SPLIT_COLOURS))
    y = np.arange(len(rows))
    ax.barh(y, [r[2] for r in rows], color=[colours[r[0]] for r in rows])
    for yi, (_, _, acc, n) in zip(y, rows):
        ax.text(acc, yi, f" {acc:.0%} of {n}", va="center", fontsize=8)
    ax.set_yticks(y, [f"{genre} ({name.removeprefix('validation_')})" for name, genre, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("accuracy")
    ax.set_title("Accuracy per genre")
    return fig


# -- evaluation and tuning ------------------------------------------------------------------
def reliability_diagram(evals: Mapping, n_bins: int = 10) -> Figure:
    """Accuracy against confidence per bin, one panel per split (evaluation.evaluate's results); the diagonal is
    perfect calibration."""
    from .evaluation import calibration_table

    fig = Figure(figsize=(3.8 * len(evals), 3.6), layout="constrained")
    axes = fig.subplots(1, max(1, len(evals)), squeeze=False)[0]
    for ax, (name, ev) in zip(axes, evals.items()):
        labels = ev.predictions["gold"].map(LABELS.index).to_numpy()
        table = calibration_table(ev.probs, labels, n_bins)
        ax.bar(table["low"], table["accuracy"], width=1 / n_bins, align="edge", color="#3B6EA8",
               edgecolor="white", label="accuracy")
        ax.bar(table["low"], table["confidence"] - table["accuracy"], bottom=table["accuracy"], width=1 / n_bins,
               align="edge", color="#C8553D", alpha=0.35, label="gap to confidence")
        ax.plot([0, 1], [0, 1], color="black", lw=0.8, ls=":")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top probability)", ylabel="accuracy",
               title=f"{name}: ECE {ev.scores['ece']:.3f}")
    axes[0].legend(frameon=False, fontsize=8, loc="upper left")
    return fig


def tuning_results(results: pd.DataFrame, metric: str | None = None) -> Figure:
    """The metric against each searched parameter, one panel per parameter; the best run is starred (the rows of
    sweep.local_sweep or tuning.tuning_results)."""
    from .config import TrainConfig
    from .sweep import best_trial
    from .tracking import DEFAULT_HYPERTUNE_METRIC

    metric = metric or results.attrs.get("metric", DEFAULT_HYPERTUNE_METRIC)
    names = results.attrs.get("parameters") or [c for c in results.columns if c in TrainConfig.field_names()]
    fig = Figure(figsize=(3.6 * max(1, len(names)), 3.0), layout="constrained")
    axes = fig.subplots(1, max(1, len(names)), squeeze=False)[0]
    best = best_trial(results, metric)
    for ax, name in zip(axes, names):
        x = results[name]
        numeric = pd.api.types.is_numeric_dtype(x)
        xs = x if numeric else x.astype(str)
        ax.scatter(xs, results[metric], color="#3B6EA8", label="runs")
        ax.scatter([best[name] if numeric else str(best[name])], [best[metric]], marker="*", s=220,
                   color="#E0A526", label="best", zorder=3)
        if numeric and (x > 0).all() and x.max() / x.min() >= 10:
            ax.set_xscale("log")
        ax.set(xlabel=name, ylabel=metric)
    axes[0].legend(frameon=False, fontsize=8)
    fig.suptitle(f"{metric} per run ({results.attrs.get('goal', 'maximize')})")
    return fig
