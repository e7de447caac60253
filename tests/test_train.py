"""The loop on the bundled sample: loss falls, the export reloads, predictions survive the round trip."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from nli_helpers.checkpoint import latest_checkpoint, load_checkpoint
from nli_helpers.config import ConfigError, make_config
from nli_helpers.distributed import resolve_precision
from nli_helpers.model import load_model_and_tokenizer
from nli_helpers.notebook_runs import predict
from nli_helpers.run import run_training
from nli_helpers.tracking import TrainCallback
from tests.tiny_model import tiny_model


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "job"
    cfg = make_config("smoke", data="sample", logging_steps=5, output_dir=str(out), progress=False)
    return run_training(cfg, verbose=False), out


def test_loss_falls_and_history_is_complete(smoke_run):
    result, out = smoke_run
    losses = [row["loss"] for row in result.history]
    assert len(losses) == result.metrics["train"]["steps"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.2
    lrs = [row["lr"] for row in result.history]
    assert max(lrs) == pytest.approx(result.config.learning_rate, rel=1e-6) and lrs[-1] < lrs[len(lrs) // 2]  # warmup then decay
    assert any("examples_per_s" in row for row in result.history)
    saved = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert saved == result.history


def test_every_validation_split_is_scored(smoke_run):
    result, _ = smoke_run
    for split in ("validation_matched", "validation_mismatched"):
        scores = result.metrics[split]
        assert scores["n"] == sum(map(sum, scores["confusion_matrix"]))
        assert 0 <= scores["accuracy"] <= 1 and "per_genre" in scores
    assert len(result.metrics["eval_history"]) == result.config.num_train_epochs  # once per epoch


def test_export_reloads_and_predicts_like_the_in_memory_model(smoke_run):
    result, out = smoke_run
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["validation_matched"]["accuracy"] == result.metrics["validation_matched"]["accuracy"]
    assert json.loads((out / "train_config.json").read_text())["learning_rate"] == result.config.learning_rate
    reloaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert reloaded.config.id2label[2] == "contradiction"
    pairs = [("A man is playing a guitar on stage.", "A man is performing music."),
             ("A man is playing a guitar on stage.", "Nobody is playing an instrument."),
             ("The museum opens at nine.", "The museum is popular with tourists.")]
    in_memory = predict(pairs, model=result.model.cpu().float(), tokenizer=result.tokenizer)
    from_disk = predict(pairs, out)
    assert [p["label"] for p in in_memory] == [p["label"] for p in from_disk]
    for a, b in zip(in_memory, from_disk):
        assert a["probs"] == pytest.approx(b["probs"], abs=1e-5)


def test_a_checkpoint_and_the_run_folder_open_with_plain_from_pretrained(smoke_run):
    """As Trainer's do: `AutoModelForSequenceClassification` and `AutoTokenizer` open a checkpoint
    folder and the run folder as they are, with nothing of this package, every weight found."""
    result, out = smoke_run
    newest = latest_checkpoint(str(out / "checkpoints"))
    assert newest and Path(newest).parent == out / "checkpoints"  # the epoch-end checkpoints
    in_memory = {k: v.cpu() for k, v in result.model.state_dict().items()}
    _, fresh_tokenizer = load_model_and_tokenizer("minilm-l6")
    pair = ("A man is playing a guitar on stage.", "A man is performing music.")
    for folder in (newest, str(out)):
        model, info = AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert not info["missing_keys"] and not info["unexpected_keys"], (folder, info)
        assert model.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
        assert tokenizer(*pair)["input_ids"] == fresh_tokenizer(*pair)["input_ids"]
        with torch.no_grad():
            logits = model.eval()(**tokenizer(*pair, return_tensors="pt")).logits
        assert logits.shape == (1, 3) and torch.isfinite(logits).all()
        weights = model.state_dict()
        if folder == str(out):  # the run folder holds the trained weights
            assert all(torch.equal(weights[k], in_memory[k]) for k in in_memory)
        else:  # the checkpoint holds what a resume loads, an earlier step's
            resumed, _ = load_model_and_tokenizer("minilm-l6")
            state = load_checkpoint(newest, resumed)
            assert state["step"] < result.metrics["train"]["steps"]
            assert all(torch.equal(weights[k], v) for k, v in resumed.state_dict().items())


def test_same_seed_same_run(tmp_path):
    def losses(name):
        cfg = make_config("smoke", model_name_or_path=tiny_model(), num_train_epochs=1,
                          per_device_train_batch_size=8, max_train_samples=64,
                          output_dir=str(tmp_path / name), progress=False, logging_steps=1)
        return [r["loss"] for r in run_training(cfg, verbose=False).history]

    assert losses("a") == losses("b")


def test_eval_steps_adds_evaluations(tmp_path):
    cfg = make_config("smoke", model_name_or_path=tiny_model(), num_train_epochs=1,
                      per_device_train_batch_size=8, max_train_samples=64, eval_steps=3,
                      output_dir=str(tmp_path / "e"), progress=False)
    steps = [row["step"] for row in run_training(cfg, verbose=False).metrics["eval_history"]]
    assert steps == [3, 6, 8]


def test_gpu_only_precision_on_a_cpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", torch.device("cpu"))
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("cpu")) in ("bf16", "fp32")


def test_callbacks_see_every_log_and_evaluation(tmp_path):
    from nli_helpers.tracking import TrainCallback

    class Recorder(TrainCallback):
        def __init__(self):
            self.rows, self.evals, self.final = [], [], None

        def on_log(self, rows):
            self.rows += rows

        def on_evaluate(self, step, epoch, scores):
            self.evals.append((step, sorted(scores)))

        def on_train_end(self, metrics):
            self.final = metrics

    rec = Recorder()
    cfg = make_config("smoke", model_name_or_path=tiny_model(), data="sample", num_train_epochs=2,
                      per_device_train_batch_size=8, max_train_samples=64, logging_steps=3,
                      output_dir=str(tmp_path / "cb"), progress=False)
    result = run_training(cfg, verbose=False, callbacks=[rec])
    assert rec.rows == result.history
    assert rec.evals == [(8, ["validation_matched", "validation_mismatched"]),
                         (16, ["validation_matched", "validation_mismatched"])]
    assert rec.final is result.metrics


class StepMinutes(TrainCallback):
    """A clock on which each optimizer step takes a minute (at logging_steps=1, on_log sees each)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def on_log(self, rows):
        self.now += 60.0 * len(rows)


