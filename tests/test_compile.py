"""`--torch_compile` on this CPU: the same run as eager within float tolerance, two graphs in all (no graph break, no
recompile after the first epoch, whatever the width, the mask or the epoch boundary), evaluation and the saved model
untouched. On a GPU the same flag adds CUDA graphs (benchmarks/README.md)."""

from __future__ import annotations

import pytest
import torch

from nli_helpers import compiled as compiled_module
from nli_helpers import step, train
from nli_helpers.config import make_config
from nli_helpers.data import LengthGroupedBatches, load_nli_splits, tokenize_splits
from nli_helpers.model import load_model_and_tokenizer


class GraphsPerEpoch(train.TrainCallback):
    """The number of graphs dynamo has compiled so far, at each epoch's evaluation."""

    def __init__(self):
        self.seen: list[int] = []

    def on_evaluate(self, step, epoch, scores):
        self.seen.append(compiled_module.counters()["graphs"])


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
    result = train.train(cfg, model, tokenizer, tokenized, device=torch.device(device), callbacks=callbacks)
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
                                                    "cudagraph_skips": 0, "dropped_per_epoch": 4}
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
                                                  "cudagraph_skips": 0, "dropped_per_epoch": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (benchmarks/device_check.sh)")
@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_a_gpu_compiled_steps_replay_cuda_graphs_and_train_as_eager_ones(tiny_model_dir, monkeypatch, accumulate):
    # One graph per kind of shape and no CUDA-graph skip (a skip would mean eager speed in a compiled run). With
    # gradient accumulation the run compiles without CUDA graphs (nli_helpers/compiled.py) and still matches.
    compiled = run(tiny_model_dir, compile=True, max_length=80, device="cuda", gradient_accumulation_steps=accumulate)
    monkeypatch.setattr(step, "LengthGroupedBatches",
                        lambda *args, **kwargs: LengthGroupedBatches(*args, **{**kwargs, "drop_last": True}))
    eager = run(tiny_model_dir, compile=False, max_length=80, device="cuda", gradient_accumulation_steps=accumulate)
    assert [row["loss"] for row in compiled.history] == pytest.approx([row["loss"] for row in eager.history],
                                                                      rel=1e-2, abs=1e-3)
    counts = compiled.metrics["train"]["compile"]
    assert counts["graphs"] <= 2 and counts["graph_breaks"] == 0 and counts["cudagraph_skips"] == 0, counts
