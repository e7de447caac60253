"""The notebooks' shape, checked without running them (nbval runs them: see notebooks/README.md).

What is checked here: one `parameters` cell right after the imports, every parameter a TrainConfig
field of the same type or a documented notebook-only one, the params/*.yaml files use known names
with the right types, short cells with prose before each, the STYLE.md outline, the markdown within its word budgets, and outputs
stripped (correctness comes from assert cells, so there must be some, and no NBVAL_CHECK_OUTPUT
marker that a stripped notebook would silently skip).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import nbformat
import papermill
import pytest
import yaml

from nli_helpers.config import PROFILES, TrainConfig, make_config
from tests.helpers import ROOT

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
PARAM_FILES = sorted((NOTEBOOK_DIR / "params").glob("*.yaml"))
# A parameter that is not a TrainConfig field says so in its comment ("notebook-only: ...") and is documented
# in notebooks/README.md; its type is its annotation.
NOTEBOOK_ONLY_PREFIX = "notebook-only:"
MAX_CELL_LINES = 25  # room for a training loop written out, as the tutorials people learn from show it
OUTLINE = ("## What you will learn", "## Cost and run time", "## Before you begin", "## Set up",
           "## What you learned", "## Exercises", "## Clean up", "## Next steps")
# The calls a learner came to learn, by notebook: each must appear in a code cell (issue 19's list), before the
# package's version of the same step is used.
REAL_CALLS = {
    "01_explore_mnli": ["load_dataset(", "AutoTokenizer.from_pretrained(", "DataCollatorWithPadding(",
                        ".convert_ids_to_tokens(", "token_type_ids"],
    "02_finetune_local": ["AutoModelForSequenceClassification.from_pretrained(", "torch.optim.AdamW(",
                          "get_linear_schedule_with_warmup(", ".backward()", "clip_grad_norm_(",
                          "torch.autocast(", "optimizer.step()", "inspect.getsource(train)",
                          "ConfusionMatrixDisplay(",
                          "TrainingArguments(", "Trainer(", "trainer.train()"],
    "03_package_trainer": ["docker build", "gcloud builds submit", "docker run"],
    "04_submit_vertex": ["aiplatform.init(", "worker_pool_specs", "aiplatform.CustomJob(", ".submit(",
                         "restart_job_on_worker_restart", "base_output_dir"],
    "05_tune_hyperparameters": ["hypertune", "aiplatform.HyperparameterTuningJob(", "hpt.DoubleParameterSpec(",
                                "aiplatform.CustomJob("],
    "06_evaluate_and_predict": ["AutoModelForSequenceClassification.from_pretrained(", "torch.no_grad()",
                                "softmax(", "LogisticRegression(", "pd.read_json(", ".to_json("],
    "07_deploy_and_predict": ["aiplatform.Model.upload(", ".upload_from_filename(", ".batch_predict(",
                              ".iter_outputs()", "aiplatform.Endpoint.create(", ".deploy(", ".predict(",
                              ".delete(force=True)", "pipeline("],
}
FIELD_TYPES = typing.get_type_hints(TrainConfig)

ids = [nb.stem for nb in NOTEBOOKS]


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def ipython_only(line: str) -> bool:
    """A magic (`%matplotlib inline`), a shell escape (`!ls`) or help (`train??`): IPython, not Python."""
    return line.lstrip().startswith(("%", "!")) or line.rstrip().endswith("?")


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def parameters(path: Path) -> dict:
    return papermill.inspect_notebook(str(path))


def annotation(param) -> object:
    """The evaluated annotation of a papermill parameter, e.g. Optional[int] from "Optional[int]"."""
    return eval(param["inferred_type_name"], {"Optional": typing.Optional})


def notebook_only(path: Path) -> dict[str, dict]:
    return {n: p for n, p in parameters(path).items() if n not in FIELD_TYPES}


def base_types(hint) -> set:
    """`int | None`, `Optional[int]` and `int` all give {int}."""
    args = typing.get_args(hint)
    return {a for a in args if a is not type(None)} if args else {hint}


def test_notebooks_exist():
    assert [nb.name for nb in NOTEBOOKS][:2] == ["01_explore_mnli.ipynb", "02_finetune_local.ipynb"]
    assert {p.name for p in PARAM_FILES} >= {"smoke.yaml", "full.yaml"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_one_parameters_cell_right_after_the_imports(path):
    cells = code_cells(read(path))
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert tagged == [1], f"{path.name}: want exactly one parameters cell, the second code cell; got {tagged}"
    assert "import " in cells[0].source, "the first code cell is the set-up imports"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_parameter_is_a_typed_trainconfig_field_or_documented(path):
    params = parameters(path)
    source = code_cells(read(path))[1].source
    assignments = [line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(params) == len(assignments), "papermill could not parse every line of the parameters cell " \
        "(it drops `int | None` annotations and lines with a second '=': use Optional[int], no '=' in comments)"
    assert "profile" in params
    for name, p in params.items():
        assert p["help"], f"{name} has no comment"
        hint = annotation(p)
        assert hint is not None, f"{name} has no type annotation"
        if name not in FIELD_TYPES:
            assert p["help"].startswith(NOTEBOOK_ONLY_PREFIX), \
                f"{name} is not a TrainConfig field: start its comment with {NOTEBOOK_ONLY_PREFIX!r}"
            continue
        assert base_types(hint) == base_types(FIELD_TYPES[name]), f"{name}: {hint} vs {FIELD_TYPES[name]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_the_cheap_recipe_is_the_default_and_nothing_reads_the_hardware_to_choose(path):
    # No notebook picks the expensive recipe, locally or for a cloud job, from this machine's GPU or the hub.
    assert parameters(path)["profile"]["default"] == '"smoke"'
    code = "\n".join(c.source for c in nbformat.read(path, 4).cells if c.cell_type == "code")
    assert "cuda.is_available" not in code and "hub_reachable" not in code
    assert not re.search(r"profile\W{1,12}[\"']auto", code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_parameter_defaults_make_a_valid_config(path):
    values = {n: ast.literal_eval(p["default"]) for n, p in parameters(path).items()}
    fields = {n: v for n, v in values.items() if n in FIELD_TYPES and n != "profile"}
    assert make_config("smoke", **fields).profile == "smoke"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_notebook_only_parameters_are_documented(path):
    readme = (NOTEBOOK_DIR / "README.md").read_text()
    missing = [name for name in notebook_only(path) if f"`{name}`" not in readme]
    assert not missing, f"document {missing} in notebooks/README.md"


@pytest.mark.parametrize("params_file", PARAM_FILES, ids=[p.stem for p in PARAM_FILES])
def test_params_files_use_known_names_with_the_right_types(params_file):
    values = yaml.safe_load(params_file.read_text())
    declared = {name: p for nb in NOTEBOOKS for name, p in parameters(nb).items()}
    assert set(values) <= set(declared), f"unknown: {set(values) - set(declared)}"
    for name, value in values.items():
        want = base_types(FIELD_TYPES[name] if name in FIELD_TYPES else annotation(declared[name]))
        if float in want:
            want.add(int)  # YAML reads 2 as an int; but 2e-5 without a dot is a *string*
        assert type(value) in want or value is None, f"{params_file.name}: {name}={value!r} is not {want}"
    # a profile's file names it; an overlay such as rehearsal.yaml (laid over full.yaml) names none
    assert values.get("profile") == (params_file.stem if params_file.stem in PROFILES else None)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_code_cells_are_short_and_follow_prose(path):
    cells = read(path).cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        lines = cell.source.strip().splitlines()
        assert len(lines) <= MAX_CELL_LINES, f"cell {i} has {len(lines)} lines:\n{cell.source}"
        assert i > 0 and cells[i - 1].cell_type == "markdown", f"cell {i} has no prose before it:\n{cell.source}"
        assert "%%writefile" not in cell.source and "sys.exit" not in cell.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_outline_follows_style(path):
    markdown = [c.source for c in read(path).cells if c.cell_type == "markdown"]
    assert markdown[0].startswith("# "), "the first cell is the title"
    assert len(markdown[0].strip().splitlines()) >= 2, "a one-line purpose follows the title"
    positions = [next((i for i, text in enumerate(markdown) if text.startswith(h)), None) for h in OUTLINE]
    assert None not in positions, dict(zip(OUTLINE, positions))
    assert positions == sorted(positions), "outline sections out of order"


# Issue 38's word budgets for the markdown, counted exactly as the shared tool ../shared/tools/notebook_words.py
# counts them (copied, since a fresh clone has nothing beside it): a word is a run of letters or digits with inner
# apostrophes and hyphens, in the joined source of every markdown cell; "before" is the cells ahead of the first
# code cell. The HF course gets to code within a paragraph; so does each notebook here.
WORD = re.compile(r"\b\w[\w'-]*\b")
MAX_WORDS, MAX_WORDS_PER_NOTEBOOK, MAX_WORDS_BEFORE_CODE = 12_000, 2_400, 200  # 12,000 with notebook 07 (issue 49)


def markdown_words(path: Path) -> tuple[int, int]:
    """(words of markdown in the notebook, words of it before the first code cell)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    counts = [len(WORD.findall("".join(c["source"]))) if c["cell_type"] == "markdown" else 0 for c in cells]
    first = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    return sum(counts), sum(counts[:first])