def test_a_time_budget_checkpoints_on_the_clock_without_changing_the_run(tmp_path, capsys):
    from transformers import set_seed

    from nli_helpers.checkpoint import latest_checkpoint
    from nli_helpers.data import load_nli_splits
    from nli_helpers.model import load_model_and_tokenizer, tokenize_splits
    from nli_helpers.train import train

    def run(name, clock=None, resume_from=None, **overrides):
        cfg = make_config("smoke", model_name_or_path=tiny_model(), data="sample", num_train_epochs=2,
                          per_device_train_batch_size=8, max_train_samples=64, max_eval_samples=32, logging_steps=1,
                          save_total_limit=10, precision="fp32", progress=False, **overrides)
        splits = load_nli_splits("sample", seed=cfg.seed, max_train_samples=64, max_eval_samples=32)
        set_seed(cfg.seed)
        model, tokenizer = load_model_and_tokenizer(tiny_model())
        extra = {"clock": clock, "callbacks": [clock]} if clock else {}
        result = train(cfg, model, tokenizer, tokenize_splits(splits, tokenizer, cfg.max_seq_length),
                       device=torch.device("cpu"), precision="fp32", checkpoint_root=str(tmp_path / name),
                       resume_from=resume_from, **extra)
        return [(row["step"], row["loss"]) for row in result.history], result.metrics

    timed, timed_metrics = run("timed", clock=StepMinutes(), checkpoint_every_minutes=2)
    # 8 steps an epoch, 16 in all: 2 minutes pass every second step after a checkpoint; at step 8
    # the epoch-end checkpoint (after the evaluation) stands in for the time-based one.
    logged = re.findall(r"checkpoint at step (\d+): 2.0 min since", capsys.readouterr().out)
    assert [int(step) for step in logged] == [2, 4, 6, 10, 12, 14]
    on_disk = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "timed").glob("checkpoint-*"))
    assert on_disk == [2, 4, 6, 8, 10, 12, 14]
    plain, _ = run("plain")
    assert timed == plain  # the same losses at every step: checkpoints only read the run
    assert latest_checkpoint(str(tmp_path / "plain")).endswith("-00000008")  # the epoch end only
    # Resumed mid-epoch from a time-triggered checkpoint: exactly the same run.
    six = str(tmp_path / "timed" / "checkpoint-00000006")
    resumed, resumed_metrics = run("resumed", resume_from=six)
    assert resumed == timed
    assert resumed_metrics["validation_matched"] == timed_metrics["validation_matched"]


class NormedNet(torch.nn.Module):
    """Names the old substring rule missed: a ModernBERT-style `final_norm` and an `ln_f`."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8, bias=False))
        self.final_norm = torch.nn.LayerNorm(8)
        self.ln_f = torch.nn.RMSNorm(8)
        self.head = torch.nn.Linear(8, 3)
        self.frozen = torch.nn.Parameter(torch.zeros(3, 3), requires_grad=False)


def test_weight_decay_goes_by_shape_not_name():
    from nli_helpers.step import build_optimizer

    model = NormedNet()
    cfg = make_config("smoke", weight_decay=0.1)
    decay, no_decay = build_optimizer(model, cfg).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"final_norm.weight", "final_norm.bias", "ln_f.weight"} <= skipped
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linear | {"embed.weight"} == decayed
    # A partition of the trainable parameters: each in exactly one group, the frozen one in none.
    grouped = [id(p) for group in (decay, no_decay) for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters() if p.requires_grad)


def test_bert_keeps_the_groups_it_had_by_name():
    from nli_helpers.step import decay_groups

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model())
    by_name = {n for n, _ in model.named_parameters() if "bias" in n or "LayerNorm" in n}
    names = {id(p): n for n, p in model.named_parameters()}
    _, no_decay = decay_groups(model, 0.01)
    # The same groups as the old name rule gave: checkpoints written before resume as they were.
    assert {names[id(p)] for p in no_decay["params"]} == by_name


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_mask_a_step_passes_gives_the_logits_of_transformers_own(attention):
    """step.model_inputs hands the model a mask it uses as it is (none for an unpadded batch, else a 4-D one), so
    transformers never asks the device whether the batch is padded: the logits do not change by a bit."""
    from transformers import AutoTokenizer

    from nli_helpers.step import model_inputs

    tokenizer = AutoTokenizer.from_pretrained(tiny_model())
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model(), attn_implementation=attention).eval()
    padded = dict(tokenizer(["a man sits on the bench in the park", "dogs"], ["he sits", "no dogs were seen at all"],
                            padding=True, return_tensors="pt"))
    unpadded = {k: v[:1, :int(padded["attention_mask"][0].sum())] for k, v in padded.items()}
    cpu = torch.device("cpu")
    width = padded["input_ids"].shape[1]
    for batch, mask_shape in ((padded, (2, 1, width, width)), (unpadded, None)):
        inputs = model_inputs(batch, cpu, model)
        assert (inputs["attention_mask"].shape if "attention_mask" in inputs else None) == mask_shape
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, model(**batch).logits)
