"""Building an index folder: chunk, embed (keeping unchanged files' vectors), BM25, faiss or
Milvus, the manifest; written to a temporary sibling and swapped into place."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk, chunk_documents, corpus_fingerprint, write_chunks
from rigkit.errors import InputError, RigkitError
from rigkit.files import fault_point
from rigkit.readers import FileRead, read_files
from rigkit.retrieval.bm25 import BM25Retriever
from rigkit.retrieval.dense import (
    DenseRetriever,
    build_faiss_index,
    embed_texts,
    embedding_precision,
)
from rigkit.retrieval.index_manifest import new_manifest, read_manifest
from rigkit.retrieval.milvus import (
    MilvusTarget,
    check_target,
    drop_collection,
    publish_collection,
    write_collection,
)
from rigkit.retrieval.reuse import BuildReport, PreviousIndex, previous_index
from rigkit.retrieval.storage import atomic_dir, file_table
from rigkit.retrieval.tokenize import tokenize_many

if TYPE_CHECKING:
    from rigkit.retrieval.index import Index

__all__ = ["DENSE_BACKENDS", "build_index_folder", "resolve_chunk_size"]

log = logging.getLogger(__name__)
DENSE_BACKENDS = ("faiss", "milvus")


def resolve_chunk_size(embedding_model: str, chunk_size: int | None) -> int:
    """The chunk size to use: default and ceiling are the embedding model's input limit."""
    from rigkit.embeddings import max_seq_length

    limit = max_seq_length(embedding_model)
    if chunk_size is None:
        return limit
    if chunk_size > limit:
        raise InputError(
            f"chunk_size {chunk_size} exceeds the {limit}-token input limit of {embedding_model}; "
            f"the model would silently truncate. Use --chunk-size {limit} or less."
        )
    return chunk_size


def build_index_folder(
    make: Callable[..., Index],
    corpus: str | Path,
    out: str | Path,
    embedding_model: str = RetrievalConfig.embedding_model,
    chunk_size: int | None = RetrievalConfig.chunk_size,
    overlap: int = RetrievalConfig.overlap,
    split: bool = True,
    bm25_method: str = RetrievalConfig.bm25_method,
    k1: float = RetrievalConfig.k1,
    b: float = RetrievalConfig.b,
    dense_index: str = RetrievalConfig.dense_index,
    batch_size: int = 64,
    progress: bool = False,
    precision: str = RetrievalConfig.embedding_precision,
    embedder: Any = None,
    overwrite: bool = True,
    reuse: bool = True,
    dense_backend: str = RetrievalConfig.dense_backend,
    milvus: MilvusTarget | None = None,
) -> Index:
    """Chunk `corpus`, build both indexes from the one chunk list, write them to `out`; `make`
    (the `Index` class) opens the result.

    `embedder` (anything with sentence-transformers' `encode`) replaces the model loaded by
    name, e.g. a stub in tests; the manifest still records `embedding_model`.
    `overwrite=False` keeps an index that appeared at `out` while this one was building (the
    implicit cache: two processes building the same key both end with a valid index).
    A folder's unreadable files are skipped, one warning each (`report.skipped`). `reuse`: keep the vectors of files unchanged since
    the index already at `out` was built (`rigkit.retrieval.reuse`), whichever backend held them.
    `dense_backend="milvus"` writes the vectors to the Milvus collection `milvus` describes."""
    from rigkit.embeddings import (
        canonical_model_name,
        choose_embedding_model,
        load_embedder,
        load_tokenizer,
    )

    if dense_backend not in DENSE_BACKENDS:
        raise InputError(f"unknown dense backend {dense_backend!r}; choose from {DENSE_BACKENDS}")
    out = Path(out)
    _check_target(out)
    if dense_backend == "milvus":  # an unreachable server fails the build before embedding
        check_target(milvus or MilvusTarget(), out)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    # raises on a malformed single-file corpus before anything is written
    read = read_files(corpus)
    fingerprint = corpus_fingerprint(corpus)  # of the bytes read, not of a later edit
    embedding_model = choose_embedding_model(embedding_model, (d.text for d in read.documents))
    size = resolve_chunk_size(embedding_model, chunk_size)
    chunking = {"chunk_size": size, "overlap": overlap, "split": split}
    previous = previous_index(out, embedding_model, chunking) if reuse else None
    for f in read.files:  # unchanged since the index at `out` was built: keep its vectors
        f.kept = previous is not None and previous.unchanged(f.name, f.sha256)
    documents = [d for f in read.files if not f.kept for d in f.documents]
    fresh = chunk_documents(documents, load_tokenizer(embedding_model), size, overlap, split,
                            progress)
    timings["chunking_s"] = time.perf_counter() - started
    if not split:
        _warn_truncation(fresh, embedding_model, size)

    t = time.perf_counter()
    new_vectors = None  # nothing new or changed: the model is not even loaded
    if fresh:
        embedder = embedder or load_embedder(embedding_model)
        precision = embedding_precision(embedder, precision)
        new_vectors = embed_texts(embedder, [c.index_text for c in fresh], batch_size, progress,
                                  precision=precision)
    else:  # every vector kept: they keep the precision they were made with
        precision = previous.manifest["dense"].get("precision", "float32") if previous else "float32"
    timings["embedding_s"] = time.perf_counter() - t
    chunks, vectors, sources, report = _assemble(read.files, fresh, new_vectors, previous)
    t = time.perf_counter()
    bm25 = BM25Retriever.build(
        chunks, "bm25s", bm25_method, k1, b, tokens=tokenize_many(c.index_text for c in chunks)
    )
    timings["bm25_s"] = time.perf_counter() - t
    t = time.perf_counter()
    faiss_index = record = None
    if dense_backend == "faiss":
        faiss_index = build_faiss_index(vectors, dense_index)
        timings["faiss_s"] = time.perf_counter() - t
    else:
        record = write_collection(milvus or MilvusTarget(), out, chunks, vectors,
                                  canonical_model_name(embedding_model), dense_index)
        timings["milvus_s"] = time.perf_counter() - t

    manifest = new_manifest(
        embedding_model,
        int(vectors.shape[1]),
        chunking,
        {"name": Path(corpus).name, "sha256": fingerprint,
         "documents": sum(e["documents"] for e in sources.values())},
        len(chunks),
        {"method": bm25_method, "k1": k1, "b": b},
        dense_index,
        timings,
    )
    manifest["dense"]["precision"] = precision
    manifest["dense"]["backend"] = dense_backend
    if record is not None:
        manifest["dense"]["milvus"] = record
    manifest["sources"] = sources
    manifest["skipped"] = report.skipped
    manifest["update"] = report.counts()
    before = _milvus_record(out)  # the collection the index at `out` names, if any
    try:
        with atomic_dir(out, overwrite) as tmp:
            write_chunks(tmp / "chunks.jsonl", chunks)
            bm25.save(tmp / "bm25")
            if faiss_index is not None:
                DenseRetriever(chunks, faiss_index, embedding_model).save(tmp / "dense.faiss")
            fault_point("index:files-written")
            manifest["files"] = file_table(tmp)  # written last: a manifest means a whole index
            (tmp / "manifest.json").write_text(
                json.dumps(manifest, indent=2) + "\n", encoding="utf-8"
            )
    except BaseException:
        if record is not None:  # the old index, and the collection it names, stay
            drop_collection(record)
        raise
    _settle_collections(out, record, before)
    target = milvus or MilvusTarget()
    return make(out, manifest, chunks, _bm25=bm25, _faiss=faiss_index, _embedder=embedder,
               report=report, milvus_token_env=target.token_env)



