"""Every figure the notebooks show: built headless, drawable, and honest about missing data."""

import io

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from nli_helpers import explore, plots
from nli_helpers.data import LABELS

CM = [[5, 1, 0], [2, 3, 1], [0, 1, 6]]


def metrics(with_genre: bool = True) -> dict:
    def split(acc, genres):
        s = {"n": 19, "accuracy": acc, "macro_f1": acc - 0.05, "confusion_matrix": CM}
        if with_genre:
            s["per_genre"] = {g: {"accuracy": acc, "n": 4} for g in genres}
        return s

    return {"validation_matched": split(0.74, ["fiction", "travel"]),
            "validation_mismatched": split(0.68, ["letters"]),
            "majority_baseline": {"validation_matched": 0.36, "validation_mismatched": 0.35},
            "train": {"steps": 10}, "device": "cpu"}


def history(steps: int = 30) -> list[dict]:
    rows = [{"step": s, "epoch": s / 10, "loss": 1.1 - 0.01 * s, "lr": 1e-4 * min(1, s / 3) * (1 - s / (steps + 1))}
            for s in range(1, steps + 1)]
    rows[-1].update(examples_per_s=50.0, tokens_per_s=2000.0)
    return rows


def texts(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]) + " " + \
        " ".join(t.get_text() for t in fig.texts)


def drawn(fig: Figure) -> Figure:
    assert isinstance(fig, Figure)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")  # no pyplot, no GUI back-end needed
    assert buffer.getvalue()[:4] == b"\x89PNG"
    return fig


def test_label_distribution_has_a_bar_per_label_and_split(sample_splits):
    table = explore.label_table(sample_splits)
    fig = drawn(plots.label_distribution(table))
    bars = [p for p in fig.axes[0].patches]
    assert len(bars) == len(LABELS) * len(table)
    assert bars[0].get_height() == pytest.approx(table.iloc[0, 0] / table.iloc[0]["total"])


def test_genre_counts_and_its_no_genre_note(sample_splits):
    fig = drawn(plots.genre_counts(explore.genre_table(sample_splits)))
    assert len(fig.axes[0].get_yticklabels()) == 10
    empty = drawn(plots.genre_counts(pd.DataFrame(columns=["set", "train"])))
    assert "no genre column" in texts(empty)


def test_token_lengths_marks_max_length():
    fig = drawn(plots.token_lengths(np.array([10, 20, 30, 200]), 128))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "max_length 128: truncates 25.00%" in labels


def test_padding_waste_labels_each_strategy():
    table = explore.padding_comparison(np.arange(5, 300), batch_size=16, max_length=256)
    fig = drawn(plots.padding_waste(table))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == table.index.tolist()
    assert texts(fig).count("padding (") == 3


def test_artefacts_has_three_panels(sample_splits):
    fig = drawn(plots.artefacts(explore.artefact_table(sample_splits["train"])))
    assert len(fig.axes) == 3


def test_training_curves_plot_loss_and_lr():
    rows = history()
    fig = drawn(plots.training_curves(rows))
    loss_ax, lr_ax = fig.axes
    assert loss_ax.lines[0].get_ydata().tolist() == [r["loss"] for r in rows]
    assert lr_ax.lines[0].get_ydata().tolist() == [r["lr"] for r in rows]
    assert "No training steps" in texts(drawn(plots.training_curves([])))
    drawn(plots.training_curves(history(2)))  # too short to smooth: still draws


def test_confusion_matrices_one_panel_per_split():
    fig = drawn(plots.confusion_matrices(metrics()))
    assert len(fig.axes) == 2
    assert "74.0%" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].texts[:3]] == ["5", "1", "0"]


def test_split_accuracy_shows_the_baseline():
    fig = drawn(plots.split_accuracy(metrics()))
    assert len(fig.axes[0].patches) == 4
    assert "majority baseline" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_per_genre_accuracy_and_its_no_genre_note():
    fig = drawn(plots.per_genre_accuracy(metrics()))
    assert len(fig.axes[0].patches) == 3
    assert "no per-genre accuracy" in texts(drawn(plots.per_genre_accuracy(metrics(with_genre=False))))
    assert "no validation split" in texts(drawn(plots.confusion_matrices({"train": {}})))
