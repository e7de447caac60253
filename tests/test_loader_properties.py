"""Property: whatever a JSON Lines file holds, `load_nli_splits` loads it or raises the project's own
error (an `NLIError`: one message that says what to fix), never anything else (issue 8).

Files are built from plausible rows with hostile values (unicode, nulls, nesting, numbers, floats
for labels), arbitrary JSON values, random bytes, blank lines, a byte-order mark, and gzip, whole or
cut short. When a file loads, every label is 0/1/2, every premise and hypothesis is non-blank text,
and every object line is either kept or counted in the report.

And the loader's other end: for any lengths, batch size and number of ranks, `LengthGroupedBatches`
gives every row once an epoch, and N ranks together the global batches one process sees.
"""

from __future__ import annotations

import gzip
import itertools
import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nli_helpers.config import LABELS, NLIError
from nli_helpers.data import load_nli_splits
from nli_helpers.step import LengthGroupedBatches

KEYS = ("premise", "hypothesis", "label", "genre", "sentence1", "sentence2", "gold_label")
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
# Mostly text, some of it blank or odd; sometimes any JSON value at all.
texts = st.one_of(st.sampled_from(["a man sleeps", "a dog", "Someone is outside.", " ", "", "\u3000"]),
                  st.text(max_size=20), st.text(alphabet="ab ", min_size=1, max_size=6), json_values)
good_texts = st.one_of(st.sampled_from(["a man sleeps", "a dog barks", "Someone is outside.", " ", ""]),
                       st.text(max_size=20), st.text(alphabet="abc ", min_size=1, max_size=6))
good_labels = st.sampled_from([*LABELS, " Neutral ", "-", "-1", "", "0", "1", "2", "1.0", -1, 0, 1, 2, 0.0, 2.0,
                               -1.0, None])
labels = st.one_of(good_labels, st.sampled_from(["3", "yes", "1.5", 1.5, 3, True]), json_values)
optional_columns = {"genre": json_values | st.sampled_from(["fiction", "letters"]), "extra": json_values}
# Rows a loader should take (text may still be blank, labels may be "unlabelled")...
good_rows = st.fixed_dictionaries({"premise": good_texts, "hypothesis": good_texts, "label": good_labels},
                                  optional=optional_columns)
# ...and rows whose values may be anything.
plausible_rows = st.fixed_dictionaries({"premise": texts, "hypothesis": texts, "label": labels},
                                       optional=optional_columns)
# Raw MultiNLI column names, and objects with arbitrary keys.
renamed_rows = plausible_rows.map(lambda r: {{"premise": "sentence1", "hypothesis": "sentence2",
                                              "label": "gold_label"}.get(k, k): v for k, v in r.items()})
any_rows = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=5)


def dump(value, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


good_lines = st.builds(dump, good_rows, st.booleans())
row_lines = st.builds(dump, plausible_rows | renamed_rows, st.booleans())
hostile_lines = st.one_of(
    st.builds(dump, any_rows | json_values, st.booleans()),
    st.binary(max_size=24).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b"   ", b"{", b'{"premise": "a"', b"[]", b"NaN", b'{"label": 1e999}',
                     b'{"premise": "\\ud800", "hypothesis": "h", "label": 0}', b"\xff\xfe", b"\x00"]),
)


@st.composite
def jsonl_files(draw) -> tuple[bytes, str]:
    """(file bytes, suffix): clean-ish files load often, hostile ones exercise the errors."""
    mode = draw(st.sampled_from(["clean", "one bad line", "chaos"]))
    if mode == "chaos":
        lines = draw(st.lists(st.one_of(good_lines, row_lines, hostile_lines), max_size=30))
    else:
        lines = draw(st.lists(good_lines, min_size=6, max_size=30))
    if mode == "one bad line":  # each hostile line on its own, not hidden behind an earlier one
        lines.insert(draw(st.integers(0, len(lines))), draw(row_lines | hostile_lines))
    body = b"\n".join(lines)
    body += draw(st.sampled_from([b"", b"\n", b"\r\n"]))
    if draw(st.integers(0, 9)) == 0:
        body = b"\xef\xbb\xbf" + body
    if draw(st.integers(0, 4)) != 0:  # one file in five is gzipped, half of those cut short
        return body, ".jsonl"
    packed = gzip.compress(body)
    if draw(st.booleans()):
        packed = packed[: draw(st.integers(0, len(packed)))]
    return packed, ".jsonl.gz"


def object_lines(body: bytes) -> int | None:
    """How many lines hold a JSON value (all objects, when the file loaded); None for a JSON array file."""
    body = body.removeprefix(b"\xef\xbb\xbf")
    if body.lstrip().startswith(b"["):
        return None
    return sum(1 for raw in body.split(b"\n") if raw.decode("utf-8").strip())


_numbers = itertools.count()


def _kind_of(message: str) -> str:
    """The error's kind for hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    for kind in ("not valid JSON", "not an object", "UTF-8", "unknown label", "not text", "Unicode", "lacks column",
                 "no usable rows", "empty part", "is empty", "could not read"):
        if kind in message:
            return kind
    return "other"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(jsonl_files())
def test_any_jsonl_loads_or_raises_the_projects_error(tmp_path, file):
    data, suffix = file
    path = tmp_path / f"{next(_numbers)}{suffix}"
    path.write_bytes(data)
    try:
        splits = load_nli_splits(str(path), eval_fraction=0.5)
    except NLIError as e:
        event(f"{type(e).__name__}: {_kind_of(str(e))}")
        message = str(e)
        assert message and "Traceback" not in message
        message.encode("utf-8")  # the command prints it: it must be encodable whatever the data held
        return
    event("loaded")
    report = splits.report
    for name, ds in splits.items():
        assert set(ds["label"]) <= {0, 1, 2}, name
        for column in ("premise", "hypothesis"):
            assert all(isinstance(t, str) and t.strip() for t in ds[column]), (name, column)
        if "genre" in ds.column_names:
            assert all(isinstance(g, str) for g in ds["genre"])
    kept = sum(len(ds) for ds in splits.values())
    assert kept == sum(report.rows.values()) > 0
    body = gzip.decompress(data) if suffix.endswith(".gz") else data
    expected = object_lines(body)
    if expected is not None:
        accounted = kept + report.dropped_unlabelled + report.dropped_blank + report.dropped_duplicates
        assert accounted == expected, str(report)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 512), min_size=1, max_size=300), st.integers(1, 40), st.integers(1, 4),
       st.booleans(), st.integers(0, 2**31), st.integers(0, 5))
def test_any_lengths_give_every_row_once_and_the_same_global_batches_on_n_ranks(
        lengths, per_rank, ranks, group_by_length, seed, epoch):
    def batches(batch_size, **kwargs):
        sampler = LengthGroupedBatches(lengths, batch_size, seed=seed, group_by_length=group_by_length, **kwargs)
        sampler.set_epoch(epoch)
        return list(sampler), len(sampler)

    one, count = batches(per_rank * ranks)
    assert sorted(i for b in one for i in b) == list(range(len(lengths))) and count == len(one)
    shares = [batches(per_rank, num_replicas=ranks, rank=r) for r in range(ranks)]
    steps = {len(s) for s, _ in shares} | {n for _, n in shares}
    kept = [b for b in one if len(b) >= ranks]  # a last batch too small for every rank is left out
    assert kept in (one, one[:-1]) and steps == {len(kept)}  # every rank steps as often
    together = [sorted(i for part in step for i in part) for step in zip(*(s for s, _ in shares))]
    assert together == [sorted(b) for b in kept]
