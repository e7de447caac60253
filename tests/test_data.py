import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest

from nli_helpers.config import LABELS
from nli_helpers.data import (
    DataError,
    LoadReport,
    load_nli_splits,
    normalise_frame,
    split_by_premise,
)
from nli_helpers.files import read_pairs
from nli_helpers.model import tokenize_splits
from tests.tiny_model import tiny_model

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


def test_unlabelled_rows_in_every_spelling_are_dropped_and_counted(tmp_path):
    # Each unlabelled row repeats a labelled pair: it is still dropped as unlabelled, not kept as a conflict.
    spellings = [-1, "-1", "-", "", " - ", None, -1.0, "-1.0"]
    rows = ROWS + [{**ROWS[i], "label": v} for i, v in enumerate(spellings)]
    rows.append({"premise": ROWS[0]["premise"], "hypothesis": "no label key at all"})
    splits = load_nli_splits(str(write(tmp_path / "d.jsonl", rows, "jsonl")), eval_fraction=0.3)
    assert splits.report.dropped_unlabelled == len(spellings) + 1
    assert splits.report.conflicting_labels == 0
    assert sum(len(s) for s in splits.values()) == 90
    assert "dropped 9 unlabelled rows" in str(splits.report)


@pytest.mark.parametrize("rows, message", [
    pytest.param(ROWS[:5] + [{**ROWS[5], "label": "Entails"}] + ROWS[6:] + [{**ROWS[0], "label": "yes"}],
                 "has unknown label value(s) 'entails', 'yes' (first on line 6); labels must be "
                 "entailment/neutral/contradiction or 0/1/2", id="unknown-strings-name-the-first-line"),
    pytest.param([{**ROWS[0], "label": "maybe"}], "unknown label value(s) 'maybe'", id="maybe"),
    pytest.param([{**ROWS[0], "label": 7}], "unknown label value(s) 7 (first on line 1)", id="7"),
    *[pytest.param(ROWS + [{**ROWS[0], "hypothesis": "x", "label": label}], "unknown label value(s)",
                   id=f"not-a-label-{label!r}")
      for label in [True, 1.5, 3, -2, [1], {"x": 1}, "1.5", "\u0661"]],
    pytest.param([{"premise": "a", "label": "neutral"}], "lacks column(s) hypothesis", id="no-hypothesis"),
    pytest.param([{"text_a": r["premise"], "text_b": r["hypothesis"], "label": r["label"]} for r in ROWS],
                 "lacks column(s) premise, hypothesis (found: 'text_a', 'text_b', 'label'); "
                 "name them premise/hypothesis/label", id="other-column-names-are-listed"),
])
def test_bad_rows_raise_a_clear_error(tmp_path, rows, message):
    with pytest.raises(DataError) as err:
        load_nli_splits(str(write(tmp_path / "d.jsonl", rows, "jsonl")), eval_fraction=0.3)
    assert message in str(err.value)


@pytest.mark.parametrize("name, content, message", [
    ("nope.jsonl", None, r"data file .*nope\.jsonl does not exist; pass --data with an existing file"),
    ("no-such-folder", None, r"data file .*no-such-folder does not exist"),
    ("a\x00b.jsonl", None, r"is not a usable path \(embedded null byte\)"),
    ("x" * 5000 + ".jsonl", None, r"x\.\.\.' is not a usable path \(File name too long\)"),
    ("empty.jsonl", b"", "is empty"),
    ("blank-lines.jsonl", b"\n  \n\n", "is empty"),
    ("header.csv", b"premise,hypothesis,label\n", r"header\.csv is empty \(no rows\)"),
    ("d.xlsx", b"x", "unsupported file type"),
], ids=["missing", "missing-folder", "nul-byte", "name-too-long", "empty", "blank-lines", "header-only-csv", "xlsx"])
def test_missing_empty_and_unsupported_files(tmp_path, name, content, message):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_nli_splits(str(tmp_path / name), eval_fraction=0.3)


LATIN1_CSV = "premise,hypothesis,label\ncaf\xe9,b,neutral\n".encode("latin-1")


@pytest.mark.parametrize("name, data, message", [
    ("latin1.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS[:9]).encode()
     + '{"premise": "caf\xe9", "hypothesis": "b", "label": 0}\n'.encode("latin-1"),
     r"latin1\.jsonl line 10 is not valid UTF-8 .*re-encode it as UTF-8"),
    ("latin1.csv", LATIN1_CSV, r"latin1\.csv is not valid UTF-8 .*re-encode it as UTF-8"),
    ("latin1.csv.gz", gzip.compress(LATIN1_CSV, mtime=0), r"latin1\.csv\.gz is not valid UTF-8"),
], ids=["jsonl-names-the-line", "csv", "csv.gz"])
def test_non_utf8_file_says_so(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=message):
        load_nli_splits(str(tmp_path / name), eval_fraction=0.3)


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


def test_a_directory_without_validation_holds_out_train_by_premise(tmp_path):
    write(tmp_path / "train.jsonl", ROWS, "jsonl")
    splits = load_nli_splits(str(tmp_path), eval_fraction=0.3)
    assert not set(splits["train"]["premise"]) & set(splits["validation_matched"]["premise"])
    write(tmp_path / "train.jsonl", ROWS[:3], "jsonl")  # one premise: nothing left to hold out
    with pytest.raises(DataError, match=rf"splitting {tmp_path} by premise .* left an empty part"):
        load_nli_splits(str(tmp_path), eval_fraction=0.3)


