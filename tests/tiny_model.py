"""The tiny random model the tests train: a two-layer BERT with a word-piece vocabulary of the
bundled sample, built once per machine. A test-only builder: the package never ships it.

    >>> from tests.tiny_model import tiny_model
    >>> run_task("--model_name_or_path", tiny_model(), ...)
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import torch
from filelock import FileLock
from safetensors.torch import save_model
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from nli_helpers.config import LABELS, cache_dir
from nli_helpers.data import SAMPLE_PATH

ID2LABEL = dict(enumerate(LABELS))
LABEL2ID = {name: i for i, name in ID2LABEL.items()}

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


def tiny_model() -> str:
    return str(_tiny_random_path())


@lru_cache(maxsize=1)
def _tiny_random_path() -> Path:
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
