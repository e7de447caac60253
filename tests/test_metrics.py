import pandas as pd
import pytest

from nli_helpers.notebook_runs import scores_table
from nli_helpers.train import classification_scores, majority_baseline, per_genre_accuracy


def test_scores_match_a_hand_computed_example():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    s = classification_scores(labels, preds, genres=list("aabbcc"))
    assert s["n"] == 6 and s["accuracy"] == pytest.approx(4 / 6)
    assert s["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    # entailment: precision 1/2, recall 1/2; neutral: 2/3, 1; contradiction: 1, 1/2
    assert s["per_class"]["neutral"] == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2})
    f1 = [0.5, 0.8, 2 / 3]
    assert s["macro_f1"] == pytest.approx(sum(f1) / 3)
    assert s["per_genre"] == {"a": {"accuracy": 0.5, "n": 2}, "b": {"accuracy": 1.0, "n": 2},
                              "c": {"accuracy": 0.5, "n": 2}}


def test_scores_are_scikit_learn_s_on_random_labels():
    import numpy as np
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    rng = np.random.default_rng(0)
    for n in (1, 7, 500):
        labels, preds = rng.integers(0, 3, n), rng.integers(0, 3, n)
        preds[preds == 1] = 2  # neutral never predicted: sklearn's zero_division=0 case
        s = classification_scores(labels, preds)
        precision, recall, f1, support = precision_recall_fscore_support(labels, preds, labels=[0, 1, 2],
                                                                         zero_division=0)
        assert s["confusion_matrix"] == confusion_matrix(labels, preds, labels=[0, 1, 2]).tolist()
        assert s["macro_f1"] == pytest.approx(f1.mean())
        assert [s["per_class"][c]["precision"] for c in ("entailment", "neutral", "contradiction")] == \
            pytest.approx(precision)
        assert [s["per_class"][c]["recall"] for c in ("entailment", "neutral", "contradiction")] == \
            pytest.approx(recall)
        assert [s["per_class"][c]["support"] for c in ("entailment", "neutral", "contradiction")] == list(support)


def test_missing_class_does_not_crash_and_counts_zero():
    s = classification_scores([0, 0], [0, 0])
    assert s["accuracy"] == 1.0 and s["per_class"]["neutral"]["support"] == 0


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in length"):
        classification_scores([0, 1], [0])


def test_majority_and_genre_helpers():
    assert majority_baseline([0, 1, 1, 2]) == 0.5
    assert per_genre_accuracy([0], [1], ["x"]) == {"x": {"accuracy": 0.0, "n": 1}}


def test_scores_table_reads_run_metrics_and_baselines():
    metrics = {"validation_matched": {"n": 10, "accuracy": 0.8, "macro_f1": 0.7},
               "validation_mismatched": {"n": 5, "accuracy": 0.6, "macro_f1": 0.5},
               "train": {"steps": 3}, "majority_baseline": {"validation_matched": 0.4}, "device": "cpu"}
    table = scores_table(metrics, baseline={"validation_matched": {"accuracy": 0.55}})
    assert table.index.tolist() == ["validation_matched", "validation_mismatched"]
    assert table.loc["validation_matched", "majority_baseline"] == 0.4
    assert pd.isna(table.loc["validation_mismatched", "majority_baseline"])
    assert table.loc["validation_matched", "hypothesis_only_accuracy"] == 0.55
