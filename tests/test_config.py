import dataclasses

import pytest

from nli_helpers import config
from nli_helpers.config import PROFILE_DEFAULTS, RECIPE_CARDS, ConfigError, TrainConfig, make_config
from nli_helpers.task import build_parser, config_from_args


def test_every_field_has_help_text():
    for f in dataclasses.fields(TrainConfig):
        assert len(f.metadata.get("help", "")) > 10, f.name


@pytest.mark.parametrize("bad, fragment", [
    ({"learning_rate": 0}, "learning_rate=0 must be > 0"),
    ({"learning_rate": -1e-5}, "learning_rate=-1e-05 must be > 0"),
    ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
    ({"fraction_of_train_data": 0}, "fraction_of_train_data=0 must be a fraction in (0, 1]"),
    ({"fraction_of_train_data": 1.5}, "fraction_of_train_data=1.5 must be a fraction in (0, 1]"),
    ({"eval_fraction": 0}, "eval_fraction=0 must be a fraction"),
    ({"profile": "huge"}, "profile='huge' is unknown"),
    ({"precision": "fp8"}, "precision='fp8' is unknown"),
    ({"batch_size": 30, "grad_accum_steps": 4}, "must be divisible by grad_accum_steps=4"),
    ({"warmup_ratio": 1.0}, "warmup_ratio=1.0 must be in [0, 1)"),
    ({"max_train_samples": 0}, "max_train_samples=0 must be a positive integer"),
    ({"checkpoint_every_minutes": float("nan")}, "checkpoint_every_minutes=nan must be a finite"),
    ({"checkpoint_every_minutes": float("inf")}, "checkpoint_every_minutes=inf must be a finite"),
    ({"checkpoint_every_minutes": -1}, "checkpoint_every_minutes=-1 must be a finite number of "
                                       "minutes >= 0 (0: off; try 10)"),
])
def test_invalid_values_raise_one_clear_error(bad, fragment):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**bad)
    assert fragment in str(err.value)


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        TrainConfig(learning_rate=0, batch_size=0)
    assert "learning_rate" in str(err.value) and "batch_size" in str(err.value)


def test_profiles_fill_defaults_and_overrides_win(monkeypatch):
    monkeypatch.delenv("NLI_REAL_DATA", raising=False)
    monkeypatch.setattr(config, "smoke_real_data", lambda: "mnli-subset")  # this machine has MultiNLI
    smoke = make_config("smoke")
    assert (smoke.profile, smoke.model_name, smoke.data) == ("smoke", "minilm-l6", "mnli-subset")
    assert (smoke.epochs, smoke.batch_size) == (2, 32)  # real pairs: two epochs, as on NLI_REAL_DATA
    full = make_config("full", learning_rate=3e-5)
    assert full.model_name == "roberta-base" and full.data == "nyu-mll/multi_nli"
    assert full.learning_rate == 3e-5 and full.epochs == PROFILE_DEFAULTS["full"]["epochs"]


def test_smoke_uses_real_data_file_when_named(monkeypatch):
    monkeypatch.setenv("NLI_REAL_DATA", "/data/dev.jsonl")
    real = make_config("smoke")
    assert real.data == "/data/dev.jsonl"
    assert (real.epochs, real.batch_size) == (2, 32)  # two epochs over thousands of pairs
    assert make_config("smoke", data="other.csv").data == "other.csv"
    sample = make_config("smoke", data="sample", epochs=2)
    assert (sample.data, sample.epochs, sample.batch_size) == ("sample", 2, 16)


def test_nothing_chooses_the_expensive_recipe_for_you(capsys):
    # The default is the cheap profile whatever the hardware; `auto` (full with a GPU and the hub) is refused.
    assert TrainConfig().profile == "smoke" and make_config().profile == "smoke"
    with pytest.raises(ConfigError, match="profile='auto' is gone"):
        make_config("auto")
    capsys.readouterr()  # make_config() above may have said where smoke's data comes from (once per process)
    make_config("full", verbose=True)
    assert capsys.readouterr().out.startswith("Profile " + RECIPE_CARDS["full"])


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="unknown TrainConfig field.*learnin_rate"):
        make_config("smoke", learnin_rate=1)


def test_a_checkpoint_budget_is_optional_and_travels_as_a_flag():
    assert TrainConfig().checkpoint_every_minutes is None  # unset: off; a Spot job may choose one
    assert TrainConfig(checkpoint_every_minutes=0).checkpoint_every_minutes == 0
    assert not [a for a in make_config("full").to_cli_args() if "checkpoint_every_minutes" in a]
    cfg = make_config("full", checkpoint_every_minutes=2.5)
    assert "--checkpoint_every_minutes=2.5" in cfg.to_cli_args()
    assert config_from_args(["--checkpoint-every-minutes", "2.5"]).checkpoint_every_minutes == 2.5


def test_cli_args_round_trip_through_the_parser():
    cfg = make_config("full", batch_size=16, group_by_length=False, max_train_samples=100, job_dir="gs://b/x")
    again = config_from_args(cfg.to_cli_args())
    assert dataclasses.replace(again, progress=cfg.progress) == cfg


