"""The trainer command's contract (README, "The command's contract"), drawn rather than listed.

`python -m nli_helpers.task` ends in one of three ways: exit 0 with a whole result; exit 2 with one `error:` line
that names the input and what to do; or, on a signal, the documented codes. Never a traceback, never a result
that looks finished but is not, never an earlier result lost.

hypothesis draws hostile combinations: flags and their values, data files (formats, encodings, schemas, sizes,
label sets, damaged bytes), model folders (missing parts, a vocabulary larger than the embedding table, too few
positions), output dirs (a file, a finished run, a killed run's checkpoints damaged in drawn ways, names the file
system refuses), and runs the command's `main` in this process on the tiny model (the interpreter start is the
only difference from a shell). A second test draws a signal and a moment across a real subprocess run, then
checks that `--resume_from_checkpoint auto` ends exactly as an uninterrupted run.

`make test` draws 30 command lines and 2 signals (about a minute on one core); the long setting, `make fuzz`
(README), draws NLI_FUZZ_EXAMPLES command lines and a 25th as many signals. A case hypothesis found stays as a
plain test where its code is tested (tests/test_hostile_inputs.py).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tests.helpers import ROOT, ROWS, free_port
from tests.tiny_model import tiny_model

FINISHED = ("metrics.json", "model.safetensors")
# What every drawn command starts from; drawn flags come after, and override.
DEFAULTS = ["--no-progress", "--num_train_epochs", "1", "--max_train_samples", "48",
            "--per_device_train_batch_size", "8", "--max_seq_length", "64", "--eval_fraction", "0.3",
            "--precision", "fp32"]
CHECKPOINT_DAMAGE = ("none", "truncated state", "flipped weights", "no manifest", "garbage manifest", "no weights")
ERROR_LINE = re.compile(r"^(\S+: )?error: \S")  # ours, or argparse's "task.py: error: ..."
# Every documented way for a signal to end the command (README): 143 (128 + SIGTERM, with the newest checkpoint
# written when there is one), 130 (Ctrl-C), or killed by the signal itself before the handlers were in. Vertex
# AI's 134 is its entry point's (nli_helpers/vertex/entry.py), never the command's.
SIGNAL_ENDINGS = {0, 130, 143, -signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT}


# -- the inputs ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Model folders, a finished run to rerun into, and an output dir with damaged checkpoints: built once."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    base = tmp_path_factory.mktemp("contract")
    tiny = Path(tiny_model())
    models = {"tiny": str(tiny), "missing": str(base / "no-such-model"), "hub-like": "not-a/real-model-name"}
    for name in ("empty", "no-weights", "truncated-weights", "no-tokenizer", "small-vocab", "few-positions",
                 "bad-config"):
        folder = base / "models" / name
        shutil.copytree(tiny, folder) if name != "empty" else folder.mkdir(parents=True)
        models[name] = str(folder)
    (base / "models/no-weights/model.safetensors").unlink()
    weights = base / "models/truncated-weights/model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for file in (base / "models/no-tokenizer").glob("*"):
        if file.name.startswith(("tokenizer", "vocab", "special_tokens")):
            file.unlink()
    (base / "models/bad-config/config.json").write_text("{not json")
    # Pickle weights named where transformers 5.23 would load them despite use_safetensors=True: config.json's
    # transformers_weights, or a safetensors index's weight_map. The pickle writes PICKLE_RAN when unpickled.
    for name, index in (("pickle-by-config", None), ("pickle-by-index", "model.safetensors.index.json")):
        folder = base / "models" / name
        shutil.copytree(tiny, folder)
        models[name] = str(folder)
        weights = "adapter_model.bin" if index is None else "pytorch_model.bin"
        (folder / weights).write_bytes(pickle.dumps(WritesAFileWhenUnpickled(base / PICKLE_RAN)))
        (folder / "model.safetensors").unlink()
        if index:
            (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": {"classifier.bias": weights}}))
        else:
            config_json = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config_json, "transformers_weights": weights}))
            (folder / "model.safetensors").write_bytes(b"not safetensors")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    small = AutoModelForSequenceClassification.from_pretrained(tiny, num_labels=3)
    small.resize_token_embeddings(len(tokenizer) - 20)  # ids past the end of the embedding table
    small.save_pretrained(base / "models/small-vocab")
    config = AutoConfig.from_pretrained(tiny, max_position_embeddings=12, num_labels=3)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(base / "models/few-positions")
    tokenizer.model_max_length = int(1e30)  # names no limit, as many tokenizers saved by hand do
    tokenizer.save_pretrained(base / "models/few-positions")

    finished = base / "finished"
    rc, _, err = run_main(["--data", "sample", "--model_name_or_path", str(tiny), "--num_train_epochs", "1",
                           "--max_train_samples", "32", "--per_device_train_batch_size", "8", "--precision", "fp32",
                           "--output_dir", str(finished)])
    assert rc == 0, err
    # A run killed after its last checkpoint, with the drawn commands' defaults: resuming continues it.
    killed = base / "killed"
    rc, _, err = run_main(["--data", "sample", "--model_name_or_path", str(tiny), "--output_dir", str(killed),
                           *DEFAULTS, "--save_steps", "2", "--save_total_limit", "3"])
    assert rc == 0 and len(list((killed / "checkpoints").glob("checkpoint-*"))) == 2, err
    for name in FINISHED:
        (killed / name).unlink()
    return {"base": base, "models": models, "finished": finished, "killed": killed}


PICKLE_RAN = "a-pickle-ran"


class WritesAFileWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """What `python -m nli_helpers.task ARGV` does, in this process: (exit code, stdout, stderr)."""
    from nli_helpers import task

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = task.main(argv)
        except SystemExit as e:  # argparse: --help, or a flag it cannot parse
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


texts = st.one_of(st.sampled_from(["a man walks", "someone is outside", "  ", "", "\u00e9t\u00e9 \u2603", "a" * 300,
                                   'he said "hi"', '"Hello," he said.', "a\ttab", "two\nlines"]),
                  st.text(max_size=20), st.none(), st.integers(-2, 2), st.lists(st.integers(), max_size=2))
labels = st.one_of(st.sampled_from([0, 1, 2, "entailment", "neutral", "contradiction"]),
                   st.sampled_from([-1, "-", "", None, 3, "yes", 1.5, True, "Entailment", " neutral", "nan"]))


@st.composite
def data_files(draw, folder: Path, hostile: bool) -> str:
    """A path or name for --data. Safe: the sample, or a file of good rows in a format and encoding the loader
    takes. Hostile: drawn rows (odd values, missing columns, one label), formats, encodings and damage."""
    kind = draw(st.sampled_from(["file"] * 6 + ["sample", "missing", "empty-dir", "split-dir", "named-pipe",
                                                 "gs-unreachable"] if hostile else
                                ["file", "file", "sample", "split-dir"]))
    if kind == "sample":
        return "sample"
    if kind == "missing":
        return str(folder / "no-such-file.jsonl")
    if kind in ("named-pipe", "gs-unreachable"):
        event(f"data: {kind}")
    if kind == "named-pipe":
        os.mkfifo(folder / "pairs.jsonl")
        return str(folder / "pairs.jsonl")
    if kind == "gs-unreachable":  # commands() points STORAGE_EMULATOR_HOST at a port where nothing listens
        return "gs://no-answer/pairs.jsonl"
    if kind == "empty-dir":
        (folder / "data").mkdir()
        return str(folder / "data")
    rows = [dict(r) for r in ROWS[: draw(st.integers(0 if hostile else 24, len(ROWS)))]]
    fmt = draw(st.sampled_from(["jsonl", "json", "csv", "tsv", "parquet", "jsonl.gz"] + ["txt"] * hostile))
    encoding, damage = "utf-8", "none"
    if hostile:
        for row in rows:  # a few values made hostile
            if draw(st.integers(0, 9)) == 0:
                row[draw(st.sampled_from(["premise", "hypothesis", "label"]))] = draw(
                    texts if draw(st.booleans()) else labels)
        if draw(st.integers(0, 4)) == 0:
            gone = draw(st.sampled_from(["label", "premise"]))
            rows = [{k: v for k, v in row.items() if k != gone} for row in rows]
        if draw(st.integers(0, 5)) == 0:
            rows = [{**row, "label": "neutral"} for row in rows]
        encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"]))
        damage = draw(st.sampled_from(["none", "truncate", "flip", "garbage", "empty"]))
    if draw(st.integers(0, 4)) == 0:  # raw MultiNLI's columns
        rows = [{"sentence1": r.get("premise"), "sentence2": r.get("hypothesis"), "gold_label": r.get("label"),
                 "genre": draw(st.sampled_from(["fiction", "telephone", "facetoface"]))} for r in rows]
    event(f"data: {kind} {fmt} {encoding} {damage}")
    target = (folder / "split" / f"train.{fmt}") if kind == "split-dir" else (folder / f"pairs.{fmt}")
    target.parent.mkdir(exist_ok=True)
    try:
        payload = encode(rows, fmt, encoding)
    except (ValueError, TypeError, UnicodeError, OverflowError, ImportError) as e:  # pandas cannot write it
        event(f"unwritable as {fmt}: {type(e).__name__}")
        payload = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    if damage == "truncate":
        payload = payload[: len(payload) * 2 // 3]
    elif damage == "flip" and payload:
        at = draw(st.integers(0, len(payload) - 1))
        payload = payload[:at] + bytes([payload[at] ^ 0xFF]) + payload[at + 1:]
    elif damage == "garbage":
        payload += draw(st.binary(min_size=1, max_size=16))
    elif damage == "empty":
        payload = b""
    target.write_bytes(payload)
    return str(target.parent if kind == "split-dir" else target)


def encode(rows: list[dict], fmt: str, encoding: str) -> bytes:
    import pandas as pd

    if fmt in ("jsonl", "txt", "jsonl.gz"):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        data = text.encode(encoding, errors="replace")
        return gzip.compress(data) if fmt == "jsonl.gz" else data
    if fmt == "json":
        return json.dumps(rows, ensure_ascii=False).encode(encoding, errors="replace")
    frame = pd.DataFrame(rows)
    if fmt == "parquet":
        buffer = io.BytesIO()
        frame.to_parquet(buffer)
        return buffer.getvalue()
    return frame.to_csv(index=False, sep="\t" if fmt == "tsv" else ",").encode(encoding, errors="replace")


FLAGS = {  # flag -> (sane values, hostile values: edges and nonsense)
    "--num_train_epochs": ([1, 2], [0, -1, 1.5, "x", "nan", ""]),
    "--per_device_train_batch_size": ([4, 8, 1, 3], [0, -3, 10**6, "four", 2.5]),
    "--learning_rate": ([2e-4, 1e-3, 0], [-1, "nan", "inf", 1e30]),
    "--max_seq_length": ([32, 64, 16, 8], [0, 1, 3, 4, 600, 10**6, -4]),
    "--max_train_samples": ([16, 48, 2, 5], [0, 1, -1]),
    "--max_eval_samples": ([8, 1], [0, -1]),
    "--eval_fraction": ([0.2, 0.5], [0, 1, 1.5, -0.1, "nan"]),
    "--gradient_accumulation_steps": ([1, 2, 3], [0, -1]),
    "--warmup_ratio": ([0, 0.1, 1], [2, -0.5]),
    "--weight_decay": ([0, 0.1], [-1, "inf"]),
    "--max_grad_norm": ([1, 0], [-1, "nan"]),
    "--precision": (["fp32", "auto"], ["bf16", "fp16", "int8"]),
    "--seed": ([0, 7, 2**31], [-1, 2**70]),
    "--logging_steps": ([1, 5], [0, -2]),
    "--eval_steps": ([0, 2], [-1]),
    "--save_steps": ([0, 1, 3], [-1]),
    "--save_total_limit": ([0, 1, 2], [-1]),
    "--per_device_eval_batch_size": ([8, 3], [0, -1]),
    "--sync_every": ([1, 4], [0, -1]),
    "--resume_from_checkpoint": (["auto"], ["no-such-checkpoint", ""]),
    "--group_by_length": (["True", "False"], ["maybe"]),
    "--unknown-flag": ([], [1]),
    "--job-dir": ([], ["elsewhere"]),  # the old names are unknown flags now
    "--overwrite_output_dir": (["True", "False"], ["maybe"]),
}
MODELS = ("missing", "hub-like", "empty", "no-weights", "truncated-weights", "no-tokenizer", "small-vocab",
          "few-positions", "bad-config", "pickle-by-config", "pickle-by-index")


@st.composite
def commands(draw, world: dict, folder: Path) -> tuple[list[str], Path, dict[str, bytes]]:
    """A drawn command line, the output dir it writes, and the finished result already there (name -> bytes).

    Each part (data, model, output dir, flags) is hostile in one case of four, so about a third of the cases are
    wholly sane and must train: the contract's first clause is tested as often as the others."""
    hostile = {part: draw(st.integers(0, 3)) == 0 for part in ("data", "model", "job", "flags")}
    job_kind = draw(st.sampled_from(["file", "under-file", "long-name", "damaged", "killed-fresh"] if hostile["job"]
                                    else ["fresh", "fresh", "finished"]))
    event(f"output dir: {job_kind}")
    job = folder / "job"
    if job_kind == "finished":
        shutil.copytree(world["finished"], job)
    elif job_kind == "killed-fresh":  # a killed run's checkpoints, and a run that does not resume them
        shutil.copytree(world["killed"], job)
    elif job_kind == "damaged":  # a killed run's checkpoints, each damaged in a drawn way, and resuming
        shutil.copytree(world["killed"], job)
        for checkpoint in sorted((job / "checkpoints").glob("checkpoint-*")):
            damage = draw(st.sampled_from(CHECKPOINT_DAMAGE))
            event(f"checkpoint: {damage}")
            state, weights, manifest = (checkpoint / n for n in ("training_state.pt", "model.safetensors",
                                                                 "manifest.json"))
            if damage == "truncated state":
                state.write_bytes(state.read_bytes()[: draw(st.integers(0, state.stat().st_size - 1))])
            elif damage == "flipped weights":
                data = bytearray(weights.read_bytes())
                data[draw(st.integers(0, len(data) - 1))] ^= 0xFF
                weights.write_bytes(bytes(data))
            elif damage == "no manifest":
                manifest.unlink()
            elif damage == "garbage manifest":
                manifest.write_bytes(draw(st.binary(max_size=40)))
            elif damage == "no weights":
                weights.unlink()
    elif job_kind in ("file", "under-file"):
        job.write_text("not a folder")
        job = job / "sub" if job_kind == "under-file" else job
    elif job_kind == "long-name":
        job = folder / ("x" * 300) / "job"  # ENAMETOOLONG from mkdir, after every permission check
    before = {n: (job / n).read_bytes() for n in FINISHED if job_kind == "finished"}
    if job_kind == "killed-fresh":  # the work a killed run kept: its checkpoints
        before = {str(p.relative_to(job)): p.read_bytes() for p in (job / "checkpoints").rglob("*") if p.is_file()}

    model = draw(st.sampled_from(MODELS)) if hostile["model"] and job_kind != "damaged" else "tiny"
    event(f"model: {model}")
    data = "sample" if job_kind == "damaged" else draw(data_files(folder, hostile["data"]))
    argv = ["--data", data, "--model_name_or_path", world["models"][model], "--output_dir", str(job), *DEFAULTS,
            *(["--resume_from_checkpoint", "auto"] if job_kind == "damaged" else [])]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True)):
        sane, bad = FLAGS[flag]
        values = sane + bad if hostile["flags"] else sane
        if values:  # later flags win: each overrides the safe default above
            argv += [flag, str(draw(st.sampled_from(values)))]
    return argv, job, before


