"""One benchmark run in its own process: train one way, count what it did, score it on held-out pairs.

`train_throughput.py` starts this file once per (runner, repeat) so that every runner gets a fresh
interpreter, a fresh allocator and its own peak RSS:

    python benchmarks/throughput_runners.py --spec spec.json --out result.json

The three runners share everything but the training loop: the same model directory and seed (so
the same initial weights, classifier head included), the same premise-disjoint train/held-out
split, the same number of optimizer steps, per_device_train_batch_size (one process: the whole
batch), max_seq_length and learning rate, and the same
instrumentation (a forward pre-hook that counts rows, real tokens and padded tokens of every
training batch) and evaluator (fp32, on the same held-out rows).

- `seed_recipe`: the old recipe's loop. The whole train split tokenised once with `padding=True`
  (so every row is padded to the longest pair of the split, after max_seq_length truncation), a
  shuffled DataLoader over tensors, plain `torch.optim.Adam`, no schedule, no clipping, fp32.
- `hf_trainer`: `transformers.Trainer` at its best here: dynamic padding, group_by_length sampling,
  bf16 autocast where the CPU/GPU has it, linear warmup/decay, no eval or save during training.
- `nli_helpers`: `nli_helpers.train.train` with the smoke profile's defaults (transformers' length
  grouping and `DataCollatorWithPadding`, as Trainer's).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DataCollatorWithPadding, set_seed  # noqa: E402

from nli_helpers.data import load_nli_splits  # noqa: E402
from nli_helpers.model import load_model_and_tokenizer, tokenize_splits  # noqa: E402


class BatchCounter:
    """Counts the timed training forward calls: rows, real (attention-mask) tokens, padded tokens.

    The first `warmup` calls are not counted: timing starts at call `warmup + 1`, after a `cuda.synchronize()` there
    (one sync in the whole run, so the clock starts when the warm-up's kernels have finished, not when they were
    queued). Real tokens are summed on the device and read once at the end: an `int(mask.sum())` per step would be
    a host sync per step that the runner itself does not pay. The hook is hidden from torch.compile (a compiled
    model runs it eagerly, before the compiled forward).
    """

    def __init__(self, model: torch.nn.Module, warmup: int = 0):
        self.rows = self.padded_tokens = self.calls = 0
        self.warmup = warmup
        self._real, self._unmasked = None, 0  # real tokens: a device tensor (masked calls), an int
        self.first_forward: float | None = None
        self.first_forward_cpu = 0.0
        model.register_forward_pre_hook(torch.compiler.disable(self._hook), with_kwargs=True)

    @property
    def real_tokens(self) -> int:
        return self._unmasked + (int(self._real) if self._real is not None else 0)

    def _hook(self, module, args, kwargs):
        if not module.training:
            return None
        self.calls += 1
        if self.calls <= self.warmup:
            return None
        if self.first_forward is None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.first_forward, self.first_forward_cpu = time.perf_counter(), time.process_time()
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += int(ids.shape[0])
        self.padded_tokens += int(ids.numel())
        if mask is None:
            self._unmasked += int(ids.numel())
        else:
            if mask.dim() == 4:  # step.model_inputs' (batch, 1, query, key) mask: one query row says it
                mask = mask[:, 0, 0] if mask.dtype == torch.bool else mask[:, 0, 0] == 0
            self._real = mask.sum() if self._real is None else self._real + mask.sum()
        return None


def device_and_bf16() -> tuple[torch.device, bool]:
    """The device, and whether it computes bf16 natively (not emulated, as on a T4: nli_helpers.distributed)."""
    from nli_helpers.distributed import native_bf16

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, native_bf16(device)


# -- the three runners: each returns the precision it trained in --------------------------------------
def run_seed_recipe(spec: dict, model, tokenizer, splits, device) -> str:
    train = splits["train"]
    enc = tokenizer(list(train["premise"]), list(train["hypothesis"]), padding=True, truncation=True,
                    max_length=spec["max_seq_length"], return_tensors="pt")
    dataset = torch.utils.data.TensorDataset(enc["input_ids"], enc["attention_mask"],
                                             enc.get("token_type_ids", torch.zeros_like(enc["input_ids"])),
                                             torch.tensor(list(train["label"])))
    loader = torch.utils.data.DataLoader(dataset, batch_size=spec["per_device_train_batch_size"], shuffle=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec["learning_rate"])
    model.to(device).train()
    step, running = 0, 0.0
    while step < spec["steps"]:
        for input_ids, attention_mask, token_type_ids, labels in loader:
            out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                        token_type_ids=token_type_ids.to(device), labels=labels.to(device))
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            running += out.loss.item()  # the old recipe logged a running loss every step
            step += 1
            if step >= spec["steps"]:
                break
    return "fp32"


def run_hf_trainer(spec: dict, model, tokenizer, tokenized, device) -> str:
    import tempfile

    from transformers import Trainer, TrainingArguments

    _, bf16 = device_and_bf16()
    cuda = device.type == "cuda"
    bf16 = bf16 and OVERRIDES.get("precision") != "fp16"  # hf_trainer@fp16: its fp16 path on any GPU
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="bench-trainer-"),
        max_steps=spec["steps"], per_device_train_batch_size=spec["per_device_train_batch_size"],
        learning_rate=spec["learning_rate"], weight_decay=spec["weight_decay"],
        warmup_steps=spec["warmup_ratio"], lr_scheduler_type="linear", max_grad_norm=1.0,
        bf16=bf16, fp16=cuda and not bf16, use_cpu=not cuda,
        train_sampling_strategy="group_by_length", length_column_name="length",
        dataloader_num_workers=spec.get("trainer_workers", 2 if cuda else 0),
        dataloader_pin_memory=cuda, dataloader_persistent_workers=cuda,
        eval_strategy="no", save_strategy="no", logging_strategy="steps", logging_steps=spec.get("logging_steps", 20),
        report_to="none", disable_tqdm=True, seed=spec["seed"], data_seed=spec["seed"],
        torch_compile=OVERRIDES.get("compile", False),
    )
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if cuda else None)
    trainer = Trainer(model=model, args=args, train_dataset=tokenized["train"], data_collator=collator,
                      processing_class=tokenizer)
    trainer.train()
    LOSS_CURVE.extend((row["step"], row["loss"]) for row in trainer.state.log_history if "loss" in row)
    return "bf16" if bf16 else ("fp16" if cuda else "fp32")


def run_nli_helpers(spec: dict, model, tokenizer, tokenized, device) -> str:
    from nli_helpers.config import make_config
    from nli_helpers.distributed import resolve_precision
    from nli_helpers.train import train

    # A fraction of an epoch that rounds up to exactly `steps` optimizer steps (compiled: the short last batch is
    # left out, nli_helpers/step.py: --torch_compile).
    batch, every = spec["per_device_train_batch_size"], spec.get("logging_steps", 20)
    n = len(tokenized["train"])
    steps_per_epoch = n // batch if OVERRIDES.get("torch_compile") else -(-n // batch)
    cfg = make_config("smoke", model_name_or_path=spec["model"], data=spec["data"],
                      per_device_train_batch_size=batch, max_seq_length=spec["max_seq_length"],
                      learning_rate=spec["learning_rate"], warmup_ratio=spec["warmup_ratio"],
                      weight_decay=spec["weight_decay"],
                      num_train_epochs=(spec["steps"] - 0.5) / steps_per_epoch, seed=spec["seed"],
                      progress=False, logging_steps=every, **OVERRIDES)
    # Only the train split: held-out scoring is the harness's job, the same for every runner.
    result = train(cfg, model, tokenizer, {"train": tokenized["train"]}, device=device,
                   precision=resolve_precision(cfg.precision, device))
    assert result.metrics["train"]["steps"] == spec["steps"], result.metrics["train"]
    COMPILE.update(result.metrics["train"].get("compile", {}))
    rows = result.history  # the mean of each window, as Trainer logs it
    LOSS_CURVE.extend((rows[i + every - 1]["step"], float(np.mean([r["loss"] for r in rows[i:i + every]])))
                      for i in range(0, len(rows) - every + 1, every))
    return result.metrics["precision"]


RUNNERS = {"seed_recipe": run_seed_recipe, "hf_trainer": run_hf_trainer, "nli_helpers": run_nli_helpers}
OVERRIDES: dict = {}  # TrainConfig fields an ablation changes
LOSS_CURVE: list[tuple[int, float]] = []  # (step, loss) every logging_steps steps, from the runner that ran
COMPILE: dict = {}  # a compiled nli_helpers run's graphs, graph breaks, recompiles and CUDA-graph skips


def apply_variant(runner: str, variant: str) -> None:
    """Ablations for the change log (`--runners nli_helpers,nli_helpers@foreach_adamw`): undo one change."""
    import nli_helpers.step as ns

    for part in filter(None, variant.split("+")):
        if runner == "nli_helpers" and part == "foreach_adamw":
            ns.build_optimizer = _foreach_optimizer
        elif runner in ("nli_helpers", "hf_trainer") and part in ("fp32", "bf16", "fp16"):
            OVERRIDES["precision"] = part
        elif runner == "hf_trainer" and part == "compile":  # Trainer's torch_compile=True (inductor, default mode)
            OVERRIDES["compile"] = True
        elif runner == "nli_helpers" and part == "compile":  # --torch_compile (CUDA graphs on a GPU)
            OVERRIDES["torch_compile"] = True
        elif runner == "nli_helpers" and part == "workers":  # two DataLoader worker processes collate ahead
            OVERRIDES["dataloader_num_workers"] = 2
        elif runner == "nli_helpers" and part == "no_grouping":
            OVERRIDES["group_by_length"] = False
        else:
            raise SystemExit(f"unknown variant {part!r} for runner {runner}")


def _foreach_optimizer(model, cfg, device):
    from nli_helpers.step import decay_groups

    groups = decay_groups(model, cfg.weight_decay)
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, foreach=True)


# -- scoring ---------------------------------------------------------------------------------------
@torch.inference_mode()
def heldout_accuracy(model, tokenizer, dataset, device, batch_size: int = 128) -> float:
    """fp32 accuracy on a tokenised split, batched in length order (padding does not change logits)."""
    model.eval()
    collator = DataCollatorWithPadding(tokenizer)
    inputs = dataset.remove_columns([c for c in dataset.column_names if c in ("genre", "length", "label")])
    order = np.argsort(np.asarray(list(dataset["length"])), kind="stable")
    preds = np.empty(len(dataset), dtype=np.int64)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = {k: v.to(device) for k, v in collator(inputs[idx.tolist()]).items()}
        preds[idx] = model(**batch).logits.float().argmax(-1).cpu().numpy()
    return float((preds == np.asarray(list(dataset["label"]))).mean())


def release_free_memory() -> None:
    """Hand the memory the runner freed back to the system (glibc's malloc_trim) before the scoring, so that the
    scoring's memory does not depend on which runner left which free lists: without it the same scoring code
    raised the whole process's peak by 93-180 MB after `nli_helpers` and by 0 after Trainer, whose processes held
    the same ~1.7 GB (~0.87 GB of it live) when it began (benchmarks/README.md, "Peak RSS and the scoring")."""
    import ctypes
    import gc

    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's; elsewhere the scoring runs as it is
    if trim is not None:
        trim(0)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far: the kernel's ru_maxrss (kB on Linux, bytes on macOS)."""
    import resource
    import sys

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)


