import dataclasses
import json

import pytest

from nli_helpers import config
from nli_helpers.config import (
    PROFILE_DEFAULTS,
    ConfigError,
    TrainConfig,
    build_parser,
    make_config,
    parse_args,
)


def test_every_field_has_help_text():
    for f in dataclasses.fields(TrainConfig):
        assert len(f.metadata.get("help", "")) > 10, f.name


@pytest.mark.parametrize("bad, fragment", [
    ({"learning_rate": 0}, "learning_rate=0 must be > 0"),
    ({"learning_rate": -1e-5}, "learning_rate=-1e-05 must be > 0"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size=0 must be a positive integer"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0 must be a positive integer"),
    ({"eval_fraction": 1.5}, "eval_fraction=1.5 must be a fraction in (0, 1]"),
    ({"eval_fraction": 0}, "eval_fraction=0 must be a fraction"),
    ({"profile": "huge"}, "profile='huge' is unknown"),
    ({"precision": "fp8"}, "precision='fp8' is unknown"),
    ({"log_level": "loud"}, "log_level='loud' is unknown; use one of debug, info, warning, error, critical, passive"),
    ({"warmup_ratio": 1.0}, "warmup_ratio=1.0 must be in [0, 1)"),
    ({"max_train_samples": 0}, "max_train_samples=0 must be a positive integer"),
    ({"ddp_bucket_cap_mb": -1}, "ddp_bucket_cap_mb=-1 must be a positive integer"),
    ({"save_total_limit": -1}, "save_total_limit=-1 must be"),
    ({"checkpoint_every_minutes": float("nan")}, "checkpoint_every_minutes=nan must be a finite"),
    ({"checkpoint_every_minutes": float("inf")}, "checkpoint_every_minutes=inf must be a finite"),
    ({"checkpoint_every_minutes": -1}, "checkpoint_every_minutes=-1 must be"),
])
def test_invalid_values_raise_one_clear_error(bad, fragment):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**bad)
    assert fragment in str(err.value)


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        TrainConfig(learning_rate=0, per_device_train_batch_size=0)
    assert "learning_rate" in str(err.value) and "per_device_train_batch_size" in str(err.value)


def test_profiles_fill_defaults_and_overrides_win(monkeypatch):
    monkeypatch.delenv("NLI_REAL_DATA", raising=False)
    monkeypatch.setattr(config, "smoke_real_data", lambda: "mnli-subset")  # this machine has MultiNLI
    smoke = make_config("smoke")
    assert (smoke.profile, smoke.model_name_or_path, smoke.data) == ("smoke", "minilm-l6", "mnli-subset")
    assert (smoke.num_train_epochs, smoke.per_device_train_batch_size) == (2, 32)  # real pairs: two epochs
    full = make_config("full", learning_rate=3e-5)
    assert full.model_name_or_path == "roberta-base" and full.data == "nyu-mll/multi_nli"
    assert full.learning_rate == 3e-5 and full.num_train_epochs == PROFILE_DEFAULTS["full"]["num_train_epochs"]


def test_smoke_uses_real_data_file_when_named(monkeypatch):
    monkeypatch.setenv("NLI_REAL_DATA", "/data/dev.jsonl")
    real = make_config("smoke")
    assert real.data == "/data/dev.jsonl"
    assert (real.num_train_epochs, real.per_device_train_batch_size) == (2, 32)  # two epochs, thousands of pairs
    assert make_config("smoke", data="other.csv").data == "other.csv"
    sample = make_config("smoke", data="sample", num_train_epochs=2)
    assert (sample.data, sample.num_train_epochs, sample.per_device_train_batch_size) == ("sample", 2, 16)


