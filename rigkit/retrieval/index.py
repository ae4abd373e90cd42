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
Loading reads files only; the embedding model loads at the first dense query. Building lives in
`rigkit.retrieval.index_build`, the manifest in `rigkit.retrieval.index_manifest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk, read_chunks
from rigkit.errors import IndexCorruptError, InputError
from rigkit.retrieval.bm25 import BM25_BACKENDS, BM25Retriever
from rigkit.retrieval.dense import DenseRetriever
from rigkit.retrieval.hybrid import HybridRetriever
from rigkit.retrieval.index_build import DENSE_BACKENDS, build_index_folder, resolve_chunk_size
from rigkit.retrieval.index_manifest import FORMAT_VERSION, check_manifest, read_manifest
from rigkit.retrieval.milvus import MilvusRetriever, open_collection
from rigkit.retrieval.reuse import BuildReport
from rigkit.retrieval.storage import rebuild_hint, recover, verify_files
from rigkit.retrieval.tokenize import check_user_dict

__all__ = ["FORMAT_VERSION", "MODES", "DENSE_BACKENDS", "Index", "check_manifest", "read_manifest",
           "resolve_chunk_size"]

MODES = ("bm25", "dense", "hybrid")


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
    def build(cls, corpus: str | Path, out: str | Path, **options: Any) -> Index:
        """Chunk `corpus`, build both indexes, write them to `out` (options: `build_index_folder`)."""
        return build_index_folder(cls, corpus, out, **options)

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


def _read_part(index: Index, name: str, read):
    """Read one index file; a library error while reading it means the file is damaged."""
    try:
        return read()
    except (OSError, ValueError, RuntimeError, KeyError, IndexError, EOFError) as err:
        raise IndexCorruptError(f"{index.path / name} cannot be read ({type(err).__name__}); "
                                f"{rebuild_hint(index.path, index.manifest)}") from None
