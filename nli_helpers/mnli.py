"""Where real MultiNLI comes from on this machine, so that a fresh clone finds it too.

The smoke profile trains on real MultiNLI pairs: the `dev_matched` pairs whose premise the subset
rule picks (`in_subset`, 2,994 of 9,815). The project never carries MultiNLI's text; it finds it:

1. `../shared/data/mnli_dev_matched.jsonl` beside the checkout (the project's own machines and CI);
2. the Hugging Face hub: one file of `nyu-mll/multi_nli`, its `validation_matched` split (5 MB),
   which huggingface_hub caches, so a machine that reached the hub once has it offline too;
3. neither: `find_dev_matched` raises `NotFound` saying why; the smoke profile then trains on the
   hand-written sample the package ships and says so (`config.make_config`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

SHARED_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnli_dev_matched.jsonl"
# The hub repository's layout since its commit da70db2 ("Convert dataset to Parquet (#5)"): one
# parquet file per split under data/, label a ClassLabel entailment=0, neutral=1, contradiction=2
# (huggingface.co/datasets/nyu-mll/multi_nli, README.md's dataset_info). Pinned to that commit, so
# every machine reads the same bytes and a cached copy answers without a request.
HUB_REPO = "nyu-mll/multi_nli"
HUB_FILE = "data/validation_matched-00000-of-00001.parquet"
HUB_REVISION = "da70db2af9d09693783c3320c4249840212ee221"
SUBSET_SHARE = 0.30
WHAT_TO_DO = ("to train on real MultiNLI, reach the Hugging Face hub once (the split is cached), "
              "or pass --data FILE (data=FILE) / set NLI_REAL_DATA to a MultiNLI file")


class NotFound(Exception):
    """No copy of MultiNLI dev_matched on this machine, and the hub did not answer."""


@dataclass(frozen=True)
class Found:
    path: Path
    origin: str  # one line: where the file came from


def in_subset(premise: str) -> bool:
    """The subset rule (nli_helpers/sample/README.md): a premise, with all its pairs, is in when
    the first 8 bytes of sha1("mnli-subset:" + premise), big-endian, over 2**64 are below 0.30."""
    digest = hashlib.sha1(f"mnli-subset:{premise}".encode()).digest()[:8]
    return int.from_bytes(digest, "big") / 2**64 < SUBSET_SHARE


@functools.cache
def find_dev_matched() -> Found:
    """MultiNLI dev_matched on this machine: ../shared/data, else the hub (cached); else NotFound.
    Asked once per process: a second call returns the first answer."""
    if SHARED_FILE.is_file():
        return Found(SHARED_FILE, "../shared/data/mnli_dev_matched.jsonl beside the checkout")
    try:
        # Lazy: the hub client reads HF_ENDPOINT and HF_HUB_OFFLINE when it is first imported.
        import huggingface_hub as hub

        # Not cached: one quick request first. Offline, the client's own retries take ~20 s.
        where = {"repo_type": "dataset", "revision": HUB_REVISION}
        if not hub.try_to_load_from_cache(HUB_REPO, HUB_FILE, **where):
            hub.get_hf_file_metadata(hub.hf_hub_url(HUB_REPO, HUB_FILE, **where), timeout=5)
        path = hub.hf_hub_download(HUB_REPO, HUB_FILE, **where)
    except Exception as e:  # offline, unreachable, refused: all mean "not on this machine"
        reason = (str(e).strip() or type(e).__name__).split(". ")[0].splitlines()[0][:200]
        raise NotFound(f"no MultiNLI on this machine: no ../shared/data beside the checkout, and "
                       f"the Hugging Face hub's {HUB_REPO} could not be read ({reason})") from e
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return Found(Path(path), f"the Hugging Face hub ({HUB_REPO}, validation_matched, via "
                             f"{endpoint}; cached by huggingface_hub)")
