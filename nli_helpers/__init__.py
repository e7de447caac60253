"""nli_helpers: fine-tune a transformer on natural-language inference, on a notebook or on Vertex AI.

The modules, in layers (a module imports only those below it; `make lint` checks it, pyproject.toml
[tool.importlinter]):

    task, launch            the commands a job runs: train + evaluate; torchrun on a Vertex cluster
    run                     one training run, saved (local or gs://)
    tracking                TensorBoard and the hypertune report (callbacks of the loop)
    train | vertex/         the loop, its scores and logging | Vertex AI jobs, the [vertex] extra (never
                            imported by the trainer)
    checkpoint, batching,   exact resume; tokenising and length-grouped batches; loading and predicting;
    model, packaging        the sdist and the venv the trainer image would be
    data, distributed,      labels, splits, sources; processes, ranks, devices and precision; where
    notebook_runs           notebook runs go
    storage, tables         gs:// and local paths; reading one file
    config                  TrainConfig, profiles, errors

Heavy libraries (torch, transformers) load when you import those modules, not here.
"""

from .config import ConfigError, NLIError, TrainConfig, __version__, make_config

__all__ = ["ConfigError", "NLIError", "TrainConfig", "__version__", "make_config", "run_training", "predict",
           "load_nli_splits"]


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
