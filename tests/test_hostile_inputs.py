"""Hostile input (issue 8, item 4): each gets one clear error of the project's own type, or a
documented skip that `LoadReport` counts, and nothing in the job dir that could pass for a result.

What is skipped and counted (see `data.normalise_frame`): unlabelled rows (-1, '-', empty, null),
rows with a null/empty/whitespace premise or hypothesis, exact duplicate (premise, hypothesis,
label) rows. Kept and counted: the same pair under different labels. Everything else is an error.

Checks about the output dir run the real command (`conftest.run_task`); the rest call
`load_nli_splits` / `load_model_and_tokenizer` directly, which is far faster.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from nli_helpers.batching import tokenize_splits
from nli_helpers.config import ConfigError, NLIError
from nli_helpers.data import LABELS, DataError, load_nli_splits
from nli_helpers.model import ModelError, load_model_and_tokenizer
from nli_helpers.storage import StorageError
from tests.helpers import ROOT, run_task

# 20 premises x 3 labels: enough for a premise split with eval_fraction 0.3 to leave both parts non-empty.
ROWS = [{"premise": f"a man walks his dog number {i // 3} in the park",
         "hypothesis": f"someone is outside with an animal {i}", "label": LABELS[i % 3]} for i in range(60)]
LONG_TEXT = "the man walks " * 6667 + "home"  # 20,002 words: 20,002 tokens for the word-piece models


def jsonl(path: Path, rows: list, *, gz: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def load(path: Path, **kw):
    return load_nli_splits(str(path), eval_fraction=0.3, **kw)


def all_rows(splits) -> pd.DataFrame:
    return pd.concat([splits[name].to_pandas() for name in splits], ignore_index=True)


def assert_no_result(job: Path) -> None:
    """Nothing a user, a notebook or `--resume auto` could take for a result: no metrics, weights, checkpoints."""
    if not job.exists():
        return
    names = sorted(p.relative_to(job).as_posix() for p in job.rglob("*") if p.is_file())
    looks_like_result = [n for n in names if n.endswith(("metrics.json", ".safetensors", ".pt", ".bin",
                                                           "manifest.json", "history.jsonl"))]
    assert not looks_like_result, f"a failed run left {looks_like_result} in {job}"


def run_fails(job: Path, message: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command exits 2 with `message` on stderr, no traceback, and leaves no result in `job`."""
    proc = run_task("--profile", "smoke", "--model-name", "tiny-random", "--job-dir", str(job),
                    "--no-progress", *args, env=env)
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert_no_result(job)
    return proc


# -- files that cannot be read ----------------------------------------------------------------------
def test_empty_files(tmp_path):
    (tmp_path / "zero.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        load(tmp_path / "zero.jsonl")
    (tmp_path / "blank-lines.jsonl").write_text("\n  \n\n")
    with pytest.raises(DataError, match="is empty"):
        load(tmp_path / "blank-lines.jsonl")
    (tmp_path / "header.csv").write_text("premise,hypothesis,label\n")
    with pytest.raises(DataError, match="has no usable rows left: of 0 rows"):
        load(tmp_path / "header.csv")


def test_invalid_json_names_the_line(tmp_path):
    lines = [json.dumps(r) for r in ROWS[:4]] + ['{"premise": "a", "hypothesis": "b", "label": 0'] + \
        [json.dumps(r) for r in ROWS[4:]]
    with pytest.raises(DataError, match=r"bad\.jsonl line 5 is not valid JSON \(.* at column \d+\)"):
        load(jsonl(tmp_path / "bad.jsonl", lines))


@pytest.mark.parametrize("line, kind", [("[1, 2, 3]", "array"), ('"a string"', "string"), ("42", "number"),
                                        ("null", "null"), ("true", "boolean")])
def test_json_lines_that_are_not_objects(tmp_path, line, kind):
    path = jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:7]] + [line])
    with pytest.raises(DataError, match=f"line 8 is a JSON {kind}, not an object"):
        load(path)


