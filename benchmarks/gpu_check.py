"""The GPU check: the reference recipe's model shape on the GPU you have, without the Hugging Face hub.

Trains a classifier of roberta-base's shape (12 layers, d=768, 125M parameters), built from its config with random
weights, on real MultiNLI pairs for a few hundred steps of the recipe (global batch 32, lr 2e-5, max_length 128):
`nli_helpers` in bf16 and in fp16, then Hugging Face Trainer at its best on the same steps, each in its own
process, in one run. It writes examples/s, tokens/s, MFU against the GPU's dense bf16/fp16 peak, peak GPU memory
and the loss curves to a JSON file, and prints a table:

    make gpu-check                                                      # = the line below
    python benchmarks/gpu_check.py --out runs/gpu_check.json            # a few minutes on one GPU
    python benchmarks/gpu_check.py --cpu-smoke --out runs/gpu_check.json  # a tiny model, 4 steps: make test's check

Tokens come from the MiniLM WordPiece tokenizer (offline; roberta's BPE gives lengths within a few percent), so no
download is needed; the data is $NLI_REAL_DATA (../shared/data/mnli_dev_matched.jsonl). Random weights learn
little in a few hundred steps: the loss curves show that each path trains and that the paths agree, not accuracy.
On a CPU, fp16 is skipped (it needs a GPU) and MFU is not computed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from train_throughput import DEFAULT_DATA, run_one  # noqa: E402

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA's datasheets, by a substring of the device name.
PEAK_TFLOPS = {"H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "B200": 2250.0,
               "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "V100": 125.0, "T4": 65.0}
ROBERTA_BASE = {"vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072, "max_position_embeddings": 514}
TINY = {"vocab_size": 30522, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 514}


def build_model(shape: dict, out: Path) -> Path:
    """A RobertaForSequenceClassification of `shape`, random weights (seed 0), with the MiniLM tokenizer."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    from nli_helpers.model import ID2LABEL, LABEL2ID, resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    # WordPiece ids (< 30,522) index roberta's embedding table; pad id 0 and two token types match that tokenizer.
    config = RobertaConfig(**shape, type_vocab_size=2, pad_token_id=tokenizer.pad_token_id, num_labels=3,
                           id2label=ID2LABEL, label2id=LABEL2ID)
    torch.manual_seed(0)
    RobertaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def peak_flops(device_name: str) -> float | None:
    return next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in device_name), None)


def model_flops(run: dict, shape: dict) -> float:
    """Training FLOPs of the run's real tokens: 6 x non-embedding parameters per token for the matmuls, plus
    attention (12 x layers x d x T per token, T the mean tokens of a pair), forward and backward."""
    d, layers = shape["hidden_size"], shape["num_hidden_layers"]
    non_embedding = layers * (4 * d * d + 2 * d * shape["intermediate_size"])
    mean_len = run["real_tokens"] / max(1, run["examples"])
    return run["real_tokens"] * (6 * non_embedding + 12 * layers * d * mean_len)


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "name": f"CPU ({os.cpu_count()} cores)", "capability": None}
    major, minor = torch.cuda.get_device_capability(0)
    return {"device": "cuda", "name": torch.cuda.get_device_name(0), "capability": f"{major}.{minor}",
            "cuda": torch.version.cuda, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 300; 4 on --cpu-smoke)")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model for a few steps: the shape of the check")
    parser.add_argument("--data", default=DEFAULT_DATA, help="NLI pairs file ($NLI_REAL_DATA, or 'sample')")
    parser.add_argument("--out", default=None, help="write the JSON results here")
    args = parser.parse_args(argv)
    from nli_helpers.hardware import native_bf16

    info = device_info()
    if info["device"] == "cpu" and not args.cpu_smoke:
        print("error: no CUDA GPU here (roberta-base for 300 steps would take an hour on a CPU); run this on a GPU "
              "machine, or pass --cpu-smoke for the tiny version", file=sys.stderr)
        return 2
    shape = TINY if args.cpu_smoke else ROBERTA_BASE
    steps = args.steps or (4 if args.cpu_smoke else 300)
    import torch

    device = torch.device(info["device"])
    runners = ["nli_helpers@bf16" if native_bf16(device) else "nli_helpers@fp32"]
    skipped = {}
    if info["device"] == "cuda":
        runners.append("nli_helpers@fp16")
    else:
        skipped["nli_helpers@fp16"] = "fp16 needs a CUDA GPU"
    runners.append("hf_trainer")
    peak = peak_flops(info["name"]) if info["device"] == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        model = build_model(shape, Path(tmp) / "model")
        spec = {"model": "roberta-base-shaped", "model_path": str(model), "data": args.data, "steps": steps,
                "batch_size": 8 if args.cpu_smoke else 32, "max_length": 128, "learning_rate": 2e-5,
                "warmup_ratio": 0.06, "weight_decay": 0.1, "seed": 42, "eval_fraction": 0.1, "max_eval_samples": 200,
                "log_every": 1 if args.cpu_smoke else 10, "threads": 0}
        runs = {runner: run_one(runner, spec, Path(tmp), timeout=3600) for runner in runners}
    for run in runs.values():
        run["mfu"] = model_flops(run, shape) / run["loop_s"] / peak if peak else None
    report = {"device": info, "peak_flops": peak, "shape": shape, "config": spec | {"model_path": None},
              "runs": runs, "skipped": skipped}
    print(f"{info['name']}" + (f", compute capability {info['capability']}" if info["capability"] else "")
          + f"; {steps} steps of {spec['batch_size']} pairs, max_length 128")
    print("| runner | precision | examples/s | tokens/s | MFU | peak GPU memory | final loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, run in runs.items():
        mfu = f"{run['mfu']:.1%}" if run["mfu"] else "-"
        memory = f"{run['peak_gpu_memory_gb']:.1f} GB" if run["peak_gpu_memory_gb"] else "-"
        loss = f"{run['loss_curve'][-1][1]:.3f}" if run["loss_curve"] else "-"
        print(f"| {name} | {run['precision']} | {run['examples_per_s']:.1f} | {run['tokens_per_s']:.0f} | {mfu} | "
              f"{memory} | {loss} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | | | | | |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
