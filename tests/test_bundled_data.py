"""The real MultiNLI pairs the package ships (nli_helpers/sample/mnli_dev_matched_subset.jsonl, written by `make`
from ../shared/data, not kept in git): exactly the pairs its README's rule picks from dev_matched, with every
hypothesis of each premise, loadable offline; and one clear error where nobody has written them."""

from __future__ import annotations

import hashlib
import json

import pytest

from nli_helpers import data
from nli_helpers.data import MNLI_SUBSET_PATH, DataError, load_nli_splits, write_mnli_subset


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


def test_write_mnli_subset_keeps_the_source_lines_unchanged(real_data_path, tmp_path):
    out = write_mnli_subset(real_data_path, tmp_path / "subset.jsonl")
    source = set(real_data_path.read_text(encoding="utf-8").splitlines())
    written = out.read_text(encoding="utf-8").splitlines()
    assert len(written) == 2994 and set(written) <= source
    assert [picked(json.loads(line)["premise"]) for line in written] == [True] * 2994
    assert not list(tmp_path.glob(".*"))  # the temporary file was renamed into place


def test_an_unbuilt_subset_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setitem(data.BUNDLED, "mnli-subset", (tmp_path / "missing.jsonl", "bundled MultiNLI subset"))
    with pytest.raises(DataError, match=r"'mnli-subset' is not built here .*make venv.*'sample'"):
        load_nli_splits("mnli-subset")
