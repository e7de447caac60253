"""A premise-disjoint split of NLI pairs that no seed moves: a pair is held out when the SHA-256 of its
premise is 0 mod 10, so every seed of a comparison trains and scores on the same pairs (issue 47, item 6).

    python benchmarks/premise_split.py ../shared/data/mnli_dev_matched.jsonl runs/premise-split
    python benchmarks/train_throughput.py --data runs/premise-split --steps 275 --repeats 1 \\
        --runners hf_trainer,nli_helpers --no-pipeline --seed 0      # then --seed 1, --seed 2

It writes train.jsonl and validation_matched.jsonl, the folder of split files `load_nli_splits` reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path


def main(source: str, folder: str) -> dict[str, int]:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "validation_matched": 0}
    with open(out / "train.jsonl", "w") as train, open(out / "validation_matched.jsonl", "w") as held:
        for line in Path(source).read_text(encoding="utf-8").splitlines():
            pair = json.loads(line)
            held_out = int(hashlib.sha256(pair["premise"].encode()).hexdigest(), 16) % 10 == 0
            (held if held_out else train).write(json.dumps(pair) + "\n")
            counts["validation_matched" if held_out else "train"] += 1
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a JSON Lines file of labelled pairs (premise, hypothesis, label)")
    parser.add_argument("folder", help="where train.jsonl and validation_matched.jsonl go")
    args = parser.parse_args()
    print(main(args.source, args.folder))
