"""nli_helpers: fine-tune a transformer on NLI, in a notebook or on Vertex AI.

The modules, in layers (a module imports only those below it; `make lint` checks it, pyproject.toml
[tool.importlinter]):

    vertex/             Vertex AI, which the trainer never imports: its side of a job (`entry`, the
                        image's ENTRYPOINT; `launch`, torchrun on a cluster) and submitting jobs
    task                the command: flags and --config into a TrainConfig, then a run
    run                 one run: load, train, evaluate, save (local or gs://)
    notebook_runs       what the notebooks share (run folders, scores as a table, `predict`
                        through transformers' pipeline)
    train               the loop, evaluation and scores; `should_stop`
    tracking            the log (a bar or plain lines), the observers (`TrainCallback`), TensorBoard
    checkpoint, model,  exact resume; loading the model and tokenising the pairs (with a cache);
    step                the pieces of a step (loader, batches of similar length, padded; inputs as
                        the model takes them, optimizer) and torch.compile with its counts
    data, distributed   a file's rows to checked pairs, split by premise; ranks, devices,
                        precision, the GPU guard
    files               local paths and gs:// through fsspec, and one reader per file format
    config              TrainConfig under Hugging Face's names, the profiles, errors
    mnli                where real MultiNLI is on this machine: ../shared/data or the hub's cache

To follow one optimizer step and one save from the command, read five files: task.py (`main`) ->
run.py (`run_training`) -> train.py (`train`, the loop) -> step.py (`optimizer_step`) ->
checkpoint.py (`save_training`, `written_whole`: a folder written aside, its marker copied last).

Heavy libraries (torch, transformers) load when you import those modules, not here.
"""

import importlib
import os

from .config import ConfigError, NLIError, TrainConfig, __version__, cache_dir, make_config

# torch makes torch.compile's kernel cache folder when dynamo is imported (transformers imports
# it to load a model), by default an empty torchinductor_<user> in TMPDIR after every run. Here it
# is one of the package's caches, where a compiled run's kernels wait for the next run.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "torchinductor"))

__all__ = ["ConfigError", "NLIError", "TrainConfig", "__version__", "make_config", "run_training",
           "predict", "load_nli_splits"]


def lazy_attributes(package: str, where: dict[str, str]):
    """A package's `__getattr__` (PEP 562) that imports the module `where[name]` names (relative to
    `package`) on first use, so that `import package` stays fast and a process imports only what
    it uses. The package's one lazy-import mechanism: nli_helpers and nli_helpers.vertex use it."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name], package), name)

    return __getattr__


# Lazy, so that `import nli_helpers` (and `--help`) stays fast.
__getattr__ = lazy_attributes(__name__, {"run_training": ".run", "predict": ".notebook_runs",
                                         "load_nli_splits": ".data"})
