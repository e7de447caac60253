import gzip
import json

import numpy as np
import pandas as pd
import pytest

from nli_helpers.batching import LengthGroupedBatchSampler, padding_stats, tokenize_splits
from nli_helpers.data import LABELS, DataError, load_nli_splits, split_by_premise

ROWS = [
    {"premise": f"premise number {i // 3} about {'cats dogs birds'.split()[i % 3]}",
     "hypothesis": f"hypothesis {i}", "label": LABELS[i % 3], "genre": "fiction"}
    for i in range(90)
]


def write(path, rows, kind):
    df = pd.DataFrame(rows)
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "jsonl.gz":
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    elif kind == "csv":
        df.to_csv(path, index=False)
    elif kind == "tsv":
        df.to_csv(path, sep="\t", index=False)
    elif kind == "parquet":
        df.to_parquet(path)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "csv", "tsv", "parquet"])
def test_every_file_format_loads_the_same_pairs(tmp_path, kind):
    splits = load_nli_splits(str(write(tmp_path / f"d.{kind}", ROWS, kind)), eval_fraction=0.3)
    got = pd.concat([splits[s].to_pandas() for s in splits]).sort_values("hypothesis")
    want = pd.DataFrame(ROWS).assign(label=[i % 3 for i in range(90)]).sort_values("hypothesis")
    assert got["label"].tolist() == want["label"].tolist()
    assert got["premise"].tolist() == want["premise"].tolist()


def test_raw_multinli_names_and_int_labels(tmp_path):
    raw = [{"sentence1": r["premise"], "sentence2": r["hypothesis"], "gold_label": r["label"],
            "genre": "travel"} for r in ROWS]
    a = load_nli_splits(str(write(tmp_path / "raw.jsonl", raw, "jsonl")), eval_fraction=0.3)
    ints = [{**r, "label": i % 3} for i, r in enumerate(ROWS)]
    b = load_nli_splits(str(write(tmp_path / "int.csv", ints, "csv")), eval_fraction=0.3)
    assert a["train"]["label"] == b["train"]["label"]
    assert a["train"]["genre"][0] == "travel"


def test_unlabelled_rows_are_dropped_and_counted(tmp_path):
    rows = ROWS + [{**ROWS[0], "label": "-"}, {**ROWS[1], "label": -1}, {**ROWS[2], "label": "-1"}]
    splits = load_nli_splits(str(write(tmp_path / "d.jsonl", rows, "jsonl")), eval_fraction=0.3)
    assert splits.report.dropped_unlabelled == 3
    assert sum(len(s) for s in splits.values()) == 90


@pytest.mark.parametrize("rows, message", [
    ([{**ROWS[0], "label": "maybe"}], "unknown label value(s) 'maybe'"),
    ([{**ROWS[0], "label": 7}], "unknown label value(s) '7'"),
    ([{"premise": "a", "label": "neutral"}], "lacks column(s) hypothesis"),
])
def test_bad_rows_raise_a_clear_error(tmp_path, rows, message):
    with pytest.raises(DataError) as err:
        load_nli_splits(str(write(tmp_path / "d.jsonl", rows, "jsonl")))
    assert message in str(err.value)


def test_missing_empty_and_unsupported_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_nli_splits(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="is empty"):
        load_nli_splits(str(tmp_path / "empty.jsonl"))
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(DataError, match="unsupported file type"):
        load_nli_splits(str(tmp_path / "d.xlsx"))


def test_non_utf8_file_says_so(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("premise,hypothesis,label\ncaf\xe9,b,neutral\n".encode("latin-1"))
    with pytest.raises(DataError, match="UTF-8"):
        load_nli_splits(str(path))


def test_hub_name_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="could not load 'nyu-mll/multi_nli' from the Hugging Face hub"):
        load_nli_splits("nyu-mll/multi_nli")


def test_split_is_by_premise_stable_and_seeded():
    df = pd.DataFrame(ROWS * 4)
    train, held = split_by_premise(df, 0.25, seed=1)
    assert not set(train["premise"]) & set(held["premise"])
    again, _ = split_by_premise(df.sample(frac=1, random_state=0), 0.25, seed=1)
    assert set(again["premise"]) == set(train["premise"])  # row order does not matter
    other, _ = split_by_premise(df, 0.25, seed=2)
    assert set(other["premise"]) != set(train["premise"])


