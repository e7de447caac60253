"""The data pipeline's costs: loading the file, fetching and collating a training batch, and
tokenising the data with the token cache cold and warm.

`train_throughput.py` runs this file once, in its own process, before the training runs:

    python benchmarks/data_pipeline.py --spec spec.json --out result.json

- load: `load_nli_splits` on the file (read by `nli_helpers.files.read_pairs`, normalised, split by premise);
  seconds, the best of a few.
- collate: the package's training batches of the training split (`LengthGroupedBatches`, in the
  order the loop draws them), fetched from the `datasets` split as a DataLoader fetches them and
  padded by transformers' `DataCollatorWithPadding` (`step.collator`, what `step.make_train_loader`
  uses); ms per batch, the best of a few passes over all the batches, and the collator alone on rows
  already fetched.
- tokenise: `tokenize_splits` on the data's splits in an empty cache folder (cold: tokenise and
  write), again (warm: read back), and with the cache off.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from datasets import concatenate_datasets  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from nli_helpers.data import load_nli_splits  # noqa: E402
from nli_helpers.model import tokenize_splits  # noqa: E402
from nli_helpers.step import LengthGroupedBatches, collator, model_columns  # noqa: E402


def best_ms(step, batches: list, passes: int) -> float:
    """Milliseconds per batch of `step` over all `batches`: the fastest of `passes` passes."""
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        for rows in batches:
            step(rows)
        times.append(time.perf_counter() - start)
    return 1000 * min(times) / len(batches)


def collate_timings(split, tokenizer, batch_size: int, passes: int) -> dict:
    """The loader's work per batch: rows fetched from the split, then DataCollatorWithPadding."""
    batches = list(LengthGroupedBatches(split["length"], batch_size, seed=42))
    rows, collate = model_columns(split, tokenizer), collator(tokenizer)

    def fetch_and_collate(batch):  # what the DataLoader over the split does per batch
        return collate(rows.__getitems__(batch))

    fetched = [rows.__getitems__(b) for b in batches]  # the collator alone, rows fetched
    return {
        "batches": len(batches),
        "batch_size": batch_size,
        "passes": passes,
        "ms_per_batch": best_ms(fetch_and_collate, batches, passes),
        "collator_only_ms_per_batch": best_ms(collate, fetched, passes),
    }


def tokenise_timings(splits, tokenizer, max_length: int) -> dict:
    """Seconds for `tokenize_splits`: cold (empty cache), warm (cache hit), and with no cache."""
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as tmp:
        tokenize = functools.partial(tokenize_splits, splits, tokenizer, max_length, cache_dir=tmp)
        seconds = {}
        for run, use_cache in (("cold", True), ("warm", True), ("no_cache", False)):
            start = time.perf_counter()
            out = tokenize(use_cache=use_cache)
            seconds[run] = time.perf_counter() - start
            assert all(out.cache_hits.values()) == (run == "warm"), (run, out.cache_hits)
    return {
        "pairs": sum(len(s) for s in splits.values()),
        "max_seq_length": max_length,
        "cold_s": seconds["cold"],
        "warm_s": seconds["warm"],
        "no_cache_s": seconds["no_cache"],
        "cold_over_warm": seconds["cold"] / seconds["warm"],
    }


def load_timings(spec: dict, passes: int = 3) -> dict:
    """Seconds for `load_nli_splits` on the data: the best of `passes` loads."""
    seconds = []
    for _ in range(passes):
        start = time.perf_counter()
        splits = load_nli_splits(spec["data"], eval_fraction=spec["eval_fraction"],
                                 seed=spec["seed"])
        seconds.append(time.perf_counter() - start)
    return {"pairs": sum(len(s) for s in splits.values()), "passes": passes, "best_s": min(seconds)}


def run(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    load = load_timings(spec)
    splits = load_nli_splits(spec["data"], eval_fraction=spec["eval_fraction"], seed=spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    max_length, scale = spec["max_seq_length"], spec.get("tokenise_scale", 1)
    train = tokenize_splits({"train": splits["train"]}, tokenizer, max_length, use_cache=False)
    collate = collate_timings(train["train"], tokenizer, spec["per_device_train_batch_size"],
                              spec.get("passes", 3))
    if scale > 1:  # the training split repeated: a full-MultiNLI-sized job from a small file
        splits["train"] = concatenate_datasets([splits["train"]] * scale)
    tokenise = tokenise_timings(splits, tokenizer, max_length)
    return {"load": load, "collate": collate, "tokenise": {**tokenise, "scale": scale}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True,
                        help="JSON file: model_path, data, per_device_train_batch_size, max_seq_length, ...")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args()
    result = run(json.loads(Path(args.spec).read_text()))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
