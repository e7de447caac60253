"""nli_helpers: fine-tune a transformer on NLI, in a notebook or on Vertex AI.

The modules, in layers (a module imports only those below it; `make lint` checks it, pyproject.toml
[tool.importlinter]):

    vertex/             Vertex AI, which the trainer never imports: its side of a job (`entry`, the
                        image's ENTRYPOINT; `launch`, torchrun on a cluster) and submitting jobs
    task                the command: flags into a TrainConfig, then a run; exit codes
    run                 one run: load, train, evaluate, save (local or gs://)
    tracking            TensorBoard
    train               the loop, evaluation, scores and log; `should_stop` and callbacks
    checkpoint, model,  exact resume; loading and predicting; the pieces of a step (loader,
    step                inputs as the model takes them, optimizer, torch.compile)
    data, distributed   a file on disk to a padded batch (read, normalise, split by premise,
                        tokenise with a cache, length-grouped batches); ranks, devices, precision
    storage             gs:// and local paths
    config              TrainConfig, the profiles, errors
    mnli                where real MultiNLI is on this machine: ../shared/data or the hub's cache

Beside the trainer: `notebook_runs` (what the notebooks share).

Heavy libraries (torch, transformers) load when you import those modules, not here.
"""

from .config import ConfigError, NLIError, TrainConfig, __version__, make_config

__all__ = ["ConfigError", "NLIError", "TrainConfig", "__version__", "make_config", "run_training",
           "predict", "load_nli_splits"]


def __getattr__(name: str):
    # Lazy, so `import nli_helpers` (and `--help`) stays fast.
    if name == "run_training":
        from .run import run_training

        return run_training
    if name == "predict":
        from .model import predict

        return predict
    if name == "load_nli_splits":
        from .data import load_nli_splits

        return load_nli_splits
    raise AttributeError(f"module 'nli_helpers' has no attribute {name!r}")
