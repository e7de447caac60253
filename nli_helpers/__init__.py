"""nli_helpers: fine-tune a transformer on natural-language inference, on a notebook or on Vertex AI.

The modules, in the order data flows through them: `config` (TrainConfig, profiles) -> `data`
(load, split by premise, tokenise, length-grouped batches) -> `model` (tokenizer + classifier,
predict) -> `train` (the loop, export) -> `metrics`. `task` is the command line on top. Around the loop:
`checkpoint` (exact resume), `tracking` (TensorBoard, the hypertune report), `distributed` / `launch`
(torchrun, Vertex clusters); after it: `evaluation` (scores, calibration, errors, prediction on files).
In the cloud: `storage` (gs://), `packaging`, `vertex` (jobs), `tuning` (sweeps and tuning jobs), `pricing`.
Heavy libraries (torch, transformers) load when you import those modules, not here.
"""

from .config import ConfigError, NLIError, TrainConfig, make_config

__version__ = "0.1.0"
__all__ = ["ConfigError", "NLIError", "TrainConfig", "make_config", "run_training", "predict",
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
