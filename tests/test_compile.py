"""`--torch_compile` on this CPU: the same run as eager within float tolerance, two graphs in all (no graph break, no
recompile after the first epoch, whatever the width, the mask or the epoch boundary), evaluation and the saved model
untouched. On a GPU the same flag adds CUDA graphs (benchmarks/README.md)."""

from __future__ import annotations

import pytest
import torch

from nli_helpers import step, train
from nli_helpers.config import make_config
from nli_helpers.data import load_nli_splits
from nli_helpers.model import load_model_and_tokenizer, tokenize_splits
from nli_helpers.step import LengthGroupedBatches, counters
from nli_helpers.tracking import TrainCallback


class GraphsPerEpoch(TrainCallback):
    """The number of graphs dynamo has compiled so far, at each epoch's evaluation."""

    def __init__(self):
        self.seen: list[int] = []

    def on_evaluate(self, step, epoch, scores):
        self.seen.append(counters()["graphs"])


def run(tiny_model_dir, compile: bool, max_length: int, callbacks=(), per_device_train_batch_size=8, device="cpu",
        gradient_accumulation_steps=1):
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = make_config("smoke", model_name_or_path=tiny_model_dir, num_train_epochs=3,
                      per_device_train_batch_size=per_device_train_batch_size,
                      max_train_samples=60, max_eval_samples=16, logging_steps=1, progress=False,
                      save_total_limit=0, precision="fp32", torch_compile=compile,
                      gradient_accumulation_steps=gradient_accumulation_steps)
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    tokenized = tokenize_splits(load_nli_splits("sample", max_train_samples=60, max_eval_samples=16), tokenizer,
                                 max_length)
    result = train.train(cfg, model, tokenizer, tokenized, device=torch.device(device), precision="fp32",
                         callbacks=callbacks)
    result.tokenized_train = tokenized["train"]
    return result


def test_a_compiled_run_trains_as_the_eager_one_and_compiles_two_graphs_in_all(tiny_model_dir, monkeypatch):
    # At 80 tokens the sample's pairs pad to widths 64 and 80, and a batch of pairs all cut at 80 has no padding:
    # it still goes with its mask. 60 pairs in batches of 8 leave a short last batch of 4 that the compiled run
    # leaves out; the eager run here leaves it out too, so both see the same batches.
    graphs = GraphsPerEpoch()
    compiled = run(tiny_model_dir, compile=True, max_length=80, callbacks=[graphs])
    monkeypatch.setattr(step, "LengthGroupedBatches",
                        lambda *args, **kwargs: LengthGroupedBatches(*args, **{**kwargs, "drop_last": True}))
    eager = run(tiny_model_dir, compile=False, max_length=80)
    losses = [row["loss"] for row in compiled.history]
    assert len(losses) == 3 * 7 and losses == pytest.approx([row["loss"] for row in eager.history], rel=1e-3,
                                                                abs=1e-4)
    # The first width compiles a static graph, the second a dynamic one that serves every later width and epoch.
    assert graphs.seen == [2, 2, 2], graphs.seen
    assert compiled.metrics["train"]["compile"] == {"graphs": 2, "graph_breaks": 0, "recompiles": 1,
                                                    "cudagraph_skips": 0, "cudagraph_rerecords": 0,
                                                    "dropped_per_epoch": 4}
    assert "compile" not in eager.metrics["train"]
    # Evaluation runs the eager model underneath: the same predictions from the same weights.
    assert compiled.metrics["validation_matched"]["confusion_matrix"] == \
        eager.metrics["validation_matched"]["confusion_matrix"]
    assert not any(key.startswith("_orig_mod") for key in compiled.model.state_dict())


