"""Hostile input (issue 8, item 4): each gets one clear error of the project's own type, or a
documented skip that `LoadReport` counts, and nothing in the job dir that could pass for a result.

What is skipped and counted (see `data.normalise_frame`): unlabelled rows (-1, '-', empty, null),
rows with a null/empty/whitespace premise or hypothesis, exact duplicate (premise, hypothesis,
label) rows. Kept and counted: the same pair under different labels. Everything else is an error.

Checks about the output dir run the real command (`tests.helpers.run_fails`); the rest call
`load_nli_splits` / `load_model_and_tokenizer` directly, which is far faster.

The plain cases live where their code is tested, once: missing, empty, non-UTF-8 and unsupported files,
unknown labels, missing columns and unlabelled rows in test_data.py; bad data through the command and
unwritable job dirs in test_task.py.
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

from nli_helpers.checkpoint import CheckpointError
from nli_helpers.config import LABELS, ConfigError, NLIError
from nli_helpers.data import DataError, load_nli_splits
from nli_helpers.model import ModelError, load_model_and_tokenizer, tokenize_splits
from tests.helpers import ROOT, ROWS, run_fails, run_task, truncated, write_jsonl
from tests.tiny_model import tiny_model

LONG_TEXT = "the man walks " * 6667 + "home"  # 20,002 words: 20,002 tokens for the word-piece models


def load(path: Path, **kw):
    return load_nli_splits(str(path), eval_fraction=0.3, **kw)


def all_rows(splits) -> pd.DataFrame:
    return pd.concat([splits[name].to_pandas() for name in splits], ignore_index=True)


# -- files that cannot be read ----------------------------------------------------------------------
def test_invalid_json_names_the_line(tmp_path):
    lines = [json.dumps(r) for r in ROWS[:4]] + ['{"premise": "a", "hypothesis": "b", "label": 0'] + \
        [json.dumps(r) for r in ROWS[4:]]
    with pytest.raises(DataError, match=r"bad\.jsonl line 5 is not valid JSON \(.* at column \d+\)"):
        load(write_jsonl(tmp_path / "bad.jsonl", lines))


@pytest.mark.parametrize("line, kind", [("[1, 2, 3]", "array"), ('"a string"', "string"), ("42", "number"),
                                        ("null", "null"), ("true", "boolean")])
def test_json_lines_that_are_not_objects(tmp_path, line, kind):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:7]] + [line])
    with pytest.raises(DataError, match=f"line 8 is a JSON {kind}, not an object"):
        load(path)


def test_a_json_array_must_hold_objects(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    assert sum(len(s) for s in load(tmp_path / "d.json").values()) == 60
    (tmp_path / "bad.json").write_text(json.dumps([ROWS[0], [1, 2]]))
    with pytest.raises(DataError, match="must be a JSON array of objects"):
        load(tmp_path / "bad.json")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert sum(len(s) for s in load(path).values()) == 60


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
    with pytest.raises(DataError, match=rf"could not read .*{name.replace('.', '[.]')} as .*Is the file complete\?") \
            as err:
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


# -- columns and labels ----------------------------------------------------------------------------
def test_float_labels_like_1_0(tmp_path):
    as_float = [{**r, "label": float(LABELS.index(r["label"]))} for r in ROWS]
    want = sorted(LABELS.index(r["label"]) for r in ROWS)
    assert sorted(all_rows(load(write_jsonl(tmp_path / "f.jsonl", as_float)))["label"]) == want
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
    from_jsonl = all_rows(load(write_jsonl(tmp_path / "n.jsonl", rows)))
    assert set(from_jsonl["premise"]) == {str(1000 + i) for i in range(20)}


@pytest.mark.parametrize("value, kind", [(7, "a number"), ([1, 2], "an array"), ({"a": 1}, "an object"),
                                         (True, "a boolean")])
def test_premise_that_is_not_text_names_the_line(tmp_path, value, kind):
    rows = ROWS[:3] + [{**ROWS[3], "premise": value}] + ROWS[4:]
    with pytest.raises(DataError, match=f"the premise on line 4 is .* \\({kind}\\), not text"):
        load(write_jsonl(tmp_path / "d.jsonl", rows))


def test_unpaired_surrogate_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS] +
                       ['{"premise": "bad \\ud800 text", "hypothesis": "h", "label": 0}'])
    with pytest.raises(DataError, match="hypothesis|premise") as err:
        load(path)
    assert "line 61 is not valid Unicode" in str(err.value)
    str(err.value).encode("utf-8")  # the message itself prints anywhere


def test_a_surrogate_in_a_file_mixing_both_schemas_is_refused(tmp_path):
    # Found by test_loader_properties.py: comparing the two schemas' columns encoded the surrogate.
    path = write_jsonl(tmp_path / "d.jsonl", ROWS + [{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"},
                                                     '{"premise": "\\ud800", "hypothesis": "h", "label": 0}'])
    with pytest.raises(DataError, match="the premise on line 62 is not valid Unicode"):
        load(path)


def test_genre_of_any_type_becomes_text(tmp_path):
    rows = [{**r, "genre": [None, 3, "fiction", {"a": 1}][i % 4]} for i, r in enumerate(ROWS)]
    genres = set(all_rows(load(write_jsonl(tmp_path / "d.jsonl", rows)))["genre"])
    assert genres == {"unknown", "3", "fiction", "{'a': 1}"}


# -- rows that are dropped and counted ---------------------------------------------------------------
def test_blank_premise_or_hypothesis_is_dropped_and_counted(tmp_path):
    blanks = [{**ROWS[0], "premise": ""}, {**ROWS[1], "premise": "   \t\n"}, {**ROWS[2], "hypothesis": " "},
              {**ROWS[3], "premise": None}, {"hypothesis": "premise key missing", "label": "neutral"},
              {**ROWS[4], "hypothesis": "\u3000"}]  # an ideographic space is whitespace too
    splits = load(write_jsonl(tmp_path / "d.jsonl", ROWS + blanks))
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
        load(write_jsonl(tmp_path / "d.jsonl", rows))


def test_exact_duplicates_are_dropped_and_counted(tmp_path):
    # Exact repeats would count twice in training and evaluation; the first copy is kept.
    splits = load(write_jsonl(tmp_path / "d.jsonl", ROWS + ROWS[:10] + ROWS[:2]))
    assert splits.report.dropped_duplicates == 12
    got = all_rows(splits)
    assert len(got) == 60 and not got.duplicated(["premise", "hypothesis", "label"]).any()
    assert "12 exact duplicates" in str(splits.report)


def test_conflicting_duplicates_are_kept_and_counted(tmp_path):
    # The same pair under two labels is annotator disagreement, not a copy: both rows stay (the
    # benchmark's own splits keep such rows), and the report says how many there are.
    conflict = {**ROWS[0], "label": "contradiction"}
    assert ROWS[0]["label"] != "contradiction"
    splits = load(write_jsonl(tmp_path / "d.jsonl", ROWS + [conflict]))
    assert splits.report.conflicting_labels == 2 and splits.report.dropped_duplicates == 0
    assert len(all_rows(splits)) == 61
    assert "kept 2 rows whose premise and hypothesis also appear with a different label" in str(splits.report)


def test_directory_files_keep_their_own_line_numbers(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "dev_matched.jsonl", ROWS[:2] + ["not json"])
    with pytest.raises(DataError, match=r"dev_matched\.jsonl line 3 is not valid JSON"):
        load_nli_splits(str(tmp_path))


# -- very long texts ---------------------------------------------------------------------------------
def test_20000_token_premise_is_truncated_to_max_length(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tok(LONG_TEXT)["input_ids"]) > 20_000
    rows = ROWS + [{"premise": LONG_TEXT, "hypothesis": "a man walks", "label": "entailment"}]
    splits = load(write_jsonl(tmp_path / "long.jsonl", rows))
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
        from nli_helpers.model import tokenize_splits
        from tests.tiny_model import tiny_model
        tok = AutoTokenizer.from_pretrained(tiny_model())
        text = {LONG_TEXT!r}
        splits = DatasetDict(train=Dataset.from_dict({{"premise": [text, "a"], "hypothesis": [text, "b"],
                                                      "label": [0, 1]}}))
        print(tokenize_splits(splits, tok, max_length=64)["train"]["length"])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[64, 5]" in proc.stdout


def test_max_length_beyond_the_model_is_a_config_error(tiny_model_dir):
    from nli_helpers.model import check_model_fits

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)  # 512 positions, as its tokenizer says
    with pytest.raises(ConfigError, match=r"--max_seq_length 1024 is more than model tiny has positions for "
                                          r"\(512\); use --max_seq_length 512 or less"):
        check_model_fits(model, tokenizer, 1024, "tiny")


def test_a_20000_token_premise_trains_through_the_command(tmp_path):
    rows = ROWS + [{"premise": LONG_TEXT, "hypothesis": "a man walks", "label": "entailment"},
                   {"premise": "short", "hypothesis": LONG_TEXT, "label": "neutral"},
                   {"premise": LONG_TEXT + " again", "hypothesis": LONG_TEXT, "label": "contradiction"}]
    data, job = write_jsonl(tmp_path / "long.jsonl", rows), tmp_path / "job"
    proc = run_task("--profile", "smoke", "--model_name_or_path", tiny_model(), "--data", str(data),
                    "--output_dir", str(job), "--num_train_epochs", "1", "--per_device_train_batch_size", "16",
                    "--max_seq_length", "64", "--eval_fraction", "0.3", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["train"]["steps"] >= 1 and metrics["train"]["mean_tokens"] <= 64


# -- the output dir: nothing that could pass for a result -------------------------------------------
def test_missing_gcs_object_names_the_uri(gcs_bucket, tmp_path):
    uri = f"gs://{gcs_bucket}/data/nope.jsonl"
    with pytest.raises(DataError, match=f"{uri} does not exist"):
        load_nli_splits(uri)
    with pytest.raises(DataError, match=f"gs://{gcs_bucket}/no-such-dir does not exist"):
        load_nli_splits(f"gs://{gcs_bucket}/no-such-dir")
    with pytest.raises(DataError, match="gs://no-such-bucket-hostile/train.jsonl does not exist"):
        load_nli_splits("gs://no-such-bucket-hostile/train.jsonl")
    run_fails(tmp_path / "job", f"{uri} does not exist", "--data", uri)


def test_a_bad_file_on_gcs_is_named_by_its_uri(gcs_bucket, tmp_path):
    from nli_helpers import files

    uri = f"gs://{gcs_bucket}/data/bad.jsonl"
    files.put(write_jsonl(tmp_path / "bad.jsonl", [json.dumps(ROWS[0]), "[]"]), uri)
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
    proc = run_fails(tmp_path / "job", f"could not load model '{model}': the local folder {model} failed",
                     "--model_name_or_path", str(model))
    assert "config.json" in proc.stderr  # what is missing, in the library's words


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
    run_fails(tmp_path / "job", "was trained with labels", "--model_name_or_path", str(model))


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


# Every way a folder can name pickle weights to transformers 5.23, each beside a model.safetensors that is absent or
# not valid: alone; config.json's `transformers_weights` (which transformers loads even with use_safetensors=True);
# a safetensors shard index whose weight_map points at a .bin; a pickle shard index alone.
PICKLE_FOLDERS = {
    "pickle only": ("pytorch_model.bin", None, None),
    "config names it": ("adapter_model.bin", "transformers_weights", None),
    "safetensors index names it": ("pytorch_model.bin", None, "model.safetensors.index.json"),
    "pickle index": ("pytorch_model.bin", None, "pytorch_model.bin.index.json"),
}


@pytest.mark.parametrize("payload", ["runs code", "real weights"])
@pytest.mark.parametrize("shape", sorted(PICKLE_FOLDERS))
def test_pickle_weights_never_load_from_any_folder_shape(tmp_path, tiny_model_dir, shape, payload):
    """A pickle that writes a file when unpickled, and one of the model's own weights (which torch's weights_only
    unpickler would accept): both are refused, and the error names the file."""
    import torch

    weights, config_key, index = PICKLE_FOLDERS[shape]
    model = saved_model(tmp_path, tiny_model_dir, "pickled")
    marker = tmp_path / "code-ran"
    state = load_model_and_tokenizer(str(model))[0].state_dict()
    if payload == "runs code":
        (model / weights).write_bytes(pickle.dumps(_WritesAFileWhenUnpickled(marker)))
    else:
        torch.save(state, model / weights)
    if config_key or index:
        (model / "model.safetensors").write_bytes(b"not a safetensors file")
    else:
        (model / "model.safetensors").unlink()
    if config_key:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, config_key: weights}))
    if index:
        (model / "model.safetensors").unlink()
        (model / index).write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(state, weights)}))
    with pytest.raises(ModelError, match=rf"could not load model .*pickled.*Its pickle weights \({weights}\)"):
        load_model_and_tokenizer(str(model))
    assert not marker.exists()


def test_pickle_weights_are_refused_through_the_command(tmp_path, tiny_model_dir):
    model = saved_model(tmp_path, tiny_model_dir, "pickled")
    (model / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(_WritesAFileWhenUnpickled(marker)))
    run_fails(tmp_path / "job", "pickle weights (pytorch_model.bin)", "--model_name_or_path", str(model))
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated-weights", "no-tokenizer", "config-not-json", "custom-code"])
def test_damaged_model_dirs_raise_model_error(tmp_path, tiny_model_dir, damage):
    model = saved_model(tmp_path, tiny_model_dir, damage)
    config = json.loads((model / "config.json").read_text())
    if damage == "truncated-weights":
        (model / "model.safetensors").write_bytes(truncated((model / "model.safetensors").read_bytes()))
    elif damage == "no-tokenizer":
        for f in model.iterdir():
            if f.name.startswith(("tokenizer", "vocab", "special")):
                f.unlink()
    elif damage == "config-not-json":
        (model / "config.json").write_text("{not json")
    else:
        # transformers would ask on stdin whether to run the directory's code; it must refuse instead.
        config.update(model_type="evil", auto_map={"AutoConfig": "evil.Config"})
        (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=f"could not load model '{model}': the local folder {model} failed: ") as err:
        load_model_and_tokenizer(str(model))
    # Without its files transformers would build a tokenizer of special tokens only: every word [UNK].
    assert damage != "no-tokenizer" or "no tokenizer files" in str(err.value)
    assert "\n" not in str(err.value)  # one line


def test_gcs_job_dir_in_a_missing_bucket_fails_before_loading_anything(gcs_emulator, tmp_path):
    proc = run_fails(tmp_path / "unused", "gs://no-such-bucket-for-jobs/run-1 cannot be written", "--output_dir",
                     "gs://no-such-bucket-for-jobs/run-1")
    assert "train=" not in proc.stdout, "it loaded the data and model (and trained) before finding out"


def test_max_length_beyond_the_model_through_the_command(tmp_path):
    run_fails(tmp_path / "job", "1024 is more than", "--max_seq_length", "1024")


def test_every_error_here_is_the_projects_own_type():
    assert issubclass(DataError, NLIError) and issubclass(ModelError, NLIError)
    assert issubclass(CheckpointError, NLIError) and issubclass(ConfigError, NLIError)


# -- found by tests/test_contract.py's drawn cases, kept here as plain ones ------------------------------------------
@pytest.fixture(scope="module")
def misfit_models(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """A model whose embedding table is smaller than its tokenizer, and one with 12 positions whose tokenizer names
    no limit (as many saved by hand do): each was a raw IndexError / RuntimeError deep in the forward pass."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("misfits")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    small = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    small.resize_token_embeddings(len(tokenizer) - 20)
    small.save_pretrained(out / "small-vocab")
    tokenizer.save_pretrained(out / "small-vocab")
    AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(tiny_model_dir, max_position_embeddings=12)).save_pretrained(out / "few-positions")
    tokenizer.model_max_length = int(1e30)
    tokenizer.save_pretrained(out / "few-positions")
    return {name: str(out / name) for name in ("small-vocab", "few-positions")}