def test_word_rule_counts_as_the_shared_tool_does():
    # contractions and hyphenated words are one word; backticks, links' punctuation and numbers' commas split
    assert WORD.findall("Don't two-epoch `tokenizer(premise, hypothesis)` 2,994 [a](https://x.org/b-c)") == [
        "Don't", "two-epoch", "tokenizer", "premise", "hypothesis", "2", "994", "a", "https", "x", "org", "b-c"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_markdown_within_its_word_budget(path):
    words, before_code = markdown_words(path)
    assert words <= MAX_WORDS_PER_NOTEBOOK, (
        f"{path.name} has {words} words of markdown (at most {MAX_WORDS_PER_NOTEBOOK}): cut repetition, not lessons")
    assert before_code <= MAX_WORDS_BEFORE_CODE, (
        f"{path.name} has {before_code} words before its first code cell (at most {MAX_WORDS_BEFORE_CODE})")


def test_notebooks_markdown_within_the_total_budget():
    total = sum(markdown_words(path)[0] for path in NOTEBOOKS)
    assert total <= MAX_WORDS, f"the notebooks hold {total} words of markdown (at most {MAX_WORDS})"


# A run's length or rate written in prose is true for one profile and false on the other (issue 48: "two epochs at
# 2e-4" above a config of six): the notebook prints it from the config instead. "every N steps" is an instruction.
RECIPE_IN_PROSE = re.compile(r"\b(?<!every )(?:\d[\d,]*|two|three|four|five|six)\s+(?:epochs|steps)\b"
                             r"|\bat \d(?:\.\d+)?e-\d\b", re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_prose_states_no_run_length_or_rate_the_config_prints(path):
    for cell in read(path).cells:
        if cell.cell_type == "markdown" and (found := RECIPE_IN_PROSE.search(cell.source)):
            raise AssertionError(f"{path.name} cell {cell.id} says {found.group(0)!r}: print it from the config")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_committed_stripped_with_assert_cells(path):
    nb = read(path)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in code_cells(nb):
        assert cell.outputs == [] and cell.execution_count is None, "commit notebooks with outputs stripped"
        # With stripped outputs nbval compares nothing, so an output marker would be a silent no-op.
        assert "NBVAL_CHECK_OUTPUT" not in cell.source
    asserts = [c for c in code_cells(nb) if any(line.lstrip().startswith("assert ") for line in c.source.splitlines())]
    assert len(asserts) >= 3, "correctness comes from assert cells"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_each_notebook_shows_the_real_api_in_its_code_cells(path):
    code = "\n".join(c.source for c in code_cells(read(path)))
    missing = [call for call in REAL_CALLS[path.stem] if call not in code]
    assert not missing, f"{path.name} never shows {missing} in a code cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_each_notebook_links_the_documentation_and_keeps_ci_out_of_the_lesson(path):
    markdown = [c.source for c in read(path).cells if c.cell_type == "markdown"]
    links = re.findall(r"\]\((https://[^)]+)\)", "\n".join(markdown))
    assert len(links) >= 3, f"{path.name} links {len(links)} documentation pages; link the page of each step"
    lesson = "\n".join(markdown)
    assert not re.search(r"\b(CI|nbval)\b", lesson), "how CI runs the notebooks is notebooks/README.md's, not the lesson's"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_cell_rebinds_a_name_the_notebook_imported(path):
    """`sweep = sweep.local_sweep(...)` works once, then every later `sweep.` call fails: results get their own names."""
    trees = [ast.parse("\n".join(line for line in cell.source.splitlines() if not ipython_only(line)))
             for cell in code_cells(read(path))]
    imported = {(alias.asname or alias.name).split(".")[0] for tree in trees for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    bound = {target.id for tree in trees for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.For))
             for target in ast.walk(node.targets[0] if isinstance(node, ast.Assign) else node.target)
             if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)}
    assert not imported & bound, f"these names are imported and then assigned: {sorted(imported & bound)}"


