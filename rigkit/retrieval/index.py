"""A saved retrieval index: one chunk file, its BM25 matrix, its faiss vectors, a manifest.

Layout of an index folder:
    manifest.json   embedding model (canonical name), dimension, chunk parameters, corpus hash,
                    BM25 variant, dense index kind and backend, rigkit version, build timings
    chunks.jsonl    the chunks both indexes were built from (chunk i = row i = vector i)
    bm25/           bm25s's sparse score matrix and vocabulary
    dense.faiss     the faiss index (`dense_backend: faiss`, the default)
With `dense_backend: milvus` the vectors live in a Milvus collection instead, which the manifest
names (`rigkit.retrieval.milvus`); the folder keeps everything else.
The build happens in a temporary sibling folder that is swapped into place atomically at the end
(`rigkit.retrieval.storage`): a kill at any step leaves the old index or the new one at the path.
The manifest lists every file's size and SHA-256; loading checks sizes always and hashes on the
first load in a process (small indexes), so a truncated, deleted, reordered or swapped file is an
`IndexCorruptError` that says how to rebuild, never wrong hits. Loading refuses an index built
for another embedding model or BM25 tokenizer: a mismatch is an error, not a silent rebuild.
Loading reads files only; the embedding model loads at the first dense query.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk, chunk_documents, corpus_fingerprint, read_chunks, write_chunks
from rigkit.errors import IndexCorruptError, IndexMismatchError, InputError, RigkitError
from rigkit.files import fault_point
from rigkit.readers import FileRead, read_files
from rigkit.retrieval.bm25 import BM25_BACKENDS, BM25Retriever
from rigkit.retrieval.dense import (
    DenseRetriever,
    build_faiss_index,
    embed_texts,
    embedding_precision,
)
from rigkit.retrieval.hybrid import HybridRetriever
from rigkit.retrieval.milvus import (
    MilvusRetriever,
    MilvusTarget,
    check_target,
    drop_collection,
    open_collection,
    publish_collection,
    write_collection,
)
from rigkit.retrieval.reuse import BuildReport, PreviousIndex, previous_index
from rigkit.retrieval.storage import atomic_dir, file_table, rebuild_hint, recover, verify_files
from rigkit.retrieval.tokenize import (
    TOKENIZER_VERSION,
    check_user_dict,
    tokenize_many,
    user_dict_record,
)

__all__ = ["FORMAT_VERSION", "MODES", "DENSE_BACKENDS", "Index", "resolve_chunk_size"]

log = logging.getLogger(__name__)
FORMAT_VERSION = 2  # 2: the manifest lists every file's size and SHA-256
MODES = ("bm25", "dense", "hybrid")
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


@dataclass
class Index:
    path: Path
    manifest: dict[str, Any]
    chunks: list[Chunk]
    _bm25: BM25Retriever | None = None
    _faiss: Any = None
    _embedder: Any = None  # None: the manifest's model, loaded at the first dense query
    _retrievers: dict[str, Any] = field(default_factory=dict)
    report: BuildReport | None = None  # what `build` reused, embedded, dropped and skipped
    milvus_uri: str | None = None  # milvus backend: the server, where not the URI the index recorded
    milvus_token_env: str | None = None  # milvus backend: the variable holding its token

    @property
    def embedding_model(self) -> str:
        return self.manifest["embedding_model"]

    @property
    def dense_backend(self) -> str:
        return self.manifest["dense"].get("backend", "faiss")  # indexes from before backends: faiss

    # ------------------------------------------------------------ build

    @classmethod
    def build(
        cls,
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
        """Chunk `corpus`, build both indexes from the one chunk list, write them to `out`.

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

        manifest = _manifest(
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
        return cls(out, manifest, chunks, _bm25=bm25, _faiss=faiss_index, _embedder=embedder,
                   report=report, milvus_token_env=target.token_env)

    # ------------------------------------------------------------ load

    @classmethod
    def load(
        cls, path: str | Path, embedding_model: str | None = None, embedder: Any = None,
        milvus_uri: str | None = None, milvus_token_env: str | None = None,
    ) -> Index:
        """Open a saved index; `embedding_model` (if given) must match the one it was built with.
        A Milvus-backed index connects at its first dense search, to `milvus_uri` if given, else
        to the URI it recorded."""
        path = Path(path)
        recover(path)
        manifest = read_manifest(path)
        if manifest.get("kind") == "attached":  # a prebuilt faiss index and its corpus, in place
            from rigkit.retrieval.attach import AttachedIndex

            return AttachedIndex.open(path, manifest, embedding_model, embedder)
        if embedding_model is not None:
            check_manifest(manifest, path, embedding_model=embedding_model)
        verify_files(path, manifest)
        try:
            chunks = read_chunks(path / "chunks.jsonl")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            raise IndexCorruptError(f"{path / 'chunks.jsonl'} is not a valid chunk file ({err}); "
                                    f"{rebuild_hint(path, manifest)}") from None
        if len(chunks) != manifest.get("chunks"):
            raise IndexCorruptError(f"{path / 'chunks.jsonl'} holds {len(chunks)} chunks, the "
                                    f"manifest {manifest.get('chunks')}; {rebuild_hint(path, manifest)}")
        return cls(path, manifest, chunks, _embedder=embedder, milvus_uri=milvus_uri,
                   milvus_token_env=milvus_token_env)

    def verify(self) -> None:
        """Hash every file against the manifest and check the parts agree (`rigkit index verify`)."""
        verify_files(self.path, self.manifest, full=True)
        dense = self.dense()
        where = self.path / "dense.faiss" if self.dense_backend == "faiss" else (
            f"the Milvus collection {self.manifest['dense']['milvus']['collection']}")
        n_vectors = dense.n_vectors
        if n_vectors != len(self.chunks):
            raise IndexCorruptError(f"{where} holds {n_vectors} vectors for "
                                    f"{len(self.chunks)} chunks; {rebuild_hint(self.path, self.manifest)}")
        if self.dense_backend == "milvus" and dense.collection.chunk_ids(n_vectors) != [
                c.chunk_id for c in self.chunks]:
            raise IndexCorruptError(f"{where} holds other chunks than {self.path / 'chunks.jsonl'}, or "
                                    f"in another order; {rebuild_hint(self.path, self.manifest)}")
        self.bm25()

    # ------------------------------------------------------------ retrievers

    def bm25(self, backend: str = "bm25s") -> BM25Retriever:
        if backend not in BM25_BACKENDS:
            raise InputError(f"unknown BM25 backend {backend!r}; choose from {BM25_BACKENDS}")
        key = f"bm25:{backend}"
        if key not in self._retrievers:
            p = self.manifest["bm25"]
            check_user_dict(p, self.path)  # queries must split Chinese as the build did
            if backend == "bm25s" and self._bm25 is not None:
                retriever = self._bm25
            elif backend == "bm25s":
                retriever = _read_part(self, "bm25", lambda: BM25Retriever.load(
                    self.path / "bm25", self.chunks, p["method"], p["k1"], p["b"]))
            else:  # the reference backend is rebuilt in memory from the same chunks
                retriever = BM25Retriever.build(
                    self.chunks, "rank_bm25", p["method"], p["k1"], p["b"]
                )
            self._retrievers[key] = retriever
        return self._retrievers[key]

    def dense(self) -> DenseRetriever | MilvusRetriever:
        if "dense" not in self._retrievers and self.dense_backend == "milvus":
            self._retrievers["dense"] = self._milvus()
        if "dense" not in self._retrievers:
            faiss_index = self._faiss or _read_part(
                self, "dense.faiss", lambda: DenseRetriever.read_index(self.path / "dense.faiss"))
            # indexes from before precision was recorded were embedded in float32
            precision = self.manifest["dense"].get("precision", "float32")
            self._retrievers["dense"] = DenseRetriever(
                self.chunks, faiss_index, self.embedding_model, self._embedder, precision
            )
        return self._retrievers["dense"]

    def _milvus(self) -> MilvusRetriever:
        """The dense retriever over the collection the manifest names (connects and checks it)."""
        dense = self.manifest["dense"]
        collection = open_collection(self.manifest, self.path, self.milvus_uri, self.milvus_token_env,
                                     rebuild_hint(self.path, self.manifest))
        return MilvusRetriever(self.chunks, collection, self.embedding_model, self._embedder,
                               dense.get("precision", "float32"), dense["milvus"].get("search_params"))

    def retriever(
        self,
        mode: str = RetrievalConfig.mode,
        bm25_backend: str = RetrievalConfig.bm25_backend,
        rrf_k: int = RetrievalConfig.rrf_k,
        bm25_top_k: int = RetrievalConfig.bm25_top_k,
        dense_top_k: int = RetrievalConfig.dense_top_k,
        bm25_weight: float = RetrievalConfig.bm25_weight,
        dense_weight: float = RetrievalConfig.dense_weight,
    ):
        """A `Retriever` over this index: "bm25", "dense" or "hybrid" (RRF of both)."""
        if mode == "bm25":
            return self.bm25(bm25_backend)
        if mode == "dense":
            return self.dense()
        if mode == "hybrid":
            return HybridRetriever(
                {"bm25": self.bm25(bm25_backend), "dense": self.dense()},
                weights={"bm25": bm25_weight, "dense": dense_weight},
                top_ks={"bm25": bm25_top_k, "dense": dense_top_k},
                rrf_k=rrf_k,
            )
        raise InputError(f"unknown retrieval mode {mode!r}; choose from {MODES}")


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


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the index at `path`, checked for format and BM25 tokenizer version."""
    manifest_file = path / "manifest.json"
    if not manifest_file.exists():
        raise InputError(
            f"{path} is not a rigkit index (no manifest.json); build one with `rigkit index build`"
        )
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as err:
        raise IndexCorruptError(f"{manifest_file} is not a valid manifest ({err}); rebuild with "
                                f"`rigkit index build --corpus CORPUS --out {path}`") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexMismatchError(
            f"{path}: index format {manifest.get('format_version')}, this rigkit reads "
            f"{FORMAT_VERSION}; {rebuild_hint(path, manifest)}"
        )
    tokens = (manifest.get("bm25") or {}).get("tokenizer")
    if tokens != TOKENIZER_VERSION and manifest.get("kind") != "attached":  # attached: no BM25
        raise IndexMismatchError(
            f"{path}: BM25 tokens were made by {tokens!r}, this rigkit makes {TOKENIZER_VERSION!r}; "
            f"{rebuild_hint(path, manifest)}"
        )
    return manifest


def _read_part(index: Index, name: str, read):
    """Read one index file; a library error while reading it means the file is damaged."""
    try:
        return read()
    except (OSError, ValueError, RuntimeError, KeyError, IndexError, EOFError) as err:
        raise IndexCorruptError(f"{index.path / name} cannot be read ({type(err).__name__}); "
                                f"{rebuild_hint(index.path, index.manifest)}") from None


def _manifest(
    embedding_model: str,
    dimension: int,
    chunking: dict,
    corpus: dict,
    n_chunks: int,
    bm25: dict,
    dense_index: str,
    timings: dict[str, float],
) -> dict[str, Any]:
    from rigkit import __version__
    from rigkit.embeddings import canonical_model_name

    return {
        "format_version": FORMAT_VERSION,
        "rigkit_version": __version__,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "embedding_model": canonical_model_name(embedding_model),  # never an install path
        "dimension": dimension,
        "chunking": chunking,
        "corpus": corpus,
        "chunks": n_chunks,
        "bm25": {**bm25, "tokenizer": TOKENIZER_VERSION, **user_dict_record()},
        "dense": {"index": dense_index, "normalized": True, "metric": "inner_product", "backend": "faiss"},
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def check_manifest(
    manifest: dict[str, Any], path: Path, embedding_model: str | None = None, **expected: Any
) -> None:
    """Raise IndexMismatchError if the index was built with other settings than `expected`.

    `expected` keys: chunk_size, bm25_method, k1, b, dense_index, dense_backend (None = accept the
    index's)."""
    from rigkit.embeddings import canonical_model_name

    chunking, bm25 = manifest.get("chunking") or {}, manifest.get("bm25") or {}  # attached: neither
    built = {
        "embedding_model": manifest["embedding_model"],
        "chunk_size": chunking.get("chunk_size"),
        "bm25_method": bm25.get("method"),
        "k1": bm25.get("k1"),
        "b": bm25.get("b"),
        "dense_index": manifest["dense"]["index"],
        "dense_backend": manifest["dense"].get("backend", "faiss"),
    }
    asked = dict(expected)
    if embedding_model is not None and canonical_model_name(embedding_model) != "auto":
        asked["embedding_model"] = canonical_model_name(embedding_model)
    wrong = [
        f"{k}: index has {built[k]!r}, asked for {v!r}"
        for k, v in asked.items()
        if v is not None and built[k] != v
    ]
    if wrong:
        raise IndexMismatchError(
            f"index {path} does not match the requested settings ({'; '.join(wrong)}). Rebuild it with "
            "`rigkit index build --corpus ... --out ...` using those settings, or ask for the index's own."
        )


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
