"""The token cache: a split is tokenised once per machine, under a key of everything its tokens
depend on, and read back while the entry is whole. Off the learner's path: `data.tokenize_splits`
uses it, and `content_hash` is also a resume's check that its data did not change.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pyarrow as pa
from datasets import Dataset
from filelock import FileLock
from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# Texts are cut to this many characters per token of max_length: the same tokens for any real text,
# but the fast tokenizer's pair truncation builds every combination of both texts' overflow windows
# (huggingface/tokenizers#2035): tens of GB for two 20,000-token texts.
CHARS_PER_TOKEN_CAP = 32
CACHE_FORMAT = 1  # part of every key: bump it when tokenize_splits gives other columns or values


def cache_key(split, tokenizer, max_length: int) -> str:
    """A hash of all the tokens depend on: the split's content, the whole tokenizer (not its name:
    two copies give the same tokens), max_length and this code's format."""
    digest = hashlib.sha256()
    # The tokenizer as saved, less the truncation and padding that its last call left set.
    saved = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    saved.no_truncation()
    saved.no_padding()
    for part in (f"format {CACHE_FORMAT} cap {CHARS_PER_TOKEN_CAP} max_length {max_length}",
                 type(tokenizer).__name__, tokenizer.truncation_side,
                 " ".join(tokenizer.model_input_names), saved.to_str(),
                 content_hash(split)):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def content_hash(split) -> str:
    """SHA-256 of a split's rows in order (Arrow IPC bytes, less datasets' fingerprint of how it was
    made, e.g. the tokenizer's folder): the token cache's key and a resume's check of its data."""
    table = split.with_format("arrow")[:].combine_chunks().replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def cached_map(tokenise, path: Path, rows: int) -> tuple[Dataset, bool]:
    """(split, hit): read from `path` if it holds all `rows`, else tokenised into it. A file lock
    makes one process tokenise while the others wait; datasets writes a temporary file and renames
    it, so a killed run leaves no entry; a damaged one is rebuilt."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if path.exists():
                try:
                    cached = Dataset.from_file(str(path))
                    problem = f"{len(cached):,} rows instead of {rows:,}"
                    if len(cached) == rows:
                        log.info("tokens read from the cache: %s", path)
                        return cached, True
                except Exception as e:  # pyarrow and datasets raise several types for damage
                    problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("token cache entry %s is damaged (%s); tokenising again", path.name,
                            problem)
            return tokenise(cache_file_name=str(path), load_from_cache_file=False), False
    except OSError as e:  # a read-only or full disk must not stop a run: tokenise in memory
        log.warning("token cache %s unusable (%s); tokenising without it", path.parent, e)
        return tokenise(), False