def test_full_params_are_the_reference_recipe():
    values = yaml.safe_load((NOTEBOOK_DIR / "params" / "full.yaml").read_text())
    fields = {k: v for k, v in values.items() if k in FIELD_TYPES and k != "profile"}
    cfg = make_config("full", **fields)
    assert (cfg.model_name_or_path, cfg.num_train_epochs, cfg.per_device_train_batch_size,
            cfg.learning_rate) == ("roberta-base", 2, 32, 2e-5)
    assert dataclasses.asdict(cfg)["data"] == "nyu-mll/multi_nli"


# Every call that starts billable work on Google Cloud, and the yes that must guard it in the same cell.
BILLING_CALLS = re.compile(r"\bjob\.submit\(|\.run\(sync=|submit_custom_job\(|\.batch_predict\(|\.deploy\(")
YES = re.compile(r"vertex\.confirm_submit\(cloud, (submit|deploy),|if run_multi_worker:")


@pytest.mark.parametrize("name", ["04_submit_vertex", "05_tune_hyperparameters", "07_deploy_and_predict"])
def test_run_all_on_google_cloud_submits_nothing_without_a_yes(name):
    """Issue 27: with a bucket set and every parameter at its default, Run All bills nothing. The defaults are
    practice mode and no submission; each cell that would start a job on Google Cloud asks for its own yes first,
    after printing the cost."""
    path = NOTEBOOK_DIR / f"{name}.ipynb"
    defaults = {n: p["default"] for n, p in parameters(path).items()}
    assert defaults["cloud"] == '"practice"' and defaults["submit"] == "False", defaults
    assert defaults.get("multi_worker", "None") == "None"  # 04: on Google Cloud only when asked
    assert defaults.get("deploy", "False") == "False"  # 07: an endpoint bills by the hour
    billing = [c.source for c in code_cells(read(path)) if BILLING_CALLS.search(c.source)]
    assert billing, "the notebook submits nothing: the check would pass on nothing"
    for source in billing:
        guard, call = YES.search(source), BILLING_CALLS.search(source)
        assert guard and guard.start() < call.start(), f"a job is submitted without asking first:\n{source}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_import_of_a_notebook_is_used(path, tmp_path):
    """A lesson that imports what it never calls sends the learner looking for it (ruff's F401 on the code cells)."""
    def python(line: str) -> str:  # `train??` reads `train`: keep the name, drop IPython's help
        return line.rstrip().rstrip("?") if line.rstrip().endswith("?") else "" if ipython_only(line) else line

    code = "\n\n".join("\n".join(map(python, cell.source.splitlines())) for cell in code_cells(read(path)))
    script = tmp_path / f"{path.stem}.py"
    script.write_text(code + "\n")
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F401", str(script)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_every_job_the_notebooks_submit_runs_as_the_service_account_parameter():
    """docs/SECURITY.md, section 2: no job runs as the service agent when the learner names a trainer account."""
    for name in ("04_submit_vertex.ipynb", "05_tune_hyperparameters.ipynb"):
        tree = ast.parse("\n".join(cell.source for cell in code_cells(nbformat.read(NOTEBOOK_DIR / name, 4))))
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and
                 getattr(node.func, "attr", None) in ("submit", "submit_custom_job", "run") and
                 ast.unparse(node.func) in ("job.submit", "vertex.submit_custom_job", "hp_job.run")]
        assert calls, name
        for call in calls:
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            assert keywords.get("service_account") == "service_account", (name, ast.unparse(call))