def test_a_quiet_log_level_keeps_make_config_silent(capsys, monkeypatch):
    """--log_level warning and above quiet our start-up lines: the note on where smoke's data comes from and the
    config: line; the default (passive) prints both, the note once per process."""
    monkeypatch.delenv("NLI_REAL_DATA", raising=False)
    config.smoke_real_data.cache_clear()
    quiet = make_config("smoke", verbose=True, log_level="warning")
    assert capsys.readouterr().out == "" and quiet.data in ("mnli-subset", "sample")
    loud = make_config("smoke", verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(("data: real MultiNLI from", "note: ")) and lines[-1] == f"config: {loud.summary()}"
    make_config("smoke", verbose=True)
    assert capsys.readouterr().out == f"config: {loud.summary()}\n"  # the note once


def test_nothing_chooses_the_expensive_recipe_for_you(capsys):
    # The default is the cheap profile whatever the hardware; another name is refused.
    assert TrainConfig().profile == "smoke" and make_config().profile == "smoke"
    with pytest.raises(ConfigError, match="profile='auto' is unknown; use one of smoke, full"):
        make_config("auto")
    capsys.readouterr()  # make_config() above may have said where smoke's data comes from (once per process)
    cfg = make_config("full", verbose=True)
    assert capsys.readouterr().out == f"config: {cfg.summary()}\n"
    assert cfg.summary().startswith("full: roberta-base on nyu-mll/multi_nli, 2 epoch(s)")


def test_unknown_field_is_named():
    with pytest.raises(TypeError, match="unexpected keyword argument 'learnin_rate'"):
        make_config("smoke", learnin_rate=1)


def test_a_checkpoint_budget_is_optional_and_travels_as_a_flag():
    assert TrainConfig().checkpoint_every_minutes is None  # unset: off; a Spot job may choose one
    assert TrainConfig(checkpoint_every_minutes=0).checkpoint_every_minutes == 0
    assert not [a for a in make_config("full").to_cli_args() if "checkpoint_every_minutes" in a]
    cfg = make_config("full", checkpoint_every_minutes=2.5)
    assert "--checkpoint_every_minutes=2.5" in cfg.to_cli_args()
    assert parse_args(["--checkpoint-every-minutes", "2.5"]).checkpoint_every_minutes == 2.5


def test_cli_args_round_trip_through_the_parser():
    cfg = make_config("full", per_device_train_batch_size=16, group_by_length=False, torch_compile=True,
                      max_train_samples=100, output_dir="gs://b/x", resume_from_checkpoint="auto")
    args = cfg.to_cli_args()
    assert "--group_by_length=False" in args and "--torch_compile=True" in args
    assert not [a for a in args if "max_eval_samples" in a]  # None: left for the job to resolve
    again = parse_args(args)
    assert dataclasses.replace(again, progress=cfg.progress) == cfg


def test_parser_has_every_field_under_its_hugging_face_name():
    options = {o for a in build_parser()._actions for o in a.option_strings}
    for name in TrainConfig.field_names():
        assert f"--{name}" in options and f"--{name.replace('_', '-')}" in options
    hf = ["--output_dir", "--model_name_or_path", "--num_train_epochs", "--per_device_train_batch_size",
          "--per_device_eval_batch_size", "--gradient_accumulation_steps", "--max_seq_length", "--logging_steps",
          "--eval_steps", "--save_steps", "--save_total_limit", "--resume_from_checkpoint",
          "--dataloader_num_workers", "--torch_compile", "--config", "--bf16", "--no_progress", "--no-progress"]
    assert set(hf) <= options
    old = {"--job-dir", "--job_dir", "--model-name", "--epochs", "--batch_size", "--max_length", "--resume"}
    assert not old & options


def test_hugging_face_flags_parse_into_the_config():
    cfg = parse_args(["--profile", "smoke", "--per_device_train_batch_size", "16", "--num_train_epochs", "2",
                      "--logging_steps", "5", "--learning_rate", "3e-5",
                      "--seed", "7", "--weight-decay", "0.1", "--output_dir", "out", "--model-name-or-path",
                      "some/model", "--gradient_accumulation_steps", "2", "--no_progress", "--bf16"])
    assert (cfg.per_device_train_batch_size, cfg.num_train_epochs, cfg.logging_steps, cfg.learning_rate,
            cfg.seed, cfg.weight_decay, cfg.output_dir, cfg.model_name_or_path,
            cfg.gradient_accumulation_steps, cfg.progress, cfg.precision) == (
        16, 2, 5, 3e-5, 7, 0.1, "out", "some/model", 2, False, "bf16")


def test_int_flags_take_the_doubles_vertex_tuning_sends():
    cfg = parse_args(["--profile", "smoke", "--per_device_train_batch_size=16.0", "--max_train_samples", "64"])
    assert (cfg.per_device_train_batch_size, cfg.max_train_samples) == (16, 64)
    assert isinstance(cfg.per_device_train_batch_size, int)


@pytest.mark.parametrize("value", ["16.5", "sixteen"])
def test_int_flags_refuse_what_is_not_a_whole_number(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--profile", "smoke", f"--per_device_train_batch_size={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert f"--per_device_train_batch_size/--per-device-train-batch-size: invalid whole number value: {value!r}" \
        in err


def test_smoke_cap_caps_only_what_is_unset_and_only_on_smoke(monkeypatch):
    monkeypatch.delenv("NLI_REAL_DATA", raising=False)
    capped = make_config("smoke", smoke_cap=500)
    # a short run keeps no checkpoints unless asked: only notebook 04's single job shows them
    assert (capped.max_train_samples, capped.max_eval_samples, capped.save_total_limit) == (500, 500, 0)
    mine = make_config("smoke", smoke_cap=500, max_train_samples=64, save_total_limit=1)
    assert (mine.max_train_samples, mine.max_eval_samples, mine.save_total_limit) == (64, 500, 1)
    assert make_config("smoke").max_train_samples is None
    assert make_config("smoke").save_total_limit == TrainConfig.save_total_limit
    full = make_config("full", smoke_cap=500)
    assert (full.max_train_samples, full.max_eval_samples) == (None, None)
    assert full.save_total_limit == TrainConfig.save_total_limit


def test_a_capped_smoke_run_on_real_pairs_takes_the_short_run_recipe():
    capped = make_config("smoke", data="real.jsonl", smoke_cap=1024)
    assert (capped.num_train_epochs, capped.learning_rate, capped.per_device_train_batch_size) == (2, 2e-4, 32)
    assert make_config("smoke", data="real.jsonl").num_train_epochs == 2  # uncapped: two epochs at 1e-4
    assert make_config("smoke", data="real.jsonl", smoke_cap=1024, num_train_epochs=3).num_train_epochs == 3
    sample = make_config("smoke", data="sample", smoke_cap=1024)  # the sample keeps its own recipe
    assert (sample.num_train_epochs, sample.learning_rate) == (6, 2e-4)


@pytest.mark.parametrize("flag, value, message", [
    # inf as a learning rate writes NaN weights; nan as max_grad_norm silently meant "no clipping"
    ("learning_rate", "inf", "learning_rate=inf must be"),
    ("learning_rate", "nan", "learning_rate=nan must be"),
    ("max_grad_norm", "nan", "max_grad_norm=nan must be"),
    ("num_train_epochs", "inf", "num_train_epochs=inf must be"),
    ("warmup_ratio", "nan", "warmup_ratio=nan must be"),
    ("seed", str(2**40), "must be in [0, 2**32)"),
    ("seed", "-1", "must be in [0, 2**32)"),
    ("data", "", "data='' is empty (an unset shell variable?)"),
])
def test_hostile_values_are_refused_where_they_are_parsed(flag, value, message):
    with pytest.raises(ConfigError) as err:
        parse_args(["--profile", "smoke", f"--{flag}={value}"])
    assert message in str(err.value)


# -- --config FILE: YAML or JSON; flags override the file, the file overrides the profile --------------------
@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_a_config_file_sets_fields_and_flags_override_it(tmp_path, suffix):
    values = {"profile": "full", "num_train_epochs": 1, "learning_rate": 3e-5, "group_by_length": False,
              "output_dir": "runs/from-file", "max_train_samples": 100}
    path = tmp_path / f"train.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps(values))
    else:  # what a person writes by hand: comments, YAML's own booleans
        path.write_text("# a short full run\nprofile: full\nnum_train_epochs: 1\nlearning_rate: 3.0e-5\n"
                        "group_by_length: no\noutput_dir: runs/from-file\nmax_train_samples: 100\n")
    cfg = parse_args(["--config", str(path)])
    assert (cfg.profile, cfg.num_train_epochs, cfg.learning_rate, cfg.group_by_length, cfg.output_dir,
            cfg.max_train_samples) == ("full", 1, 3e-5, False, "runs/from-file", 100)
    assert cfg.model_name_or_path == "roberta-base"  # unset in the file: the profile's
    assert isinstance(cfg.max_train_samples, int) and isinstance(cfg.learning_rate, float)
    flagged = parse_args(["--learning_rate", "1e-4", "--config", str(path), "--group_by_length", "True"])
    assert (flagged.learning_rate, flagged.group_by_length, flagged.num_train_epochs) == (1e-4, True, 1)


def test_a_saved_config_reads_back_equal(tmp_path):
    cfg = make_config("full", per_device_train_batch_size=8, gradient_accumulation_steps=4, torch_compile=True,
                      checkpoint_every_minutes=2.5, output_dir=str(tmp_path / "run"), tuning_metric="x_accuracy")
    (tmp_path / "train_config.json").write_text(cfg.to_json())
    assert parse_args(["--config", str(tmp_path / "train_config.json")]) == cfg


@pytest.mark.parametrize("text, message", [
    ("learnin_rate: 1e-4\nseed: 3\n", "has unknown field(s) learnin_rate"),
    ("- seed\n- 3\n", "must hold a mapping of TrainConfig fields"),
    ("seed: [unclosed\n", "could not be read"),
])
def test_a_config_file_that_is_wrong_is_one_config_error(tmp_path, text, message):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_args(["--config", str(path)])
    with pytest.raises(ConfigError, match="could not be read"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])


def test_a_bad_value_in_a_config_file_is_the_parsers_one_line(tmp_path, capsys):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"per_device_train_batch_size": "many"}))
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--config", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "'many'" in err


def test_one_estimate_of_the_full_recipe_wherever_a_time_is_quoted():
    """Issue 27: README states the full recipe's time once (benchmarks/README.md works it out); the figures it
    replaced (2-3 hours on an L4, 30-45 minutes on an A100, 'hours on a GPU') are nowhere."""
    import re

    from tests.helpers import ROOT

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert len(set(re.findall(r"about \d+ minutes on one L4 or A100", readme))) == 1
    assert "benchmarks/README.md works it out" in readme
    places = [ROOT / "README.md", ROOT / "notebooks" / "README.md", ROOT / "benchmarks" / "README.md",
              *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "nli_helpers").rglob("*.py"))]
    stale = re.compile(r"2-3 hours|30-45 minutes|hours on a GPU|half of its few hours|few hours, an estimate|"
                       r"8 on one A100|10 ms on an A100|\$0\.25 a run")
    for path in places:
        text = " ".join(path.read_text().replace('\\n"', " ").split())
        assert not stale.search(text), f"{path.name} quotes another time for the full recipe: {stale.search(text)[0]}"