def test_a_tokenizer_larger_than_the_embedding_table_is_one_message(misfit_models, tmp_path):
    from transformers import AutoTokenizer

    tokens = len(AutoTokenizer.from_pretrained(misfit_models["small-vocab"]))
    run_fails(tmp_path / "job", f"its tokenizer has {tokens} tokens but its embedding table only {tokens - 20} rows",
              "--model_name_or_path", misfit_models["small-vocab"], "--data", "sample")


def test_max_length_beyond_the_models_positions_is_one_message_when_the_tokenizer_names_no_limit(misfit_models,
                                                                                                 tmp_path):
    run_fails(tmp_path / "job", "--max_seq_length 64 is more than model", "--model_name_or_path",
              misfit_models["few-positions"], "--data", "sample", "--max_seq_length", "64")


def test_max_length_that_leaves_no_room_for_text_is_refused(tmp_path):
    run_fails(tmp_path / "job", "--max_seq_length 4 leaves no room for text: this tokenizer adds 3 special tokens",
              "--data", "sample", "--max_seq_length", "4")


def test_a_job_dir_whose_name_the_file_system_refuses_is_one_message(tmp_path):
    job = tmp_path / ("x" * 300) / "job"
    proc = run_task("--data", "sample", "--model_name_or_path", tiny_model(), "--output_dir", str(job),
                    "--no-progress")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().endswith("cannot be written (File name too long); pass --output_dir with a folder "
                                        "you can write")


def test_training_pairs_of_a_single_label_are_refused(tmp_path):
    data = write_jsonl(tmp_path / "one.jsonl", [{**row, "label": "neutral"} for row in ROWS])
    with pytest.raises(DataError, match=r"the \d+ training pairs of .*one.jsonl .* have one label"):
        load(data)


def test_a_flag_value_the_command_cannot_parse_is_one_line_not_the_usage(tmp_path):
    proc = run_task("--num_train_epochs", "x", "--output_dir", str(tmp_path / "job"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: argument --num_train_epochs/--num-train-epochs: invalid float value: 'x' (python -m "
        "nli_helpers.task --help lists every option)"]


def test_a_parquet_string_that_is_not_utf8_is_one_data_error(tmp_path):
    """Found by make fuzz: pandas 3 keeps parquet strings in Arrow and checks their UTF-8 only when a value is first
    read as Python text, which was deep in the row checks, as a raw ArrowException."""
    path = tmp_path / "pairs.parquet"
    pd.DataFrame(ROWS).to_parquet(path, compression=None)
    data = path.read_bytes()
    at = data.index(b"a man walks")
    path.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    with pytest.raises(DataError, match=r"could not read .*pairs\.parquet as parquet"):
        load_nli_splits(str(path))