def test_parser_has_every_field_and_the_old_recipe_flags():
    parser = build_parser()
    options = {o for a in parser._actions for o in a.option_strings}
    for name in TrainConfig.field_names():
        assert f"--{name}" in options and f"--{name.replace('_', '-')}" in options
    old = ["--batch_size", "--epochs", "--log_every", "--learning_rate", "--fraction_of_train_data",
           "--seed", "--weight-decay", "--job-dir", "--model-name"]
    assert set(old) <= options


def test_old_recipe_flags_parse_into_the_config():
    cfg = config_from_args(["--profile", "smoke", "--batch_size", "16", "--epochs", "2", "--log_every", "5",
                            "--learning_rate", "3e-5", "--fraction_of_train_data", "0.5", "--seed", "7",
                            "--weight-decay", "0.1", "--job-dir", "out", "--model-name", "tiny-random"])
    assert (cfg.batch_size, cfg.epochs, cfg.log_every, cfg.learning_rate, cfg.fraction_of_train_data,
            cfg.seed, cfg.weight_decay, cfg.job_dir, cfg.model_name) == (16, 2, 5, 3e-5, 0.5, 7, 0.1, "out",
                                                                         "tiny-random")


def test_int_flags_take_the_doubles_vertex_tuning_sends():
    cfg = config_from_args(["--profile", "smoke", "--batch_size=16.0", "--max_train_samples", "64"])
    assert (cfg.batch_size, cfg.max_train_samples) == (16, 64) and isinstance(cfg.batch_size, int)


@pytest.mark.parametrize("value", ["16.5", "sixteen"])
def test_int_flags_refuse_what_is_not_a_whole_number(value, capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--profile", "smoke", f"--batch_size={value}"])
    assert f"{value!r} is not a whole number" in capsys.readouterr().err


def test_smoke_cap_caps_only_what_is_unset_and_only_on_smoke(monkeypatch):
    monkeypatch.delenv("NLI_REAL_DATA", raising=False)
    capped = make_config("smoke", smoke_cap=500)
    assert (capped.max_train_samples, capped.max_eval_samples) == (500, 500)
    mine = make_config("smoke", smoke_cap=500, max_train_samples=64)
    assert (mine.max_train_samples, mine.max_eval_samples) == (64, 500)
    assert make_config("smoke").max_train_samples is None
    full = make_config("full", smoke_cap=500)
    assert (full.max_train_samples, full.max_eval_samples) == (None, None)


def test_a_capped_smoke_run_on_real_pairs_takes_the_short_run_recipe():
    capped = make_config("smoke", data="real.jsonl", smoke_cap=1024)
    assert (capped.epochs, capped.learning_rate, capped.batch_size) == (2, 2e-4, 32)
    assert make_config("smoke", data="real.jsonl").epochs == 2  # uncapped: two epochs at 1e-4
    assert make_config("smoke", data="real.jsonl", smoke_cap=1024, epochs=3).epochs == 3  # yours wins
    sample = make_config("smoke", data="sample", smoke_cap=1024)  # the sample keeps its own recipe
    assert (sample.epochs, sample.learning_rate) == (6, 2e-4)


@pytest.mark.parametrize("flag, value, message", [
    ("learning_rate", "inf", "learning_rate=inf must be a finite number"),
    ("max_grad_norm", "nan", "max_grad_norm=nan must be a finite number"),  # nan used to mean "no clipping"
    ("epochs", "inf", "epochs=inf must be a finite number"),
    ("warmup_ratio", "nan", "warmup_ratio=nan must be a finite number"),
    ("seed", str(2**40), "must be in [0, 2**32)"),
    ("seed", "-1", "must be in [0, 2**32)"),
    ("data", "", "data='' is empty (an unset shell variable?)"),
])
def test_hostile_values_are_refused_where_they_are_parsed(flag, value, message):
    with pytest.raises(ConfigError) as err:
        config_from_args(["--profile", "smoke", f"--{flag}={value}"])
    assert message in str(err.value)


def test_one_estimate_of_the_full_recipe_wherever_a_time_is_quoted():
    """Issue 27: the recipe card is the one place the full recipe's time comes from; README quotes it, and the
    figures it replaced (2-3 hours on an L4, 30-45 minutes on an A100, 'hours on a GPU') are nowhere."""
    import re

    from tests.helpers import ROOT

    phrase = re.search(r"about \d+ minutes on one L4 or A100", RECIPE_CARDS["full"]).group(0)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert phrase in readme and "benchmarks/README.md works it out" in readme
    places = [ROOT / "README.md", ROOT / "notebooks" / "README.md", ROOT / "benchmarks" / "README.md",
              *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "nli_helpers").rglob("*.py"))]
    stale = re.compile(r"2-3 hours|30-45 minutes|hours on a GPU|half of its few hours|few hours, an estimate|"
                       r"8 on one A100|10 ms on an A100|\$0\.25 a run")
    for path in places:
        text = " ".join(path.read_text().replace('\\n"', " ").split())
        assert not stale.search(text), f"{path.name} quotes another time for the full recipe: {stale.search(text)[0]}"
