"""Where the smoke profile's real MultiNLI comes from on a machine with nothing beside the checkout: the Hugging Face
hub (here its stand-in, localcloud/hub.py, which serves the repository's real layout through huggingface_hub's real
client), the hub's cache once offline, and, with neither, the hand-written sample with one note saying what to do.

Each case runs in a fresh process, as a user's would: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it is
imported, and `find_dev_matched` answers once per process. `nli_helpers.mnli.SHARED_FILE` is pointed at a missing
file first, which is what a clone with no ../shared beside it sees."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pandas as pd
import pytest

from localcloud.hub import FILE, REPO, HubStandIn
from nli_helpers import mnli
from nli_helpers.config import LABELS
from nli_helpers.data import MNLI_SUBSET, DataError, LoadReport, load_nli_splits, mnli_subset_frame
from tests.helpers import ROOT

NEWCOMER = """
import json, sys
from pathlib import Path
import nli_helpers.mnli
nli_helpers.mnli.SHARED_FILE = Path("/nonexistent/shared/data/mnli_dev_matched.jsonl")
from nli_helpers.config import make_config
from nli_helpers.data import load_nli_splits
cfg = make_config("smoke")
out = {"data": cfg.data, "epochs": cfg.num_train_epochs}
try:
    splits = load_nli_splits(sys.argv[1] if len(sys.argv) > 1 else cfg.data)
    out.update(source=splits.report.source, rows=splits.report.rows,
               premises=sorted(set(splits["train"]["premise"]))[:3])
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
"""


def newcomer(env: dict[str, str], *args: str) -> tuple[dict, str]:
    """make_config("smoke") and its data, loaded in a new process that sees no ../shared."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NLI_REAL_DATA"))}
    proc = subprocess.run([sys.executable, "-c", NEWCOMER, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**base, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), proc.stdout


def test_a_fresh_clone_trains_on_multinli_from_the_hub_then_from_its_cache_offline(real_data_path, tmp_path):
    hub, hub_home = HubStandIn(real_data_path, tmp_path / "hub"), {"HF_HOME": str(tmp_path / "hf-home")}
    try:
        online, said = newcomer({**hub_home, "HF_ENDPOINT": hub.endpoint})
        offline, _ = newcomer({**hub_home, "HF_HUB_OFFLINE": "1"})
    finally:
        hub.close()
    assert online["data"] == MNLI_SUBSET and online["epochs"] == 2, online  # the real-data recipe
    assert "the Hugging Face hub (nyu-mll/multi_nli, validation_matched" in online["source"], online
    assert "data: real MultiNLI from the Hugging Face hub" in said  # the one line naming the source
    # The one pinned file: our quick HEAD (no retries), then huggingface_hub's HEAD and GET, once; offline, the
    # cache answered.
    resolve = f"/datasets/{REPO}/resolve/{mnli.HUB_REVISION}/{FILE}"
    asked = [r for r in hub.requests if r.split()[1].startswith("/datasets/")]  # not its /api/ side calls
    assert asked == [f"HEAD {resolve}", f"HEAD {resolve}", f"GET {resolve}"], hub.requests
    assert offline["data"] == MNLI_SUBSET and offline["rows"] == online["rows"], offline
    # The hub's copy gives exactly the pairs ../shared/data gives: the same rule, the same split.
    here = load_nli_splits(MNLI_SUBSET)
    assert online["rows"] == {name: len(ds) for name, ds in here.items()} == {"train": 2683, "validation_matched": 311}
    assert online["premises"] == sorted(set(here["train"]["premise"]))[:3]


def test_offline_with_nothing_cached_the_sample_trains_and_says_what_to_do(tmp_path):
    result, said = newcomer({"HF_HOME": str(tmp_path / "empty-hf-home"), "HF_HUB_OFFLINE": "1"})
    assert result["data"] == "sample" and result["epochs"] == 6, result  # the sample's own recipe
    assert result["rows"]["train"] > 200 and "error" not in result, result
    notes = [line for line in said.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, said  # why, and what to do: once, not per call
    assert "no ../shared/data" in notes[0] and "hand-written pairs" in notes[1] and "--data FILE" in notes[1]
    # Asked for by name, the subset fails with one error saying what to do instead.
    named, _ = newcomer({"HF_HOME": str(tmp_path / "empty-hf-home"), "HF_HUB_OFFLINE": "1"}, MNLI_SUBSET)
    assert named["error"].startswith("DataError: --data mnli-subset: no MultiNLI on this machine"), named
    assert "reach the Hugging Face hub once" in named["error"] and "--data sample" in named["error"]


def test_a_hub_that_fails_is_asked_once_then_the_sample_trains(tmp_path):
    """A hub that answers 503 (or cannot be reached) is asked once: huggingface_hub's own retries, five with
    back-off, took about 20 s and printed a line each before the fallback note in every notebook."""
    asked = []

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(self.path)
            self.send_response(503)
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result, said = newcomer({"HF_HOME": str(tmp_path / "empty-hf-home"),
                                 "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    files = [path for path in asked if path.startswith("/datasets/")]  # not huggingface_hub's /api/ side calls
    assert result["data"] == "sample" and len(files) == 1, asked
    assert "503" in said and "Retrying" not in said, said


def test_the_stand_in_refuses_what_the_hub_would(real_data_path, tmp_path):
    from huggingface_hub import constants

    with HubStandIn(real_data_path, tmp_path / "hub") as endpoint:
        import urllib.error
        import urllib.request

        for path, code in ((f"/datasets/{REPO}/resolve/main/data/train-00000-of-00001.parquet", "EntryNotFound"),
                           (f"/datasets/{REPO}/resolve/not-a-branch/{FILE}", "RevisionNotFound"),
                           (f"/datasets/someone/else/resolve/main/{FILE}", "RepoNotFound")):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(endpoint + path, method="HEAD"))
            assert err.value.code == 404 and err.value.headers["X-Error-Code"] == code
        head = urllib.request.urlopen(urllib.request.Request(f"{endpoint}/datasets/{REPO}/resolve/main/{FILE}",
                                                             method="HEAD"))
        assert head.headers["X-Repo-Commit"] == mnli.HUB_REVISION and head.headers["ETag"].startswith('"')
    assert constants.HF_HUB_OFFLINE  # this process stays offline: conftest.py sets it


def test_the_served_file_has_the_hub_repositorys_columns_and_labels(real_data_path, tmp_path):
    from datasets import load_dataset

    HubStandIn(real_data_path, tmp_path / "hub").close()
    served = load_dataset("parquet", data_files=str(tmp_path / "hub" / FILE), split="train")
    assert list(served.features) == ["promptID", "pairID", "premise", "premise_binary_parse", "premise_parse",
                                     "hypothesis", "hypothesis_binary_parse", "hypothesis_parse", "genre", "label"]
    assert served.features["label"].names == ["entailment", "neutral", "contradiction"]
    assert served.num_rows == 9815  # the hub's validation_matched num_examples


def test_a_jobs_copy_of_the_subset_loads_to_the_same_splits(mnli_subset, tmp_path):
    # What vertex.stage_data uploads for a job: the subset's pairs as JSON Lines, labels by name.
    frame = mnli_subset_frame(LoadReport(MNLI_SUBSET))
    written = tmp_path / "mnli-subset.jsonl"
    frame.assign(label=[LABELS[i] for i in frame["label"]]).to_json(written, orient="records", lines=True,
                                                                    force_ascii=False)
    rows = pd.read_json(written, lines=True)
    assert len(rows) == 2994 and rows["premise"].nunique() == 1018
    assert rows["premise"].map(mnli.in_subset).all() and set(rows["label"]) == {"entailment", "neutral",
                                                                                "contradiction"}
    again = load_nli_splits(str(written))
    for name in ("train", "validation_matched"):
        assert again[name].to_pandas().equals(mnli_subset[name].to_pandas()), name


def test_the_subset_rule_is_the_documented_one():
    # nli_helpers/sample/README.md: sha1("mnli-subset:" + premise), first 8 bytes big-endian / 2**64 < 0.30.
    import hashlib

    for premise in ("A man plays a guitar.", "The new rights are nice enough", "", "é" * 30):
        value = int.from_bytes(hashlib.sha1(f"mnli-subset:{premise}".encode()).digest()[:8], "big") / 2**64
        assert mnli.in_subset(premise) == (value < 0.30)


def test_an_unreadable_hub_is_one_data_error(monkeypatch):
    monkeypatch.setattr(mnli, "find_dev_matched", lambda: (_ for _ in ()).throw(mnli.NotFound("no MultiNLI here")))
    with pytest.raises(DataError, match="--data mnli-subset: no MultiNLI here; to train on real MultiNLI"):
        load_nli_splits(MNLI_SUBSET)
