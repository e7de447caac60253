"""What the training loader promises: `LengthGroupedBatches` (transformers' length grouping) and
`step.make_train_loader` (transformers' `DataCollatorWithPadding`).

Every row once per epoch; the same order for the same seed and epoch, another for another epoch;
N ranks together see the global batches one rank sees; `set_epoch(e, skip_batches=k)` resumes at
batch k; grouping pads less than a random order; the loader's batches are padded and labelled.
"""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from nli_helpers.config import make_config
from nli_helpers.model import tokenize_splits
from nli_helpers.step import LengthGroupedBatches, make_train_loader
from tests.tiny_model import tiny_model

# Lengths like NLI pairs': mostly 20-60 tokens, a long tail.
LENGTHS = np.random.default_rng(0).lognormal(3.5, 0.5, size=1003).astype(int).clip(5, 512).tolist()


def epoch(lengths=LENGTHS, batch_size=16, *, epoch=0, skip=0, **kwargs) -> list[list[int]]:
    sampler = LengthGroupedBatches(lengths, batch_size, **kwargs)
    sampler.set_epoch(epoch, skip_batches=skip)
    return list(sampler)


@pytest.mark.parametrize("group_by_length", [True, False])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1003])
def test_every_row_once_per_epoch(group_by_length, n):
    sampler = LengthGroupedBatches(LENGTHS[:n], 16, seed=1, group_by_length=group_by_length)
    for e in range(3):
        sampler.set_epoch(e)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(n))
        assert all(len(b) == 16 for b in batches[:-1]) and 0 < len(batches[-1]) <= 16
        assert len(sampler) == len(batches)


@pytest.mark.parametrize("group_by_length", [True, False])
def test_the_order_is_the_seed_and_the_epoch(group_by_length):
    first = epoch(seed=7, epoch=2, group_by_length=group_by_length)
    assert epoch(seed=7, epoch=2, group_by_length=group_by_length) == first
    assert epoch(seed=7, epoch=3, group_by_length=group_by_length) != first
    assert epoch(seed=8, epoch=2, group_by_length=group_by_length) != first
    # The global RNG (dropout's) neither moves the order nor is moved by it.
    torch.manual_seed(123)
    before = torch.get_rng_state()
    assert epoch(seed=7, epoch=2, group_by_length=group_by_length) == first
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("group_by_length", [True, False])
@pytest.mark.parametrize("ranks, n", [(2, 1003), (2, 1024), (3, 1003), (4, 1000), (3, 1010)])
def test_n_ranks_see_the_batches_one_rank_sees(group_by_length, ranks, n):
    per_rank, kwargs = 8, {"seed": 5, "group_by_length": group_by_length}
    for e in (0, 1):
        one = epoch(LENGTHS[:n], per_rank * ranks, epoch=e, **kwargs)
        if len(one[-1]) < ranks:  # too few pairs to give every rank one: all ranks skip it
            one = one[:-1]
        shares = [epoch(LENGTHS[:n], per_rank, epoch=e, num_replicas=ranks, rank=r, **kwargs)
                  for r in range(ranks)]
        assert len({len(s) for s in shares}) == 1  # every rank steps as often
        assert len(shares[0]) == len(LengthGroupedBatches(LENGTHS[:n], per_rank,
                                                          num_replicas=ranks))
        together = [sorted(i for s in step for i in s) for step in zip(*shares)]
        assert together == [sorted(b) for b in one]  # same pairs in the same global steps
        assert all(len(s) <= per_rank for share in shares for s in share)
        for step in zip(*shares):  # no pair on two ranks
            assert len({i for s in step for i in s}) == sum(len(s) for s in step)


