"""The data-exploration tables behind notebook 01, on small hand-made splits and the bundled sample."""

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from nli_helpers import explore
from nli_helpers.data import LABELS


def make_splits(with_genre: bool = True) -> DatasetDict:
    train = {"premise": ["The cat sleeps on the mat.", "The cat sleeps on the mat.", "A dog runs.",
                         "A dog runs.", "Rain fell all day.", "Rain fell all day."],
             "hypothesis": ["A cat is asleep.", "The cat didn't sleep.", "An animal moves.",
                            "Nobody runs.", "It was wet.", "Rain fell because of a storm front."],
             "label": [0, 2, 0, 2, 0, 1],
             "genre": ["fiction", "fiction", "travel", "travel", "slate", "slate"]}
    validation = {"premise": ["A dog runs.", "Snow fell."], "hypothesis": ["A dog moves.", "It is hot."],
                  "label": [0, 2], "genre": ["travel", "slate"]}
    mismatched = {"premise": ["Dear sir,"], "hypothesis": ["This is a letter."], "label": [1], "genre": ["letters"]}
    splits = {"train": train, "validation_matched": validation, "validation_mismatched": mismatched}
    if not with_genre:
        splits = {k: {c: v for c, v in d.items() if c != "genre"} for k, d in splits.items() if k != "validation_mismatched"}
    return DatasetDict({k: Dataset.from_dict(v) for k, v in splits.items()})


def test_label_table_counts_every_split():
    table = explore.label_table(make_splits())
    assert list(table.columns) == [*LABELS, "total"]
    assert table.loc["train"].tolist() == [3, 1, 2, 6]
    assert table["total"].tolist() == [6, 2, 1]


def test_genre_table_marks_matched_and_mismatched():
    table = explore.genre_table(make_splits())
    assert table.loc["letters", "set"] == "mismatched" and table.loc["fiction", "set"] == "matched"
    assert table.loc["travel", "train"] == 2 and table.loc["travel", "validation_matched"] == 1
    assert table.loc["letters", "train"] == 0
    assert table["set"].tolist() == sorted(table["set"])  # matched genres first


def test_genre_table_is_empty_without_genres():
    table = explore.genre_table(make_splits(with_genre=False))
    assert table.empty and "set" in table.columns


def test_examples_per_label_picks_each_label():
    ds = make_splits()["train"]
    picked = explore.examples_per_label(ds, per_label=2, seed=0)
    assert picked["label"].value_counts().to_dict() == {"entailment": 2, "contradiction": 2, "neutral": 1}
    assert list(picked.columns) == ["label", "premise", "hypothesis", "genre"]
    assert "genre" not in explore.examples_per_label(make_splits(False)["train"]).columns


def test_premise_overlap_finds_leaked_premises(sample_splits):
    assert explore.premise_overlap(make_splits()) == {"validation_matched": 0.5, "validation_mismatched": 0.0}
    assert all(share == 0 for share in explore.premise_overlap(sample_splits).values())


@pytest.mark.parametrize("text, negated", [
    ("The cat didn't sleep.", True), ("Nobody runs.", True), ("There is NO rain", True),
    ("They can\u2019t swim", True), ("A note was left.", False), ("Nothing happened", True),
    ("Another day", False),
])
def test_negation_words(text, negated):
    assert explore.has_negation(text) is negated


def test_words_split_contractions():
    assert explore.words("It didn't rain, it's dry") == ["it", "did", "n't", "rain", "it's", "dry"]


def test_pair_lengths_count_tokens_before_truncation(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ds = make_splits()["train"]
    lengths = explore.pair_lengths(ds, tok, batch_size=4)
    want = [len(tok(p, h)["input_ids"]) for p, h in zip(ds["premise"], ds["hypothesis"])]
    assert lengths.tolist() == want
    short = min(want)
    assert explore.truncated_fraction(lengths, short) == pytest.approx(np.mean(np.array(want) > short))
    summary = explore.length_summary(lengths, max_length=short)
    assert summary["max"] == max(want) and summary["pairs"] == len(want)


def test_padding_comparison_orders_the_strategies():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 200, size=1000)
    table = explore.padding_comparison(lengths, batch_size=32, max_length=128)
    clipped = np.minimum(lengths, 128)
    assert (table["real_tokens"] == clipped.sum()).all()
    assert table["padded_tokens"].iloc[0] == 1000 * 128  # whole split padded to its (truncated) longest
    assert table["padded_tokens"].is_monotonic_decreasing
    assert table["waste"].iloc[-1] < 0.1 < table["waste"].iloc[1]
    assert table["cost"].tolist() == pytest.approx((table["padded_tokens"] / table["real_tokens"]).tolist())


def test_artefact_table_measures_the_cues():
    table = explore.artefact_table(make_splits()["train"])
    assert table.index.tolist() == list(LABELS)
    assert table.loc["contradiction", "negation"] == 1.0 and table.loc["entailment", "negation"] == 0.0
    assert table.loc["neutral", "hypothesis_words"] == 7
    # "It was wet." shares no word with its premise; "A cat is asleep." shares "cat" (1 of 4 words).
    assert table.loc["entailment", "overlap"] == pytest.approx(np.mean([1 / 4, 0 / 3, 0 / 3]))
    assert table["pairs"].sum() == 6


def test_label_given_negation_is_a_distribution(sample_splits):
    shares = explore.label_given_negation(make_splits()["train"])
    assert shares.to_dict() == {"entailment": 0.0, "neutral": 0.0, "contradiction": 1.0}
    assert explore.label_given_negation(sample_splits["train"]).sum() == pytest.approx(1.0)


def test_indicative_words_ranks_by_p_label():
    ds = Dataset.from_dict({"premise": ["p"] * 8, "hypothesis": ["no way"] * 4 + ["some way"] * 4,
                            "label": [2, 2, 2, 0, 0, 0, 0, 1]})
    table = explore.indicative_words(ds, top=1, min_count=4)
    best = table.set_index("label")
    assert best.loc["contradiction", "word"] == "no" and best.loc["contradiction", "p_label"] == 0.75
    assert best.loc["entailment", "word"] == "some"
    assert explore.indicative_words(ds, min_count=100).empty
