"""`open_retriever(config)`: the one call the RIG loop makes to get its retriever.

- `config.index` set: load that saved index; settings that differ from it are an error.
- `config.corpus` set: an implicit index, cached under the user cache folder and keyed by the
  corpus bytes and every build parameter, so an edited corpus or a new chunk size rebuilds it.
- neither: the same, for the demo corpus shipped in the source tree (`data/demo/corpus.jsonl`).
An index whose vectors live in Milvus (`retrieval.dense_backend: milvus`) is always an explicit
one, built by `rigkit index build --dense-backend milvus`.
The cache folder is `platformdirs.user_cache_dir("rigkit")/indexes` (or `$RIGKIT_CACHE_DIR`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from rigkit.config import RetrievalConfig
from rigkit.errors import CorpusError, IndexMismatchError, InputError
from rigkit.files import cache_root
from rigkit.retrieval.base import NoRetriever, Retriever
from rigkit.retrieval.index import FORMAT_VERSION, Index, check_manifest, resolve_chunk_size
from rigkit.retrieval.tokenize import TOKENIZER_VERSION, use_user_dict, user_dict_record

__all__ = ["RETRIEVERS", "RetrieverFactory", "open_retriever", "open_index", "demo_corpus_path", "cache_dir"]

log = logging.getLogger(__name__)
_DEFAULTS = RetrievalConfig()


def demo_corpus_path() -> Path:
    """data/demo/corpus.jsonl of the source tree this package was imported from."""
    import rigkit

    path = Path(rigkit.__file__).resolve().parent.parent / "data" / "demo" / "corpus.jsonl"
    if not path.exists():
        raise CorpusError(
            f"the demo corpus is not at {path} (it ships with the source tree, not the wheel); "
            "pass a corpus (--corpus / retrieval.corpus) or a saved index (--index / retrieval.index)"
        )
    return path


def cache_dir() -> Path:
    return cache_root() / "indexes"


def _build_params(config: RetrievalConfig) -> dict:
    from rigkit.embeddings import canonical_model_name

    return {
        "embedding_model": canonical_model_name(config.embedding_model),
        "chunk_size": resolve_chunk_size(config.embedding_model, config.chunk_size),
        "overlap": config.overlap,
        "bm25_method": config.bm25_method,
        "k1": config.k1,
        "b": config.b,
        "dense_index": config.dense_index,
    }


def open_index(config: RetrievalConfig) -> Index:
    """The index `config` describes: explicit (checked), or implicit (cached, rebuilt on change)."""
    use_user_dict(config.user_dict)  # Chinese BM25 tokens, for building and for queries
    if config.index is not None:
        # Fields left at their defaults defer to the index; fields the user set must match it.
        expected = {
            name: getattr(config, name)
            for name in ("bm25_method", "k1", "b", "dense_index", "dense_backend")
            if getattr(config, name) != getattr(_DEFAULTS, name)
        }
        index = Index.load(config.index, milvus_uri=config.milvus_uri,
                           milvus_token_env=config.milvus_token_env)
        check_manifest(
            index.manifest,
            Path(config.index),
            config.embedding_model,
            chunk_size=config.chunk_size,
            **expected,
        )
        return index
    if config.dense_backend != "faiss":  # a collection on a server is made on purpose, not cached
        raise InputError(f"retrieval.dense_backend {config.dense_backend!r} needs a built index: "
                         f"`rigkit index build --corpus CORPUS --out DIR --dense-backend {config.dense_backend}`, "
                         "then --index DIR (retrieval.index)")
    corpus = Path(config.corpus) if config.corpus is not None else demo_corpus_path()
    if not corpus.exists():
        raise CorpusError(f"{corpus}: corpus not found")
    from rigkit.corpus import corpus_fingerprint

    params = _build_params(config)
    key_source = json.dumps(
        {
            "corpus": corpus_fingerprint(corpus),
            "format": FORMAT_VERSION,
            "tokens": TOKENIZER_VERSION,
            **user_dict_record(),
            **params,
        },
        sort_keys=True,
    )
    folder = cache_dir() / f"{corpus.stem}-{hashlib.sha256(key_source.encode()).hexdigest()[:16]}"
    if (folder / "manifest.json").exists():
        try:
            return Index.load(folder, params["embedding_model"])
        except (IndexMismatchError, OSError, ValueError, KeyError) as err:
            log.warning("cached index %s unusable (%s); rebuilding", folder, err)
    log.info("building index for %s in %s", corpus, folder)
    return Index.build(
        corpus,
        folder,
        embedding_model=config.embedding_model,
        chunk_size=params["chunk_size"],
        overlap=config.overlap,
        bm25_method=config.bm25_method,
        k1=config.k1,
        b=config.b,
        dense_index=config.dense_index,
        precision=config.embedding_precision,
        overwrite=False,
        # A first `rigkit ask --corpus BIG` can take minutes: show it where someone is watching.
        progress=sys.stderr.isatty(),
    )


def open_retriever(config: RetrievalConfig | None = None) -> Retriever:
    """The `Retriever` for a run: the `RETRIEVERS` factory named by `config.mode`.

    An `index` that is an http(s) URL (`--retriever URL`) is a retrieval server (`rigkit serve`'s
    `/retrieve`): it selects the `remote` entry, whatever the mode, since the server's own
    index decides how it ranks.
    """
    config = config or RetrievalConfig()
    from rigkit.retrieval.remote import is_remote

    mode = "remote" if is_remote(config.index) else config.mode
    if mode not in RETRIEVERS:
        raise InputError(f"unknown retrieval mode {mode!r}; known: {', '.join(RETRIEVERS)}")
    return RETRIEVERS[mode](config)


def _over_index(config: RetrievalConfig) -> Retriever:
    """A built-in retriever (bm25, dense, hybrid) over the index `config` describes."""
    return open_index(config).retriever(
        config.mode,
        bm25_backend=config.bm25_backend,
        rrf_k=config.rrf_k,
        bm25_top_k=config.bm25_top_k,
        dense_top_k=config.dense_top_k,
        bm25_weight=config.bm25_weight,
        dense_weight=config.dense_weight,
    )


def _remote(config: RetrievalConfig) -> Retriever:
    """A retrieval server at `config.index` (an http(s) URL ending in `/retrieve`)."""
    from rigkit.retrieval.remote import RemoteRetriever

    if not config.index:
        raise InputError("retrieval mode 'remote' needs the server's URL as retrieval.index (or --retriever URL)")
    return RemoteRetriever(config.index)


RetrieverFactory = Callable[[RetrievalConfig], Retriever]

# `retrieval.mode` -> factory. Register your own: `RETRIEVERS["mine"] = lambda config: Mine()`;
# a factory opens an index itself (`open_index(config)`) only if it needs one.
RETRIEVERS: dict[str, RetrieverFactory] = {
    "bm25": _over_index,
    "dense": _over_index,
    "hybrid": _over_index,
    "none": lambda config: NoRetriever(),
    "remote": _remote,
}