def test_a_json_array_must_hold_objects(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    assert sum(len(s) for s in load(tmp_path / "d.json").values()) == 60
    (tmp_path / "bad.json").write_text(json.dumps([ROWS[0], [1, 2]]))
    with pytest.raises(DataError, match="must be a JSON array of objects"):
        load(tmp_path / "bad.json")


def test_non_utf8_bytes_name_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes("".join(json.dumps(r) + "\n" for r in ROWS[:9]).encode()
                     + '{"premise": "caf\xe9", "hypothesis": "b", "label": 0}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="line 10 is not valid UTF-8 .*re-encode the file as UTF-8"):
        load(path)
    gz = tmp_path / "latin1.csv.gz"
    gz.write_bytes(gzip.compress("premise,hypothesis,label\ncaf\xe9,b,neutral\n".encode("latin-1")))
    with pytest.raises(DataError, match="UTF-8"):
        load(gz)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert sum(len(s) for s in load(path).values()) == 60


def truncated(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


def test_truncated_parquet(tmp_path):
    pd.DataFrame(ROWS).to_parquet(tmp_path / "full.parquet")
    (tmp_path / "cut.parquet").write_bytes(truncated((tmp_path / "full.parquet").read_bytes()))
    with pytest.raises(DataError, match=r"could not read .*cut\.parquet as parquet: .*Is the file complete\?"):
        load(tmp_path / "cut.parquet")


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.csv.gz"])
def test_truncated_gzip(tmp_path, name):
    text = pd.DataFrame(ROWS).to_csv(index=False) if ".csv" in name else \
        "".join(json.dumps(r) + "\n" for r in ROWS * 20)
    (tmp_path / name).write_bytes(truncated(gzip.compress(text.encode())))
    with pytest.raises(DataError, match=r"could not read .*\(gzip\): .*Is the file complete\?") as err:
        load(tmp_path / name)
    assert not isinstance(err.value.__cause__, DataError)  # the library error is kept as the cause


def test_corrupt_gzip_body(tmp_path):
    data = bytearray(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS * 20).encode()))
    data[len(data) // 2: len(data) // 2 + 16] = b"\x00" * 16
    (tmp_path / "rot.jsonl.gz").write_bytes(bytes(data))
    # zlib.error, a CRC error at the end, or garbage that fails as JSON first: a DataError either way.
    with pytest.raises(DataError, match=r"rot\.jsonl\.gz"):
        load(tmp_path / "rot.jsonl.gz")
    data[10:40] = b"\xff" * 30  # the deflate header itself: zlib.error
    (tmp_path / "rot2.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"could not read .*rot2\.jsonl\.gz"):
        load(tmp_path / "rot2.jsonl.gz")


def test_truncated_plain_jsonl_names_the_cut_line(tmp_path):
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    (tmp_path / "cut.jsonl").write_text(text[: len(text) - 20])
    with pytest.raises(DataError, match="line 60 is not valid JSON"):
        load(tmp_path / "cut.jsonl")


def test_unusable_data_paths(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_nli_splits("runs/a\x00b.jsonl")
    with pytest.raises(DataError, match="not a usable path .*File name too long"):
        load_nli_splits("x" * 5000 + ".jsonl")
    (tmp_path / "x.xlsx").write_text("x")
    with pytest.raises(DataError, match="unsupported file type"):
        load_nli_splits(str(tmp_path / "x.xlsx"))


# -- columns and labels ----------------------------------------------------------------------------
def test_missing_columns_list_what_was_found(tmp_path):
    rows = [{"text_a": r["premise"], "text_b": r["hypothesis"], "label": r["label"]} for r in ROWS]
    with pytest.raises(DataError, match=r"lacks column\(s\) premise, hypothesis \(found: 'text_a', 'text_b', "
                                        r"'label'\); name them premise/hypothesis/label"):
        load(jsonl(tmp_path / "d.jsonl", rows))


def test_unknown_label_strings_name_the_first_line(tmp_path):
    rows = ROWS[:5] + [{**ROWS[5], "label": "Entails"}] + ROWS[6:] + [{**ROWS[0], "label": "yes"}]
    with pytest.raises(DataError, match=r"unknown label value\(s\) 'entails', 'yes' \(first on line 6\); labels "
                                        r"must be entailment/neutral/contradiction or 0/1/2"):
        load(jsonl(tmp_path / "d.jsonl", rows))


@pytest.mark.parametrize("label", [True, 1.5, 3, -2, [1], {"x": 1}, "1.5", "\u0661"])
def test_values_that_are_not_labels(tmp_path, label):
    with pytest.raises(DataError, match=r"unknown label value\(s\)"):
        load(jsonl(tmp_path / "d.jsonl", ROWS + [{**ROWS[0], "hypothesis": "x", "label": label}]))


def test_unlabelled_rows_in_every_spelling_are_dropped_and_counted(tmp_path):
    spellings = [-1, "-1", "-", "", " - ", None, -1.0, "-1.0"]
    rows = ROWS + [{**ROWS[0], "hypothesis": f"unlabelled {i}", "label": v} for i, v in enumerate(spellings)]
    rows.append({"premise": ROWS[0]["premise"], "hypothesis": "no label key at all"})
    splits = load(jsonl(tmp_path / "d.jsonl", rows))
    assert splits.report.dropped_unlabelled == len(spellings) + 1
    assert len(all_rows(splits)) == 60
    assert "dropped 9 unlabelled rows" in str(splits.report)


def test_float_labels_like_1_0(tmp_path):
    as_float = [{**r, "label": float(LABELS.index(r["label"]))} for r in ROWS]
    want = sorted(LABELS.index(r["label"]) for r in ROWS)
    assert sorted(all_rows(load(jsonl(tmp_path / "f.jsonl", as_float)))["label"]) == want
    pd.DataFrame(as_float).to_csv(tmp_path / "f.csv", index=False)  # "1.0" as text
    assert sorted(all_rows(load(tmp_path / "f.csv"))["label"]) == want
    # An integer column with a gap comes back from parquet as floats with NaN: NaN is "unlabelled".
    gappy = pd.DataFrame(as_float + [{**ROWS[0], "hypothesis": "gap", "label": float("nan")}])
    gappy.to_parquet(tmp_path / "f.parquet")
    splits = load(tmp_path / "f.parquet")
    assert sorted(all_rows(splits)["label"]) == want and splits.report.dropped_unlabelled == 1


def test_csv_extra_columns_are_ignored(tmp_path):
    df = pd.DataFrame(ROWS).assign(annotator="x", score=0.5, premise_parse="(S (NP a))")
    df.to_csv(tmp_path / "extra.csv", index=False)
    splits = load(tmp_path / "extra.csv")
    assert set(splits["train"].column_names) == {"premise", "hypothesis", "label"}
    assert len(all_rows(splits)) == 60


def test_numbers_stay_text_in_csv_and_jsonl(tmp_path):
    # pandas would guess a premise "1999" into an integer; the loader keeps text as text.
    rows = [{**r, "premise": str(1000 + i // 3)} for i, r in enumerate(ROWS)]
    pd.DataFrame(rows).to_csv(tmp_path / "n.csv", index=False)
    assert set(all_rows(load(tmp_path / "n.csv"))["premise"]) == {str(1000 + i) for i in range(20)}
    assert set(all_rows(load(jsonl(tmp_path / "n.jsonl", rows)))["premise"]) == {str(1000 + i) for i in range(20)}


@pytest.mark.parametrize("value, kind", [(7, "a number"), ([1, 2], "an array"), ({"a": 1}, "an object"),
                                         (True, "a boolean")])
def test_premise_that_is_not_text_names_the_line(tmp_path, value, kind):
    rows = ROWS[:3] + [{**ROWS[3], "premise": value}] + ROWS[4:]
    with pytest.raises(DataError, match=f"the premise on line 4 is .* \\({kind}\\), not text"):
        load(jsonl(tmp_path / "d.jsonl", rows))


def test_unpaired_surrogate_is_refused(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS] +
                 ['{"premise": "bad \\ud800 text", "hypothesis": "h", "label": 0}'])
    with pytest.raises(DataError, match="hypothesis|premise") as err:
        load(path)
    assert "line 61 is not valid Unicode" in str(err.value)
    str(err.value).encode("utf-8")  # the message itself prints anywhere


def test_genre_of_any_type_becomes_text(tmp_path):
    rows = [{**r, "genre": [None, 3, "fiction", {"a": 1}][i % 4]} for i, r in enumerate(ROWS)]
    genres = set(all_rows(load(jsonl(tmp_path / "d.jsonl", rows)))["genre"])
    assert genres == {"unknown", "3", "fiction", "{'a': 1}"}


# -- rows that are dropped and counted ---------------------------------------------------------------
def test_blank_premise_or_hypothesis_is_dropped_and_counted(tmp_path):
    blanks = [{**ROWS[0], "premise": ""}, {**ROWS[1], "premise": "   \t\n"}, {**ROWS[2], "hypothesis": " "},
              {**ROWS[3], "premise": None}, {"hypothesis": "premise key missing", "label": "neutral"},
              {**ROWS[4], "hypothesis": "\u3000"}]  # an ideographic space is whitespace too
    splits = load(jsonl(tmp_path / "d.jsonl", ROWS + blanks))
    assert splits.report.dropped_blank == len(blanks)
    assert len(all_rows(splits)) == 60
    assert "6 with a blank premise or hypothesis" in str(splits.report)


def test_nan_and_none_premises_in_csv_and_parquet(tmp_path):
    df = pd.DataFrame(ROWS + [{**ROWS[0], "premise": None}, {**ROWS[1], "hypothesis": float("nan")}])
    df.to_parquet(tmp_path / "d.parquet")
    df.to_csv(tmp_path / "d.csv", index=False)  # NaN and None become empty cells
    for name in ("d.parquet", "d.csv"):
        splits = load(tmp_path / name)
        assert splits.report.dropped_blank == 2, name
        assert len(all_rows(splits)) == 60
        assert "nan" not in set(all_rows(splits)["premise"]) | set(all_rows(splits)["hypothesis"])


def test_only_blank_rows_is_an_error(tmp_path):
    rows = [{**r, "premise": " "} for r in ROWS]
    with pytest.raises(DataError, match="no usable rows left: of 60 rows, 0 are unlabelled and 60 have a blank"):
        load(jsonl(tmp_path / "d.jsonl", rows))


def test_exact_duplicates_are_dropped_and_counted(tmp_path):
    # Exact repeats would count twice in training and evaluation; the first copy is kept.
    splits = load(jsonl(tmp_path / "d.jsonl", ROWS + ROWS[:10] + ROWS[:2]))
    assert splits.report.dropped_duplicates == 12
    got = all_rows(splits)
    assert len(got) == 60 and not got.duplicated(["premise", "hypothesis", "label"]).any()
    assert "12 exact duplicates" in str(splits.report)


def test_conflicting_duplicates_are_kept_and_counted(tmp_path):
    # The same pair under two labels is annotator disagreement, not a copy: both rows stay (the
    # benchmark's own splits keep such rows), and the report says how many there are.
    conflict = {**ROWS[0], "label": "contradiction"}
    assert ROWS[0]["label"] != "contradiction"
    splits = load(jsonl(tmp_path / "d.jsonl", ROWS + [conflict]))
    assert splits.report.conflicting_labels == 2 and splits.report.dropped_duplicates == 0
    assert len(all_rows(splits)) == 61
    assert "kept 2 rows whose premise and hypothesis also appear with a different label" in str(splits.report)


def test_directory_files_keep_their_own_line_numbers(tmp_path):
    jsonl(tmp_path / "train.jsonl", ROWS)
    jsonl(tmp_path / "dev_matched.jsonl", ROWS[:2] + ["not json"])
    with pytest.raises(DataError, match=r"dev_matched\.jsonl line 3 is not valid JSON"):
        load_nli_splits(str(tmp_path))


# -- very long texts ---------------------------------------------------------------------------------
def test_20000_token_premise_is_truncated_to_max_length(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tok(LONG_TEXT)["input_ids"]) > 20_000
    rows = ROWS + [{"premise": LONG_TEXT, "hypothesis": "a man walks", "label": "entailment"}]
    splits = load(jsonl(tmp_path / "long.jsonl", rows))
    tokenized = tokenize_splits(splits, tok, max_length=48)
    lengths = {split: tokenized[split]["length"] for split in tokenized}
    long_split = next(s for s in splits if LONG_TEXT in splits[s]["premise"])
    long_row = splits[long_split]["premise"].index(LONG_TEXT)
    assert lengths[long_split][long_row] == 48
    assert len(tokenized[long_split]["input_ids"][long_row]) == 48
    assert max(max(v) for v in lengths.values()) == 48


def test_a_pair_of_huge_texts_does_not_exhaust_memory(tmp_path):
    # The fast tokenizer's pair truncation builds every combination of the two texts' overflow windows
    # (huggingface/tokenizers#2035): two 20,000-token texts took > 6 GB and aborted before the loader cut
    # texts to 32 characters per token of max_length. A memory cap turns a regression into a failure.
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        from datasets import Dataset, DatasetDict
        from transformers import AutoTokenizer
        from nli_helpers.batching import tokenize_splits
        from nli_helpers.model import tiny_random_path
        tok = AutoTokenizer.from_pretrained(tiny_random_path())
        text = {LONG_TEXT!r}
        splits = DatasetDict(train=Dataset.from_dict({{"premise": [text, "a"], "hypothesis": [text, "b"],
                                                      "label": [0, 1]}}))
        print(tokenize_splits(splits, tok, max_length=64)["train"]["length"])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[64, 5]" in proc.stdout


def test_max_length_beyond_the_model_is_a_config_error(sample_splits, tiny_model_dir):
    from transformers import AutoTokenizer

    with pytest.raises(ConfigError, match="max_length=1024 is more than this model takes .512 tokens."):
        tokenize_splits(sample_splits, AutoTokenizer.from_pretrained(tiny_model_dir), max_length=1024)


def test_a_20000_token_premise_trains_through_the_command(tmp_path):
    rows = ROWS + [{"premise": LONG_TEXT, "hypothesis": "a man walks", "label": "entailment"},
                   {"premise": "short", "hypothesis": LONG_TEXT, "label": "neutral"},
                   {"premise": LONG_TEXT + " again", "hypothesis": LONG_TEXT, "label": "contradiction"}]
    data, job = jsonl(tmp_path / "long.jsonl", rows), tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model-name", "tiny-random", "--data", str(data), "--job-dir", str(job),
                    "--epochs", "1", "--batch_size", "16", "--max_length", "64", "--eval_fraction", "0.3",
                    "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["train"]["steps"] >= 1 and metrics["train"]["mean_tokens"] <= 64


# -- the output dir: nothing that could pass for a result -------------------------------------------
@pytest.mark.parametrize("case", ["empty", "truncated-parquet", "truncated-gzip", "invalid-json-line"])
def test_bad_data_through_the_command_writes_nothing(tmp_path, case):
    if case == "empty":
        data, message = tmp_path / "d.jsonl", "is empty"
        data.write_bytes(b"")
    elif case == "truncated-parquet":
        pd.DataFrame(ROWS).to_parquet(tmp_path / "full.parquet")
        data, message = tmp_path / "d.parquet", "as parquet"
        data.write_bytes(truncated((tmp_path / "full.parquet").read_bytes()))
    elif case == "truncated-gzip":
        data, message = tmp_path / "d.jsonl.gz", "(gzip)"
        data.write_bytes(truncated(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS * 20).encode())))
    else:
        data, message = jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:2]] + ["{oops"]), \
            "d.jsonl line 3 is not valid JSON"
    run_fails(tmp_path / "job", message, "--data", str(data))


def test_missing_gcs_object_names_the_uri(gcs_bucket, tmp_path):
    uri = f"gs://{gcs_bucket}/data/nope.jsonl"
    with pytest.raises(StorageError, match=f"{uri} does not exist"):
        load_nli_splits(uri)
    with pytest.raises(StorageError, match=f"gs://{gcs_bucket}/no-such-dir does not exist"):
        load_nli_splits(f"gs://{gcs_bucket}/no-such-dir")
    with pytest.raises(StorageError, match="bucket gs://no-such-bucket-hostile does not exist"):
        load_nli_splits("gs://no-such-bucket-hostile/train.jsonl")
    run_fails(tmp_path / "job", f"{uri} does not exist", "--data", uri)


def test_a_bad_file_on_gcs_is_named_by_its_uri(gcs_bucket, tmp_path):
    from nli_helpers.storage import upload

    uri = f"gs://{gcs_bucket}/data/bad.jsonl"
    upload(jsonl(tmp_path / "bad.jsonl", [json.dumps(ROWS[0]), "[]"]), uri)
    with pytest.raises(DataError, match=f"{uri} line 2 is a JSON array") as err:
        load_nli_splits(uri)
    assert "nli-data-" not in str(err.value)  # not the temporary copy's path


def saved_model(tmp_path: Path, tiny_model_dir: str, name: str) -> Path:
    path = tmp_path / name
    shutil.copytree(tiny_model_dir, path)
    return path


def test_model_dir_without_config_through_the_command(tmp_path, tiny_model_dir):
    model = saved_model(tmp_path, tiny_model_dir, "no-config")
    (model / "config.json").unlink()
    run_fails(tmp_path / "job", "has no config.json", "--model-name", str(model))


def with_label_map(model: Path, label2id: list[str], id2label: list[str]) -> Path:
    """Rewrite a saved model's label maps: `label2id` and `id2label` list the labels by id."""
    config = json.loads((model / "config.json").read_text())
    config["label2id"] = {label: i for i, label in enumerate(label2id)}
    config["id2label"] = {str(i): label for i, label in enumerate(id2label)}
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_mismatched_label_map_through_the_command(tmp_path, tiny_model_dir):
    permuted = ["contradiction", "neutral", "entailment"]
    model = with_label_map(saved_model(tmp_path, tiny_model_dir, "permuted"), permuted, permuted)
    run_fails(tmp_path / "job", "was trained with labels", "--model-name", str(model))


def test_id2label_alone_permuted_is_refused(tmp_path, tiny_model_dir):
    model = with_label_map(saved_model(tmp_path, tiny_model_dir, "id2label"),
                           ["entailment", "neutral", "contradiction"], ["neutral", "entailment", "contradiction"])
    with pytest.raises(ModelError, match="was trained with labels"):
        load_model_and_tokenizer(str(model))


class _WritesAFileWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_weights_are_never_loaded(tmp_path, tiny_model_dir):
    model = saved_model(tmp_path, tiny_model_dir, "pickled")
    (model / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(_WritesAFileWhenUnpickled(marker)))
    with pytest.raises(ModelError, match=r"has no model\.safetensors \(only pytorch_model\.bin: pickle files"):
        load_model_and_tokenizer(str(model))
    assert not marker.exists()
    run_fails(tmp_path / "job", "has no model.safetensors", "--model-name", str(model))
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated-weights", "no-tokenizer", "config-not-json", "custom-code"])
def test_damaged_model_dirs_raise_model_error(tmp_path, tiny_model_dir, damage):
    model = saved_model(tmp_path, tiny_model_dir, damage)
    config = json.loads((model / "config.json").read_text())
    if damage == "truncated-weights":
        (model / "model.safetensors").write_bytes(truncated((model / "model.safetensors").read_bytes()))
        message = "weights or tokenizer are missing or corrupt"
    elif damage == "no-tokenizer":
        for f in model.iterdir():
            if f.name.startswith(("tokenizer", "vocab", "special")):
                f.unlink()
        message = "has no tokenizer files"
    elif damage == "config-not-json":
        (model / "config.json").write_text("{not json")
        message = "has a config.json that transformers cannot use"
    else:
        # transformers would ask on stdin whether to run the directory's code; it must refuse instead.
        config.update(model_type="evil", auto_map={"AutoConfig": "evil.Config"})
        (model / "config.json").write_text(json.dumps(config))
        message = "has a config.json that transformers cannot use"
    with pytest.raises(ModelError, match=message):
        load_model_and_tokenizer(str(model))


def test_job_dir_that_is_a_file(tmp_path):
    job = tmp_path / "job"
    job.write_text("not a directory")
    run_fails(job, "is not writable")
    assert job.read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_job_dir_in_a_read_only_directory(tmp_path):
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        run_fails(parent / "job", "is not writable")
    finally:
        parent.chmod(0o700)


def test_gcs_job_dir_in_a_missing_bucket_fails_before_loading_anything(gcs_emulator, tmp_path):
    proc = run_fails(tmp_path / "unused", "gs://no-such-bucket-for-jobs", "--job-dir",
                     "gs://no-such-bucket-for-jobs/run-1")
    assert "data:" not in proc.stdout, "it loaded the data and model (and trained) before finding out"


def test_max_length_beyond_the_model_through_the_command(tmp_path):
    run_fails(tmp_path / "job", "max_length=1024 is more than this model takes", "--max_length", "1024")


def test_every_error_here_is_the_projects_own_type():
    assert issubclass(DataError, NLIError) and issubclass(ModelError, NLIError)
    assert issubclass(StorageError, NLIError) and issubclass(ConfigError, NLIError)
