"""The real MultiNLI pairs the package ships (nli_helpers/sample/mnli_dev_matched_subset.jsonl): exactly the pairs
its README's rule picks from dev_matched, with every hypothesis of each premise, loadable offline."""

from __future__ import annotations

import hashlib
import json

from nli_helpers.data import MNLI_SUBSET_PATH, load_nli_splits


def picked(premise: str) -> bool:
    """sample/README.md's rule: sha1("mnli-subset:" + premise), first 8 bytes big-endian / 2**64 < 0.30."""
    return int.from_bytes(hashlib.sha1(f"mnli-subset:{premise}".encode()).digest()[:8], "big") / 2**64 < 0.30


def test_the_shipped_pairs_are_exactly_what_the_rule_picks_from_dev_matched(real_data_path):
    rows = [json.loads(line) for line in real_data_path.read_text().splitlines()]
    expected = [r for r in rows if picked(r["premise"])]
    shipped = [json.loads(line) for line in MNLI_SUBSET_PATH.read_text().splitlines()]
    assert shipped == expected  # same pairs, same order, nothing else
    assert len(shipped) == 2994 and len({r["premise"] for r in shipped}) == 1018


def test_the_subset_loads_offline_split_by_premise():
    splits = load_nli_splits("mnli-subset")
    train, held_out = splits["train"].to_pandas(), splits["validation_matched"].to_pandas()
    assert len(train) + len(held_out) == 2994 and not set(train["premise"]) & set(held_out["premise"])
    assert set(train["label"]) == {0, 1, 2}
    assert splits.report.source == "mnli-subset"