def run(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    device, _ = device_and_bf16()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    splits = load_nli_splits(spec["data"], eval_fraction=spec["eval_fraction"], seed=spec["seed"],
                             max_train_samples=spec.get("max_train_samples"), max_eval_samples=spec.get("max_eval_samples"))
    held_out = splits["validation_matched"]
    set_seed(spec["seed"])  # the same classifier-head initialisation for every runner
    model, tokenizer = load_model_and_tokenizer(spec["model_path"])
    tokenized = tokenize_splits({"train": splits["train"], "held_out": held_out}, tokenizer, spec["max_seq_length"])
    counter = BatchCounter(model, warmup=spec.get("warmup_steps", 0))
    set_seed(spec["seed"])
    start = time.perf_counter()
    runner, _, variant = spec["runner"].partition("@")
    apply_variant(runner, variant)
    data = splits if runner == "seed_recipe" else tokenized
    precision = RUNNERS[runner](spec, model, tokenizer, data, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    end, end_cpu = time.perf_counter(), time.process_time()
    loop_s = end - (counter.first_forward or start)
    # CPU seconds of all this process's threads: steadier than wall time on a shared machine (with
    # one thread; with more, threads spinning at barriers while a sibling is descheduled inflate it).
    loop_cpu_s = end_cpu - counter.first_forward_cpu
    train_peak_rss_mb = peak_rss_mb()  # before the held-out scoring below, which is the same for every runner
    release_free_memory()
    accuracy = heldout_accuracy(model.to(device), tokenizer, tokenized["held_out"], device)
    return {
        "runner": spec["runner"], "precision": precision, "device": str(device), "threads": torch.get_num_threads(),
        "steps": spec["steps"], "timed_steps": counter.calls - counter.warmup, "forward_calls": counter.calls,
        "examples": counter.rows,
        "real_tokens": counter.real_tokens, "padded_tokens": counter.padded_tokens,
        "setup_s": (counter.first_forward or start) - start, "loop_s": loop_s, "loop_cpu_s": loop_cpu_s,
        "cpu_ms_per_example": 1000 * loop_cpu_s / counter.rows, "train_call_s": end - start,
        "prepare_s": start - t0,
        "examples_per_s": counter.rows / loop_s, "tokens_per_s": counter.real_tokens / loop_s,
        "padded_fraction": 1 - counter.real_tokens / counter.padded_tokens if counter.padded_tokens else 0.0,
        "train_peak_rss_mb": train_peak_rss_mb, "accuracy": accuracy, "eval_examples": len(held_out), "train_examples": len(splits["train"]),
        "mean_train_tokens": float(np.mean(tokenized["train"]["length"])),
        "loss_curve": LOSS_CURVE, "compile": COMPILE or None, "parameters": sum(p.numel() for p in model.parameters()),
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="JSON file: runner, model_path, data, steps, ...")
    parser.add_argument("--out", required=True, help="where to write this run's JSON result")
    args = parser.parse_args()
    result = run(json.loads(Path(args.spec).read_text()))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