@pytest.mark.parametrize("ranks", [1, 2])
def test_set_epoch_skip_batches_resumes_at_that_batch(ranks):
    for rank in range(ranks):
        kwargs = {"seed": 3, "num_replicas": ranks, "rank": rank}
        whole = epoch(epoch=1, **kwargs)
        for k in (0, 1, 17, len(whole) - 1, len(whole)):
            assert epoch(epoch=1, skip=k, **kwargs) == whole[k:]
        sampler = LengthGroupedBatches(LENGTHS, 16, **kwargs)
        sampler.set_epoch(1, skip_batches=5)
        assert len(sampler) == len(whole)  # the loop counts whole epochs with it
        sampler.set_epoch(2)  # the next epoch starts at its beginning again
        assert list(sampler) == epoch(epoch=2, **kwargs)


def padding(batches, lengths=LENGTHS) -> int:
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_grouping_pads_far_less_than_a_random_order():
    grouped = padding(epoch(seed=0, group_by_length=True))
    shuffled = padding(epoch(seed=0, group_by_length=False))
    assert grouped < shuffled / 4, (grouped, shuffled)
    # Still shuffled: not the same batches from epoch to epoch, not sorted by length overall.
    assert epoch(epoch=0)[1:] != epoch(epoch=1)[1:]
    longest = [max(LENGTHS[i] for i in b) for b in epoch()]
    assert longest[0] == max(LENGTHS)  # the longest batch first: an out-of-memory shows at once
    assert longest[1:] != sorted(longest[1:], reverse=True)


@pytest.fixture(scope="module")
def tokenized(sample_splits, tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model())
    splits = tokenize_splits(sample_splits, tokenizer, 64, cache_dir=tmp_path_factory.mktemp("t"))
    return tokenizer, splits["train"]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_loader_yields_padded_labelled_batches(tokenized, workers):
    tokenizer, split = tokenized
    cfg = make_config("smoke", model_name_or_path=tiny_model(), per_device_train_batch_size=24,
                      seed=3, dataloader_num_workers=workers)
    loader = make_train_loader(split, cfg, tokenizer, torch.device("cpu"))
    loader.batch_sampler.set_epoch(0)
    order = list(loader.batch_sampler)
    batches = list(loader)
    assert len(batches) == len(order) == len(loader)
    for batch, rows in zip(batches, order):
        assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
        assert batch["labels"].tolist() == [split[i]["label"] for i in rows]
        width = batch["input_ids"].shape[1]
        assert width == max(split[i]["length"] for i in rows)  # padded to the longest only
        for j, i in enumerate(rows):
            ids, n = split[i]["input_ids"], split[i]["length"]
            assert batch["input_ids"][j, :n].tolist() == ids
            assert batch["attention_mask"][j].tolist() == [1] * n + [0] * (width - n)
            assert (batch["input_ids"][j, n:] == tokenizer.pad_token_id).all()


def test_a_compiled_model_gets_widths_of_a_multiple_of_16(tokenized):
    tokenizer, split = tokenized
    cfg = make_config("smoke", model_name_or_path=tiny_model(), per_device_train_batch_size=8,
                      torch_compile=True)
    widths = {b["input_ids"].shape[1] for b in make_train_loader(split, cfg, tokenizer,
                                                                 torch.device("cpu"))}
    assert widths and all(w % 16 == 0 for w in widths)


def test_two_ranks_loaders_split_each_global_batch(tokenized):
    tokenizer, split = tokenized

    def loader(per_device, **ranks):
        cfg = make_config("smoke", model_name_or_path=tiny_model(),
                          per_device_train_batch_size=per_device)
        return list(make_train_loader(split, cfg, tokenizer, torch.device("cpu"), **ranks))

    one = loader(16)
    shares = [loader(8, num_replicas=2, rank=r) for r in (0, 1)]
    assert len(one) == len(shares[0]) == len(shares[1])
    for whole, *parts in zip(one, *shares):
        assert sorted(whole["labels"].tolist()) == sorted(y for p in parts
                                                          for y in p["labels"].tolist())
        assert whole["attention_mask"].sum() == sum(p["attention_mask"].sum() for p in parts)