@pytest.mark.parametrize("params_file", PARAM_FILES, ids=[p.stem for p in PARAM_FILES])
def test_make_demo_gives_each_notebook_only_the_parameters_it_declares(params_file):
    sys.path.insert(0, str(NOTEBOOK_DIR))
    from demo import declared, merged  # notebooks/demo.py, which make demo runs

    given = {path.stem: declared(path, merged([params_file])) for path in NOTEBOOKS}
    for path in NOTEBOOKS:
        assert set(given[path.stem]) <= set(parameters(path)), path.name
    names = set(yaml.safe_load(params_file.read_text()))
    assert names == set().union(*given.values()), f"{params_file.name}: a name no notebook declares"


def test_the_executed_notebook_check_finds_ansi_raw_floats_and_undeclared_parameters(tmp_path):
    from tests.executed_notebooks import findings

    def cell(source, tags=(), outputs=()):
        return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}, "outputs": list(outputs)}

    clean = [cell("profile: str = 'smoke'\nseed: int = 42", ["parameters"]), cell("seed = 0", ["injected-parameters"]),
             cell("print(1 / 3)", outputs=[{"output_type": "stream", "text": ["accuracy 0.333 on 39 pairs\n"]}])]
    (tmp_path / "clean.ipynb").write_text(json.dumps({"cells": clean}))
    assert findings(tmp_path / "clean.ipynb") == []
    noisy = [cell("profile = 'smoke'", ["parameters"]), cell("poll_s = 2.0", ["injected-parameters"]),
             cell("x", outputs=[{"output_type": "execute_result", "data": {"text/plain": "0.3333333333333333"}}]),
             cell("y", outputs=[{"output_type": "stream", "text": "[transformers] \x1b[1mLOAD REPORT\x1b[0m"}])]
    (tmp_path / "noisy.ipynb").write_text(json.dumps({"cells": noisy}))
    found = findings(tmp_path / "noisy.ipynb")
    assert found[0] == "noisy.ipynb: papermill injected poll_s, which its parameters cell does not declare"
    assert "cell 2: a raw float 0.3333333333333333" in found[1] and "cell 3: an ANSI escape" in found[2]