def test_one_width_with_and_without_padding_is_one_graph_from_the_first_step(tiny_model_dir):
    # At 32 tokens every batch is 32 wide: a pair of pairs both cut at 32 has no padding, the others have some.
    # The mask goes with both, and `problem_type` is set before the first step, so nothing compiles twice.
    result = run(tiny_model_dir, compile=True, max_length=32, per_device_train_batch_size=2)
    loader = step.make_train_loader(result.tokenized_train, result.config, result.tokenizer, torch.device("cpu"))
    assert {bool(batch["attention_mask"].all()) for batch in loader} == {True, False}
    assert result.metrics["train"]["compile"] == {"graphs": 1, "graph_breaks": 0, "recompiles": 0,
                                                  "cudagraph_skips": 0, "cudagraph_rerecords": 0,
                                                  "dropped_per_epoch": 0}


def test_with_accumulation_a_compiled_step_keeps_its_gradients_in_the_same_buffers(tiny_model_dir, monkeypatch):
    """CUDA graphs replay into their own memory pool: a .grad made inside one would be overwritten by the next replay,
    so gradients summed over micro-batches need buffers made before the first step and zeroed in place. On this CPU
    the same buffers are checked: every optimizer step sees the gradients where the first one did."""
    seen = []

    def spy(model, *args, **kwargs):
        seen.append({name: (p.grad, p.grad.data_ptr()) for name, p in model.named_parameters()})
        return original(model, *args, **kwargs)

    original = step.optimizer_step
    monkeypatch.setattr(step, "optimizer_step", spy)
    result = run(tiny_model_dir, compile=True, max_length=80, gradient_accumulation_steps=2)
    assert len(seen) == result.metrics["train"]["steps"] > 6
    # The same tensors at the same addresses (held here, so a freed one's address could not come back).
    assert all(grads[name][0] is grad and grads[name][1] == ptr for grads in seen for name, (grad, ptr) in seen[0].items())
    assert all(p.grad is not None for p in result.model.parameters())  # zeroed in place, never dropped


@pytest.mark.device_check
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (benchmarks/device_check.sh)")
@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_a_gpu_compiled_steps_replay_cuda_graphs_and_train_as_eager_ones(tiny_model_dir, monkeypatch, accumulate):
    # One graph per kind of shape and no CUDA-graph skip (a skip would mean eager speed in a compiled run), with
    # gradient accumulation too: its gradients live in buffers made before the first replay (step.compile_for_training).
    compiled = run(tiny_model_dir, compile=True, max_length=80, device="cuda", gradient_accumulation_steps=accumulate)
    monkeypatch.setattr(step, "LengthGroupedBatches",
                        lambda *args, **kwargs: LengthGroupedBatches(*args, **{**kwargs, "drop_last": True}))
    eager = run(tiny_model_dir, compile=False, max_length=80, device="cuda", gradient_accumulation_steps=accumulate)
    assert [row["loss"] for row in compiled.history] == pytest.approx([row["loss"] for row in eager.history],
                                                                      rel=1e-2, abs=1e-3)
    counts = compiled.metrics["train"]["compile"]
    assert counts["graphs"] <= 2 and counts["graph_breaks"] == 0 and counts["cudagraph_skips"] == 0, counts


@pytest.mark.device_check
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP over NCCL with CUDA graphs needs 2 or more GPUs, "
                    f"and this machine has {torch.cuda.device_count()}")
def test_two_gpus_train_a_compiled_accumulating_step_over_nccl(tmp_path, tiny_model_dir):
    """Opt-in by hardware: torchrun on two GPUs, NCCL all-reduces beside CUDA graphs, with gradient accumulation."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT, free_port

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                           f"--master-port={free_port()}", "--module", "nli_helpers.task", "--data", "sample",
                           "--model_name_or_path", tiny_model_dir, "--num_train_epochs", "2",
                           "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
                           "--torch_compile", "--no-progress", "--output_dir", str(tmp_path / "job")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train_metrics = json.loads((tmp_path / "job" / "metrics.json").read_text())["train"]
    assert train_metrics["processes"] == 2 and train_metrics["compile"]["cudagraph_skips"] == 0, train_metrics