def _assemble(
    files: list[FileRead], fresh: list[Chunk], fresh_vectors: Any, previous: PreviousIndex | None
) -> tuple[list[Chunk], np.ndarray, dict[str, dict[str, Any]], BuildReport]:
    """Chunks and vectors in corpus-file order, kept ones beside new ones; the manifest's
    per-file table; the report. (n_chunks, dim) vectors."""
    by_doc: dict[str, list[int]] = {}
    for i, chunk in enumerate(fresh):
        by_doc.setdefault(chunk.doc_id, []).append(i)
    old = previous.manifest["sources"] if previous else {}
    report = BuildReport(dropped=sorted(set(old) - {f.name for f in files}))
    chunks, parts, sources = [], [], {}
    for f in files:
        if f.skipped:
            report.skipped[f.name] = f.skipped
            continue
        if f.kept and previous is not None:
            kept, vectors, documents = previous.take(f.name, f.modified)
            report.reused.append(f.name)
            report.reused_chunks += len(kept)
        else:
            rows = [i for doc in f.documents for i in by_doc.get(doc.id, [])]
            kept, documents = [fresh[i] for i in rows], len(f.documents)
            vectors = fresh_vectors[rows] if rows else None
            (report.changed if f.name in old else report.new).append(f.name)
            report.embedded_chunks += len(kept)
        sources[f.name] = {"sha256": f.sha256, "modified": f.modified, "documents": documents,
                           "first": len(chunks), "chunks": len(kept)}
        chunks += kept
        if len(kept):
            parts.append(vectors)
    return chunks, np.concatenate(parts).astype(np.float32, copy=False), sources, report


def _milvus_record(out: Path) -> dict[str, Any] | None:
    """The Milvus collection record of the index at `out`, if it has one."""
    try:
        return read_manifest(out)["dense"].get("milvus") if (out / "manifest.json").exists() else None
    except (RigkitError, KeyError, TypeError, AttributeError):
        return None


def _settle_collections(out: Path, record: dict[str, Any] | None, before: dict[str, Any] | None) -> None:
    """After the swap: the alias to the new collection, the collection no index names dropped.
    With `overwrite=False` another build's index may have stayed at `out`: then ours goes."""
    now = _milvus_record(out)
    if record is not None and (now or {}).get("collection") != record["collection"]:
        drop_collection(record)
    elif record is not None:
        publish_collection(record, before)
    elif before is not None and now is None:  # a faiss index replaced a Milvus-backed one
        drop_collection(before)


def _warn_truncation(chunks: list[Chunk], embedding_model: str, limit: int) -> None:
    from rigkit.embeddings import load_tokenizer

    tokenizer = load_tokenizer(embedding_model)
    over = sum(
        len(ids) > limit
        for ids in tokenizer([c.index_text for c in chunks], verbose=False)["input_ids"]
    )
    if over:
        log.warning(
            "%d of %d unsplit documents exceed %d tokens; %s truncates them",
            over,
            len(chunks),
            limit,
            embedding_model,
        )


def _check_target(out: Path) -> None:
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").exists())
    ):
        raise InputError(f"{out} exists and is not a rigkit index; refusing to overwrite it")