def test_directory_of_split_files(tmp_path):
    write(tmp_path / "train.jsonl", ROWS, "jsonl")
    write(tmp_path / "dev_matched.csv", ROWS[:9], "csv")
    write(tmp_path / "validation_mismatched.parquet", ROWS[9:18], "parquet")
    splits = load_nli_splits(str(tmp_path))
    assert {k: len(v) for k, v in splits.items()} == {"train": 90, "validation_matched": 9,
                                                       "validation_mismatched": 9}
    (tmp_path / "train.jsonl").unlink()
    with pytest.raises(DataError, match="no train"):
        load_nli_splits(str(tmp_path))


def test_bundled_sample_has_three_balanced_splits(sample_splits):
    assert set(sample_splits) == {"train", "validation_matched", "validation_mismatched"}
    assert sample_splits.report.dropped_unlabelled == 4
    assert not set(sample_splits["train"]["premise"]) & set(sample_splits["validation_matched"]["premise"])
    assert set(sample_splits["validation_mismatched"]["genre"]) == {
        "facetoface", "letters", "nineeleven", "oup", "verbatim"}
    counts = np.bincount(sample_splits["train"]["label"])
    assert counts.min() == counts.max()  # three hypotheses per premise, one of each label


def test_fraction_and_caps(sample_splits):
    small = load_nli_splits("sample", fraction_of_train_data=0.5, max_eval_samples=10)
    assert len(small["train"]) == len(sample_splits["train"]) // 2
    assert len(small["validation_matched"]) == 10
    assert len(load_nli_splits("sample", max_train_samples=7)["train"]) == 7


def test_tokenised_once_truncated_never_padded(sample_splits, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenized = tokenize_splits(sample_splits, tok, max_length=32)
    lengths = tokenized["train"]["length"]
    assert max(lengths) == 32 and min(lengths) < 32
    assert [len(x) for x in tokenized["train"]["input_ids"]] == lengths
    assert tok.pad_token_id not in sum(tokenized["train"]["input_ids"], [])


def test_length_grouped_batches_cover_every_example_once_and_pad_less():
    lengths = np.random.default_rng(0).integers(5, 200, size=1000)
    grouped = LengthGroupedBatchSampler(lengths, 32, seed=3, mega_batches=8)
    plain = LengthGroupedBatchSampler(lengths, 32, seed=3, group_by_length=False)
    for sampler in (grouped, plain):
        assert sorted(np.concatenate(sampler.batches()).tolist()) == list(range(1000))
        assert len(list(sampler)) == len(sampler)
    assert padding_stats(lengths, grouped.batches())["pad_fraction"] < \
        padding_stats(lengths, plain.batches())["pad_fraction"] / 3
    first = grouped.batches()
    assert all((a == b).all() for a, b in zip(first, grouped.batches()))  # deterministic
    grouped.set_epoch(1)
    assert not all((a == b).all() for a, b in zip(first, grouped.batches()))  # reshuffled per epoch
    for epoch in (0, 1):  # the longest pair of the epoch comes first: out-of-memory shows at step 1
        grouped.set_epoch(epoch)
        assert lengths[grouped.batches()[0]].max() == lengths.max()


def test_replicas_share_the_single_process_batches():
    lengths = np.random.default_rng(1).integers(5, 100, size=103)
    single = LengthGroupedBatchSampler(lengths, 8, seed=0).batches()
    shards = [LengthGroupedBatchSampler(lengths, 8, seed=0, num_replicas=2, rank=r) for r in (0, 1)]
    a, b = shards[0].batches(), shards[1].batches()
    assert len(a) == len(b) == len(shards[0])
    assert not set(np.concatenate(a)) & set(np.concatenate(b))
    # the global batch of 8, split: two ranks see exactly the examples of one process, step by step
    assert [sorted(x.tolist() + y.tolist()) for x, y in zip(a, b)] == [sorted(s.tolist()) for s in single]
