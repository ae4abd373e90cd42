"""FlashRAG's dense encoder recipe: a transformers model, its output pooled, normalised, prefixed.

FlashRAG (`flashrag/retriever/encoder.py`, `utils.py`) and Search-R1
(`search_r1/search/retrieval_server.py`) embed a text as: prefix + text, tokenised with truncation
at `max_length`, `AutoModel`, then the mean of the last hidden states over the attention mask
(e5, contriever), the first token's (bge) or the pooler output (DPR), L2-normalised for every model
but DPR. `PooledEncoder` does the same behind sentence-transformers' `encode`, so a
`DenseRetriever` over an index they built embeds its queries as they do. The defaults are
FlashRAG's own rules: the prefixes by the model's name (`set_default_instruction`: e5 `query: ` /
`passage: `, bge its query instruction), the pooling from the model folder's
`1_Pooling/config.json` (what FlashRAG's index builder reads), else by name (`model2pooling`),
else mean. It runs in float32 (FlashRAG runs fp16 on a GPU; the vectors agree to about 1e-3).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rigkit.errors import InputError, ModelNotFoundError

__all__ = ["POOLINGS", "QUERY_MAX_LENGTH", "PASSAGE_MAX_LENGTH", "PooledEncoder", "default_prefixes",
           "default_pooling", "normalizes"]

POOLINGS = ("mean", "cls", "pooler")
QUERY_MAX_LENGTH = 128  # FlashRAG's retrieval_query_max_length (Search-R1's server: 256)
PASSAGE_MAX_LENGTH = 180  # the --max_length of FlashRAG's and Search-R1's index builders
# FlashRAG's model2pooling (flashrag/config/basic_config.yaml): the first key in the name decides
NAME_POOLING = {"e5": "mean", "bge": "cls", "contriever": "mean", "jina": "mean", "dpr": "pooler"}
BGE_QUERY = "Represent this sentence for searching relevant passages: "
BGE_QUERY_ZH = "为这个句子生成表示以用于检索相关文章："


def _name_key(model: str) -> str:
    """What FlashRAG's name rules look at: the model's own name, not the folders above it."""
    return Path(model.rstrip("/")).name.lower()


def default_prefixes(model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) FlashRAG's `set_default_instruction` gives `model`."""
    key = _name_key(model)
    query = passage = ""
    if "e5" in key:
        query, passage = "query: ", "passage: "
    if "bge" in key:  # FlashRAG also picks the Chinese one per query by language; here by name
        query = BGE_QUERY_ZH if "zh" in key else BGE_QUERY
    return query, passage


def default_pooling(model: str, folder: str | Path | None) -> str:
    """The pooling FlashRAG uses for `model` (loaded from `folder`): the folder's
    sentence-transformers pooling config, else its name table, else mean."""
    config = Path(folder) / "1_Pooling" / "config.json" if folder is not None else None
    if config is not None and config.is_file():
        try:
            modes = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            modes = {}
        for key, value in modes.items():
            if key.startswith("pooling_mode") and value is True:
                return {"mean_tokens": "mean", "cls_token": "cls"}.get(key.split("pooling_mode_")[-1], "mean")
    key = _name_key(model)
    return next((pooling for name, pooling in NAME_POOLING.items() if name in key), "mean")


def normalizes(model: str) -> bool:
    """FlashRAG normalises every encoder's vectors but DPR's (inner-product trained)."""
    return "dpr" not in _name_key(model)


class PooledEncoder:
    """`model` (a hub id or folder) embedding by FlashRAG's recipe; loads at the first `encode`.

    `prompts` are sentence-transformers' role prompts: "query" and "document" (passages) get their
    prefix, as `rigkit.retrieval.dense.embed_texts` asks. One call at a time (a fast tokenizer is
    not safe across threads; torch parallelises a batch itself)."""

    def __init__(self, model: str, pooling: str, query_prefix: str = "", passage_prefix: str = "",
                 max_length: int = QUERY_MAX_LENGTH, normalize: bool = True, device: str | None = None):
        if pooling not in POOLINGS:
            raise InputError(f"unknown pooling {pooling!r}; choose from {POOLINGS}")
        if max_length < 2:
            raise InputError(f"max_length {max_length}: at least 2 tokens")
        self.model_name, self.pooling = model, pooling
        self.prompts = {"query": query_prefix, "document": passage_prefix}
        self.max_length, self.normalize = max_length, normalize
        self._device = device
        self._model = self._tokenizer = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from rigkit.embeddings import resolve_model_path

        path = resolve_model_path(self.model_name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
            model = AutoModel.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise ModelNotFoundError(
                f"encoder {self.model_name!r} could not be loaded ({err}); give the folder (or hub id) "
                "of the model the faiss index was built with"
            ) from err
        device = self._device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._model, self._tokenizer = model.to(device).eval(), tokenizer

    def encode(self, texts: str | Sequence[str], batch_size: int = 64, prompt_name: str | None = None,
               max_length: int | None = None, **_ignored) -> np.ndarray:
        """(n, dim) float32 (or (dim,) for one string). sentence-transformers' other options
        (normalize_embeddings, convert_to_numpy, ...) are fixed by the recipe."""
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        prefix = self.prompts.get(prompt_name, "") if prompt_name else ""
        step = max(1, batch_size)
        with self._lock:
            if self._model is None:
                self._load()
            parts = [self._batch([prefix + t for t in items[start:start + step]], max_length or self.max_length)
                     for start in range(0, len(items), step)]
        vectors = np.concatenate(parts) if parts else np.zeros((0, self._model.config.hidden_size), np.float32)
        return vectors[0] if single else vectors

    def _batch(self, texts: list[str], max_length: int) -> np.ndarray:
        import torch

        inputs = self._tokenizer(texts, max_length=max_length, padding=True, truncation=True,
                                 return_tensors="pt")
        inputs = {k: v.to(self._model.device) for k, v in inputs.items()}
        with torch.inference_mode():
            output = self._model(**inputs, return_dict=True)
            if self.pooling == "mean":
                mask = inputs["attention_mask"]
                hidden = output.last_hidden_state.masked_fill(~mask[..., None].bool(), 0.0)
                vectors = hidden.sum(dim=1) / mask.sum(dim=1)[..., None]
            elif self.pooling == "cls":
                vectors = output.last_hidden_state[:, 0]
            else:
                vectors = output.pooler_output
            if self.normalize:
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return vectors.float().cpu().numpy()