# -- the contract -------------------------------------------------------------------------------------------------
def assert_contract(code: int, out: str, err: str, job: Path, before: dict[str, bytes],
                    overwrite: bool = False) -> None:
    """`overwrite`: --overwrite_output_dir was given, so a failed run may have removed the earlier result (never
    changed it, and never left a metrics.json of its own)."""
    assert code in (0, 2), f"exit {code}: only 0 or 2 without a signal\n{err[-3000:]}"
    assert "Traceback" not in out + err, err[-5000:]
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [i for i, line in enumerate(lines) if ERROR_LINE.match(line)]
        # One error: line, at the end; a list of several bad settings may follow it, indented.
        assert len(errors) == 1 and all(line.startswith("  ") for line in lines[errors[0] + 1:]), (
            f"not one error: line at the end:\n{err[-3000:]}")
        errors = [lines[errors[0]]]
        event(f"error: {re.sub(r'[0-9/].*', '', errors[0].split('error: ', 1)[1])[:60]}")
        if before:  # an earlier finished result, or a killed run's checkpoints, kept byte for byte
            kept = {n: (job / n).read_bytes() for n in before if exists(job / n)}
            assert kept == before or (overwrite and kept == {n: before[n] for n in kept}), "an earlier result lost"
        else:
            assert not exists(job / "metrics.json"), "a failed run left a metrics.json"
        return
    event("exit 0" + (", resumed" if "resumed from" in out else ""))
    metrics = json.loads((job / "metrics.json").read_text())
    assert (job / "model.safetensors").stat().st_size > 0 and (job / "train_config.json").is_file()
    scored = [v for k, v in metrics.items() if isinstance(v, dict) and "accuracy" in v]
    assert scored, f"metrics.json scores no split: {sorted(metrics)}"
    for split in scored:
        assert 0 <= split["accuracy"] <= 1 and not math.isnan(split["accuracy"])


def exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def drawn(cases: int, share: int = 1) -> settings:
    """`cases` in `make test`; NLI_FUZZ_EXAMPLES // `share` in the long setting (`make fuzz`)."""
    long = int(os.environ.get("NLI_FUZZ_EXAMPLES", 0)) // share
    return settings(max_examples=max(long, 1) if long or "NLI_FUZZ_EXAMPLES" in os.environ else cases,
                    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@drawn(30)
@given(case=st.data())
def test_the_command_keeps_its_contract_for_any_drawn_input(world, case):
    with tempfile.TemporaryDirectory(dir=world["base"]) as tmp:
        argv, job, before = case.draw(commands(world, Path(tmp)))
        note(" ".join(argv))
        overwrite = "--overwrite_output_dir" in argv and argv[argv.index("--overwrite_output_dir") + 1] == "True"
        with storage_at(f"http://127.0.0.1:{free_port()}" if "gs://no-answer/pairs.jsonl" in argv else None):
            code, out, err = run_main(argv)
        note(err[-3000:])
        assert_contract(code, out, err, job, before, overwrite)
        assert not (world["base"] / PICKLE_RAN).exists(), "a pickle in a model folder was unpickled"


@contextlib.contextmanager
def storage_at(endpoint: str | None):
    """Cloud Storage at `endpoint` (None: as it is) while the block runs."""
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    if endpoint:
        os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        yield
    finally:
        if endpoint and saved is None:
            del os.environ["STORAGE_EMULATOR_HOST"]
        elif endpoint:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


# -- signals at any moment, then --resume_from_checkpoint auto -------------------------------------------------------
RUN = ["--profile", "smoke", "--data", "sample", "--num_train_epochs", "2", "--per_device_train_batch_size", "8",
       "--max_train_samples", "160", "--precision", "fp32", "--save_steps", "1", "--save_total_limit", "2",
       "--logging_steps", "1", "--no-progress"]


def start(job: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """The command as a terminal starts it: its lines as printed (the test waits for one), SIGINT as Ctrl-C sends it
    (a shell without job control starts background jobs ignoring it). Returns it and its stderr's file."""
    job.parent.mkdir(parents=True, exist_ok=True)
    err = job.parent / f"{job.name}.stderr"
    with open(err, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "nli_helpers.task", *RUN, "--model_name_or_path", tiny_model(),
                                 "--output_dir", str(job), *extra],
                                stdout=subprocess.PIPE, stderr=sink, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, err


def until_data_loaded(proc: subprocess.Popen) -> None:
    """Read the command's output up to its `data:` line: imports and data done, the model and training next."""
    for line in proc.stdout:
        if line.startswith("data:"):
            return


def outcome(job: Path) -> tuple[list, dict]:
    history = [json.loads(line)["loss"] for line in (job / "history.jsonl").read_text().splitlines()]
    metrics = json.loads((job / "metrics.json").read_text())
    return history, {k: v["confusion_matrix"] for k, v in metrics.items() if isinstance(v, dict)
                     and "confusion_matrix" in v}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[tuple, float, float]:
    """The run's outcome, the seconds until its data is loaded, and the seconds after."""
    job = tmp_path_factory.mktemp("uninterrupted") / "job"
    began = time.monotonic()
    proc, err = start(job)
    until_data_loaded(proc)
    loaded = time.monotonic()
    proc.stdout.read()
    assert proc.wait(timeout=600) == 0, err.read_text()[-3000:]
    return outcome(job), loaded - began, time.monotonic() - loaded


@drawn(2, share=25)  # a real run and its resume: 25 times a drawn command line
@given(sig=st.sampled_from([signal.SIGKILL, signal.SIGTERM, signal.SIGINT]),
       phase=st.sampled_from(["starting", "training", "training", "training"]), moment=st.floats(0.0, 1.0))
def test_a_signal_at_any_moment_then_resume_ends_as_an_uninterrupted_run(uninterrupted, tmp_path_factory, sig, phase,
                                                                         moment):
    """A signal while the command starts (imports, data) or after (model, training, checkpoints, the final save)."""
    want, starting_s, training_s = uninterrupted
    job = tmp_path_factory.mktemp("signalled") / "job"
    proc, err_file = start(job)
    if phase == "training":
        until_data_loaded(proc)
    time.sleep(moment * (training_s if phase == "training" else starting_s))
    proc.send_signal(sig)
    proc.stdout.read()
    proc.wait(timeout=600)
    err = err_file.read_text()
    event(f"{signal.Signals(sig).name} while {phase} -> exit {proc.returncode}")
    assert proc.returncode in SIGNAL_ENDINGS, err[-3000:]
    # The one traceback allowed: Ctrl-C while Python itself starts, before the command's code runs (README).
    python_starting = sig == signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt") and "task.py" not in err
    if python_starting:
        event("SIGINT while Python starts")
    assert "Traceback" not in err or python_starting, err[-3000:]
    if proc.returncode != 0 and (job / "metrics.json").exists():
        event("signalled after the run had finished")  # metrics.json is written last: the result is whole
    resumed, resumed_err = start(job, "--resume_from_checkpoint", "auto")
    resumed.stdout.read()
    assert resumed.wait(timeout=600) == 0, resumed_err.read_text()[-3000:]
    assert outcome(job) == want
    shutil.rmtree(job.parent, ignore_errors=True)
