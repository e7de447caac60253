"""The 4-D attention mask's cost on this machine: MiniLM-L6's forward and backward on padded batches, given the
collated 2-D mask (transformers builds its own mask) or `step.model_inputs`' 4-D one. The same 6 batches of 32 pairs
for both, interleaved and repeated; the medians and their ratio (benchmarks/README.md).

    python benchmarks/mask_cost.py [--repeats 6]
"""

import argparse
import statistics
import time

import torch

from nli_helpers.model import load_model_and_tokenizer
from nli_helpers.step import model_inputs


def padded_batches(n: int = 6, size: int = 32) -> list[dict]:
    batches = []
    for _ in range(n):
        lengths = torch.randint(30, 70, (size,))
        width = int(lengths.max())
        ids = torch.randint(1000, 20000, (size, width))
        mask = (torch.arange(width)[None] < lengths[:, None]).long()
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
                        "labels": torch.randint(0, 3, (size,))})
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer("minilm-l6")
    model.train()
    device = torch.device("cpu")
    batches = padded_batches()

    def timed(kind: str) -> float:
        start = time.perf_counter()
        for batch in batches:
            inputs = model_inputs(batch, device, model) if kind == "4-D" else dict(batch)
            model(**inputs).loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    timed("2-D")
    timed("4-D")  # warm-up
    times: dict[str, list[float]] = {"2-D": [], "4-D": []}
    for repeat in range(args.repeats):
        for kind in ("2-D", "4-D") if repeat % 2 == 0 else ("4-D", "2-D"):
            times[kind].append(timed(kind))
    print(f"{model.config._attn_implementation} attention, fp32, {torch.get_num_threads()} threads, "
          f"{torch.backends.cpu.get_cpu_capability()}")
    for kind, seconds in times.items():
        print(f"{kind} mask: median {statistics.median(seconds):.3f} s, best {min(seconds):.3f} s")
    print(f"4-D / 2-D: {statistics.median(times['4-D']) / statistics.median(times['2-D']):.3f}x")


if __name__ == "__main__":
    main()
