"""Evaluating and using a saved model: local and gs:// loading, scores that match the training run's own,
calibration worked by hand, the hypothesis-only baseline, and prediction files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from nli_helpers import evaluation, storage
from nli_helpers.config import make_config
from nli_helpers.data import LABELS, DataError
from nli_helpers.metrics import scores_table
from nli_helpers.model import PROB_COLUMNS, ModelError, predict, predict_proba
from nli_helpers.run import run_training


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("eval") / "run"
    cfg = make_config("smoke", model_name=tiny_model_dir, data="sample", epochs=1, max_train_samples=64,
                      precision="fp32", keep_checkpoints=0, progress=False, job_dir=str(out))
    run_training(cfg, verbose=False)
    return out


@pytest.fixture(scope="module")
def trained(run_dir):
    return evaluation.load_trained(run_dir)


def test_held_out_scores_match_what_the_run_reported(trained):
    splits = evaluation.run_splits(trained)
    assert set(splits) == {"train", "validation_matched", "validation_mismatched"}
    assert not set(splits["train"]["premise"]) & set(splits["validation_matched"]["premise"])  # held out by premise
    evals = evaluation.evaluate(trained, {k: v for k, v in splits.items() if k != "train"}, progress=False)
    for name, ev in evals.items():
        reported = trained.metrics[name]
        assert ev.scores["n"] == reported["n"] == len(ev.predictions)
        assert ev.scores["confusion_matrix"] == reported["confusion_matrix"]
        assert ev.scores["accuracy"] == pytest.approx(reported["accuracy"])
        assert ev.scores["per_genre"] == reported["per_genre"]
        assert 0 <= ev.scores["ece"] <= 1
    table = scores_table(evaluation.metrics_of(evals))
    assert list(table.index) == ["validation_matched", "validation_mismatched"]
    assert list(table.columns) == ["pairs", "accuracy", "macro_f1", "ece"]


def test_a_gcs_copy_loads_and_predicts_the_same(trained, run_dir, gcs_bucket):
    uri = f"gs://{gcs_bucket}/runs/eval-1"
    storage.upload(run_dir, uri)
    remote = evaluation.load_trained(uri)
    assert remote.source == uri and remote.config == trained.config and remote.metrics == trained.metrics
    pairs = [("A dog runs in the park.", "An animal is outside."), ("It rained all day.", "The ground is dry.")]
    assert np.allclose(predict_proba(remote.model, remote.tokenizer, pairs),
                       predict_proba(trained.model, trained.tokenizer, pairs), atol=1e-6)


def test_batched_predictions_come_back_in_input_order(trained):
    splits = evaluation.run_splits(trained)
    df = splits["validation_matched"]
    pairs = list(zip(df["premise"], df["hypothesis"]))
    batched = predict_proba(trained.model, trained.tokenizer, pairs, batch_size=3)  # pairs of similar length
    one_by_one = np.concatenate([predict_proba(trained.model, trained.tokenizer, [p], batch_size=1) for p in pairs])
    assert batched.shape == (len(pairs), 3)
    assert np.allclose(batched, one_by_one, atol=1e-5) and np.allclose(batched.sum(1), 1, atol=1e-5)
    table = predict(pairs[:4], trained, as_table=True)
    assert list(table.columns) == ["premise", "hypothesis", "predicted", "confidence", *PROB_COLUMNS]
    assert list(table["predicted"]) == [LABELS[i] for i in batched[:4].argmax(1)]
    assert [p["label"] for p in predict(pairs[:4], trained)] == list(table["predicted"])


def test_calibration_worked_by_hand():
    probs = np.array([[0.95, 0.03, 0.02]] * 4 + [[0.55, 0.25, 0.20]] * 2)
    labels = [0, 0, 0, 1, 0, 0]  # 3 of the 4 very sure ones right, both unsure ones right
    table = evaluation.calibration_table(probs, labels)
    assert list(table["pairs"]) == [2, 4] and list(table["low"]) == [0.5, 0.9]
    assert table["accuracy"].tolist() == [1.0, 0.75]
    assert table["gap"].tolist() == pytest.approx([0.55 - 1.0, 0.95 - 0.75])
    # (2 x 0.45 + 4 x 0.20) / 6
    assert evaluation.expected_calibration_error(probs, labels) == pytest.approx((0.9 + 0.8) / 6)


def test_confidently_wrong_puts_the_surest_mistakes_first():
    predictions = pd.DataFrame({"premise": list("abcd"), "hypothesis": list("efgh"),
                                "gold": ["neutral"] * 4, "predicted": ["neutral", "entailment", "contradiction", "entailment"],
                                "confidence": [0.99, 0.6, 0.9, 0.7], "correct": [True, False, False, False]})
    ev = evaluation.Evaluation("x", predictions, {}, np.zeros((4, 3)))
    worst = evaluation.confidently_wrong(ev, top=2)
    assert list(worst["premise"]) == ["c", "d"] and list(worst["confidence"]) == [0.9, 0.7]


def test_hypothesis_only_baseline_learns_annotation_cues():
    hyps = {0: ["a person is outside", "someone is moving"], 1: ["the man is probably tired", "she is maybe a nurse"],
            2: ["nobody is outside", "the man is not moving"]}
    train = pd.DataFrame([{"premise": "p", "hypothesis": h, "label": label} for label, hs in hyps.items()
                          for h in hs * 5])
    held_out = pd.DataFrame({"premise": ["q"] * 3, "hypothesis": ["a dog is not here", "it is maybe late", "someone is outside"],
                             "label": [2, 1, 0]})
    baseline = evaluation.hypothesis_only_baseline(train, {"validation_matched": held_out})
    assert baseline.scores["validation_matched"]["accuracy"] == 1.0
    cues = baseline.cues(top=3)
    negations = cues[cues["label"] == "contradiction"]["word"]  # words and word pairs
    assert len(negations) == 3 and all({"not", "nobody"} & set(w.split()) for w in negations), negations.tolist()


def test_predict_file_writes_jsonl_in_order_local_and_gcs(trained, tmp_path, gcs_bucket):
    source = tmp_path / "pairs.csv"
    pd.DataFrame({"sentence1": ["A man sleeps.", "Kids play football.", "The shop is closed."],
                  "sentence2": ["A person rests.", "Nobody is playing.", "The shop sells bread."],
                  "gold_label": ["entailment", "contradiction", "-"]}).to_csv(source, index=False)
    summary = evaluation.predict_file(trained, source, tmp_path / "out" / "predictions.jsonl", batch_size=2,
                                      progress=False)
    lines = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert summary["pairs"] == len(lines) == 3  # the unlabelled row is predicted too
    assert [x["premise"] for x in lines] == ["A man sleeps.", "Kids play football.", "The shop is closed."]
    assert [x["gold_label"] for x in lines] == ["entailment", "contradiction", "-"]
    for x in lines:
        assert set(x["probs"]) == set(LABELS) and sum(x["probs"].values()) == pytest.approx(1, abs=1e-5)
        assert x["label"] == max(x["probs"], key=x["probs"].get)
    uri = f"gs://{gcs_bucket}/predictions/out.jsonl"
    evaluation.predict_file(trained, source, uri, progress=False)
    assert storage.download(uri, tmp_path / "copy.jsonl").read_text().splitlines() == \
        (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()


def test_mistakes_give_one_clear_message(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        evaluation.load_trained(str(tmp_path / "no-such-run"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(DataError, match="lacks column"):
        evaluation.read_pairs(bad)
