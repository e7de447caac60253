"""`--torch_compile` on this CPU: the same run as eager within float tolerance, no recompile once every shape was seen,
evaluation and the saved model untouched. On a GPU the same flag adds CUDA graphs (benchmarks/README.md)."""

from __future__ import annotations

import pytest
import torch

from nli_helpers import train
from nli_helpers.config import make_config
from nli_helpers.data import load_nli_splits, tokenize_splits
from nli_helpers.model import load_model_and_tokenizer
from nli_helpers.step import compiled_graphs


class GraphsPerEpoch(train.TrainCallback):
    """The number of graphs dynamo has compiled so far, at each epoch's evaluation."""

    def __init__(self):
        self.seen: list[int] = []

    def on_evaluate(self, step, epoch, scores):
        self.seen.append(compiled_graphs())


def run(tiny_model_dir, compile: bool, callbacks=()):
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = make_config("smoke", model_name_or_path=tiny_model_dir, num_train_epochs=3, per_device_train_batch_size=8,
                      max_train_samples=60, max_eval_samples=16, logging_steps=1, progress=False,
                      save_total_limit=0, precision="fp32", torch_compile=compile)
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    tokenized = tokenize_splits(load_nli_splits("sample", max_train_samples=60, max_eval_samples=16), tokenizer,
                                 128)
    return train.train(cfg, model, tokenizer, tokenized, device=torch.device("cpu"), callbacks=callbacks)


def test_a_compiled_run_trains_as_the_eager_one_and_stops_compiling_after_its_first_epoch(tiny_model_dir):
    eager = run(tiny_model_dir, compile=False)
    graphs = GraphsPerEpoch()
    compiled = run(tiny_model_dir, compile=True, callbacks=[graphs])
    losses = [row["loss"] for row in compiled.history]
    assert losses == pytest.approx([row["loss"] for row in eager.history], rel=1e-3, abs=1e-4)
    # The first epoch meets a second padded width (multiples of 16; at 128 tokens the sample's pairs pad to 64..112)
    # and the epoch's short last batch: both dimensions are then dynamic, and those graphs serve every later shape.
    assert graphs.seen[0] >= 1 and graphs.seen[-1] == graphs.seen[0], graphs.seen
    assert compiled.metrics["train"]["compiled_graphs"] == graphs.seen[-1]
    assert "compiled_graphs" not in eager.metrics["train"]
    # Evaluation runs the eager model underneath: the same predictions from the same weights.
    assert compiled.metrics["validation_matched"]["confusion_matrix"] == \
        eager.metrics["validation_matched"]["confusion_matrix"]
    assert not any(key.startswith("_orig_mod") for key in compiled.model.state_dict())