def test_bundled_sample_has_three_balanced_splits(sample_splits):
    assert set(sample_splits) == {"train", "validation_matched", "validation_mismatched"}
    assert sample_splits.report.dropped_unlabelled == 4
    assert not set(sample_splits["train"]["premise"]) & set(sample_splits["validation_matched"]["premise"])
    assert set(sample_splits["validation_mismatched"]["genre"]) == {
        "facetoface", "letters", "nineeleven", "oup", "verbatim"}
    counts = np.bincount(sample_splits["train"]["label"])
    assert counts.min() == counts.max()  # three hypotheses per premise, one of each label


def test_caps(sample_splits):
    small = load_nli_splits("sample", max_eval_samples=10)
    assert len(small["train"]) == len(sample_splits["train"])
    assert len(small["validation_matched"]) == 10
    assert len(load_nli_splits("sample", max_train_samples=7)["train"]) == 7


def test_tokenised_once_truncated_never_padded(sample_splits):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model())
    tokenized = tokenize_splits(sample_splits, tok, max_length=32)
    lengths = tokenized["train"]["length"]
    assert max(lengths) == 32 and min(lengths) < 32
    assert [len(x) for x in tokenized["train"]["input_ids"]] == lengths
    assert tok.pad_token_id not in sum(tokenized["train"]["input_ids"], [])


# -- ambiguous inputs: one rule each, never a silent choice ------------------------------------------------------
@pytest.mark.parametrize("writer", ["pandas", "csv"])
def test_a_tsv_in_standard_quoting_reads_its_quotes_tabs_and_newlines(tmp_path, writer):
    """pandas' and csv's default quoting wraps a field holding a quote, a tab or a newline, and doubles its quotes."""
    import csv

    premises = ['A man said "hi", then left.', "Line one\nline two", "a\ttab", '"Quoted" whole', "plain"]
    frame = pd.DataFrame({"premise": premises, "hypothesis": ["one", "two", "three", "four", "five"],
                          "label": ["entailment", "neutral", "contradiction", "neutral", "entailment"]})
    path = tmp_path / "pairs.tsv"
    if writer == "pandas":
        frame.to_csv(path, sep="\t", index=False)
    else:
        with open(path, "w", newline="") as f:
            csv.writer(f, delimiter="\t").writerows([list(frame.columns), *frame.values.tolist()])
    assert read_pairs(str(path))["premise"].tolist() == premises
    assert len(load_nli_splits(str(path), eval_fraction=0.5)["train"]) > 0


def test_a_tsv_cut_short_names_its_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("premise\thypothesis\tlabel\na\tb\tneutral\nc\td")  # a download cut short
    with pytest.raises(DataError, match=r"pairs\.tsv line 3 has 2 fields where the header has 3"):
        load_nli_splits(str(path))


def test_a_raw_multinli_tsv_with_unbalanced_quotes_is_read_literally(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text('sentence1\tsentence2\tgold_label\n"Hello," he said.\tHe spoke.\tentailment\n'
                    'x "y\tz\tneutral\n')
    df = read_pairs(str(path))
    assert df["sentence1"].tolist() == ['"Hello," he said.', 'x "y']
    raw = tmp_path / "multinli_1.0_dev_matched.txt"  # the name MultiNLI's own zip gives it
    raw.write_bytes(path.read_bytes())
    assert read_pairs(str(raw))["sentence1"].tolist() == ['"Hello," he said.', 'x "y']


@pytest.mark.parametrize("names", [("train.csv", "train.jsonl"), ("train.backup.jsonl", "train.jsonl"),
                                   ("dev_matched.jsonl", "validation_matched.jsonl")])
def test_a_directory_with_several_files_for_one_split_names_them_instead_of_picking_one(tmp_path, names):
    row = '{"premise": "a b", "hypothesis": "b", "label": "entailment"}\n'
    (tmp_path / "train.jsonl").write_text(row * 4)
    for name in names:
        (tmp_path / name).write_text("premise,hypothesis,label\na b,b,entailment\n" if name.endswith(".csv")
                                     else row * 4)
    with pytest.raises(DataError, match="several files for one split") as err:
        load_nli_splits(str(tmp_path))
    assert all(name in str(err.value) for name in names)


def test_a_file_mixing_both_schemas_keeps_every_row_and_prefers_premise_on_a_row_with_both(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"premise": "a b", "hypothesis": "b", "label": "entailment"}\n'
                    '{"sentence1": "c d", "sentence2": "d", "gold_label": "neutral"}\n')
    df = normalise_frame(read_pairs(str(path)), "mixed", LoadReport("mixed"))
    assert df[["premise", "label"]].values.tolist() == [["a b", 0], ["c d", 1]]
    # The one rule (data.check_columns): premise/hypothesis/label where present, else the raw names.
    path.write_text('{"premise": "a b", "sentence1": "other", "hypothesis": "b", "label": "entailment"}\n')
    assert normalise_frame(read_pairs(str(path)), "mixed", LoadReport("mixed"))["premise"].tolist() == ["a b"]


def test_a_named_pipe_is_named_as_such_not_reported_missing(tmp_path):
    pipe = tmp_path / "pairs.jsonl"
    os.mkfifo(pipe)  # reading it would wait for a writer that never comes
    with pytest.raises(DataError, match=r"pairs\.jsonl is not a regular file \(a pipe"):
        load_nli_splits(str(pipe))
