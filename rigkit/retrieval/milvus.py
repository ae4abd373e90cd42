"""Dense retrieval from a Milvus collection (`retrieval.dense_backend: milvus`).

The index folder is a rigkit index like any other (manifest, chunks.jsonl, bm25/), less
`dense.faiss`: its vectors live in a Milvus collection, row i = chunk i (the primary key is the
chunk's position), beside each chunk's id, document id, title, text and metadata (a JSON field).
The one chunk list still feeds BM25, the hits and the filters, so `bm25`, `dense` and `hybrid`
mean what they mean with faiss, and a hybrid fuses Milvus's list with BM25's by the same RRF.
Queries are embedded by the index's own model and precision (`EmbedsQueries`), scored by inner
product of unit vectors in a FLAT (exact), HNSW or IVF_FLAT index: `retrieval.dense_index`, with
the faiss path's parameters.

A build writes a new collection `<name>__<build id>`; once the folder's manifest names it (the
atomic swap of `rigkit.retrieval.storage`), the alias `<name>` is pointed at it and the collection
the folder named before is dropped. A reader of the folder, or of the alias, sees the old index or
the new one; a build that fails drops its own collection; a killed one can leave one behind that
no index names. Loading checks that the collection is there and was built with the manifest's
embedding model, dimension and chunk count.

Milvus ranks the chunks it lists; a fused hit Milvus did not list carries no dense rank (faiss
scores every chunk from its stored vectors; a cluster's collection is not read back whole).
Metadata filters go to Milvus as filter expressions where Milvus compares as rigkit does
(`rigkit.retrieval.milvus_filters`); the rest are applied in Python to a deeper candidate list
(up to Milvus's 16,384), and every hit is checked against the local chunk filter, so a filter
never lets a wrong chunk through.
"""

from __future__ import annotations

import logging
import math
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk
from rigkit.errors import IndexCorruptError, IndexMismatchError, InputError, RigkitError
from rigkit.retrieval.dense import HNSW_EF_SEARCH, HNSW_M, EmbedsQueries, ivf_cells, ivf_probes
from rigkit.retrieval.filters import Filters, MasksOwnChunks, parse_filters
from rigkit.retrieval.milvus_filters import JSON_FIELD, FieldShape, field_shape, milvus_filter
from rigkit.retrieval.ranking import Scored, hits_from_scored
from rigkit.trace import Hit

__all__ = ["DEFAULT_URI", "INSTALL_HINT", "MilvusError", "MilvusTarget", "MilvusCollection",
           "MilvusRetriever", "check_target", "write_collection", "publish_collection",
           "drop_collection", "open_collection"]

DEFAULT_URI = "http://127.0.0.1:19530"
INSTALL_HINT = ("pip install pymilvus (or pip install 'rigkit[milvus]', which adds milvus-lite "
                "for a local server)")
TIMEOUT_S = 10.0  # one call: connecting, a search, an insert batch
INSERT_BATCH = 1000  # rows per insert: ~3 MB of MiniLM vectors and text, far below gRPC's 64 MB
READ_BATCH = 4096  # rows per query when reading ids or vectors back
MAX_LIMIT = 16384  # Milvus's largest top-k
TIE_ROOM = 8  # rows asked beyond the depth (ties at the cut: copies of one text)
VARCHAR_MAX = 65535  # bytes in a VARCHAR field
INDEX_TYPES = {"flat": "FLAT", "hnsw": "HNSW", "ivf": "IVF_FLAT"}
HNSW_EF_CONSTRUCTION = 40  # faiss's IndexHNSWFlat default, so both graphs are built alike
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
_PROPERTY = "rigkit"  # collection property prefix: what the collection was built with


class MilvusError(RigkitError, ConnectionError):
    """The Milvus server cannot be reached or refused a call; the message names its URI."""


@dataclass(frozen=True)
class MilvusTarget:
    """Where a build writes its vectors: a server, a collection name (an alias), a token."""

    uri: str = DEFAULT_URI
    collection: str | None = None  # None: rigkit_ + the index folder's name
    token_env: str | None = None  # the environment variable holding the token

    @classmethod
    def from_config(cls, config: RetrievalConfig) -> MilvusTarget:
        return cls(config.milvus_uri or DEFAULT_URI, config.milvus_collection, config.milvus_token_env)

    def name_for(self, out: Path) -> str:
        name = self.collection or "rigkit_" + re.sub(r"[^A-Za-z0-9_]", "_", Path(out).resolve().name)
        if not _NAME.match(name):
            raise InputError(f"{name!r} is not a Milvus collection name: letters, digits and _, "
                             "not starting with a digit, at most 200 characters")
        return name


# -- the server --------------------------------------------------------------------------------


def connect(uri: str, token_env: str | None = None):
    """A pymilvus `MilvusClient` for `uri`; one clear line if pymilvus is missing or the server
    does not answer."""
    try:
        from pymilvus import MilvusClient
    except ImportError as err:
        raise InputError(f"the milvus dense backend needs pymilvus: {INSTALL_HINT} ({err})") from None
    # pymilvus logs every failed call and reconnect with its traceback (on a handler of its own)
    # before raising; rigkit reports the raised error in one line
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    token = ""
    if token_env:
        token = os.environ.get(token_env, "")
        if not token:
            raise InputError(f"retrieval.milvus_token_env names {token_env}, which is not set")
    try:
        return MilvusClient(uri=uri, token=token, timeout=TIMEOUT_S)
    except Exception as err:  # pymilvus raises MilvusException, gRPC errors or ValueError here
        raise MilvusError(f"cannot reach Milvus at {uri} ({_reason(err)}); is it running? "
                          "For a local try: milvus-lite server --data-dir DIR --port 19530") from None


def _reason(err: BaseException) -> str:
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    return " ".join(str(message).split())[:300]


class MilvusCollection:
    """One collection on one server: the calls rigkit makes, each failure one `MilvusError`."""

    def __init__(self, client, uri: str, name: str):
        self.client, self.uri, self.name = client, uri, name

    def call(self, what: str, method: str, *args, **kwargs):
        try:
            return getattr(self.client, method)(*args, timeout=TIMEOUT_S, **kwargs)
        except Exception as err:  # MilvusException, or gRPC's own when the server went away
            raise MilvusError(f"Milvus at {self.uri} failed to {what} {self.name} ({_reason(err)})") from None

    def search(self, vector: np.ndarray, limit: int, expression: str | None,
               params: dict[str, Any]) -> list[tuple[int, float]]:
        """(row, inner product) of the best `limit` rows passing `expression`, best first."""
        found = self.call("search", "search", self.name, data=[vector.tolist()], limit=limit,
                          filter=expression or "", output_fields=["id"],
                          search_params={"metric_type": "IP", "params": params})
        return [(int(hit["id"]), float(hit["distance"])) for hit in found[0]]

    def count(self) -> int:
        rows = self.call("count the rows of", "query", self.name, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def rows(self, start: int, stop: int, fields: Sequence[str]) -> list[dict[str, Any]]:
        """Rows start..stop-1 (by chunk position) with `fields`, in position order."""
        found = self.call("read", "query", self.name, filter=f"id >= {start} and id < {stop}",
                          output_fields=["id", *fields], limit=stop - start)
        return sorted(found, key=lambda row: row["id"])

    def chunk_ids(self, n: int) -> list[str]:
        return [row["chunk_id"] for start in range(0, n, READ_BATCH)
                for row in self.rows(start, min(n, start + READ_BATCH), ["chunk_id"])]

    def vectors(self, n: int) -> np.ndarray:
        """(n, dim) float32: the vectors of rows 0..n-1 (an incremental rebuild keeps them)."""
        parts = [np.asarray([row["vector"] for row in self.rows(start, min(n, start + READ_BATCH), ["vector"])],
                            dtype=np.float32) for start in range(0, n, READ_BATCH)]
        return np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros((0, 0), np.float32)


# -- building ----------------------------------------------------------------------------------


def write_collection(target: MilvusTarget, out: Path, chunks: Sequence[Chunk], vectors: np.ndarray,
                     embedding_model: str, dense_index: str) -> dict[str, Any]:
    """A new collection holding `chunks` and `vectors` (n, dim); the manifest's record of it.

    The alias is left alone until `publish_collection`; a failure here drops what was written."""
    from pymilvus import DataType

    alias = target.name_for(out)
    client = check_target(target, out)
    record = {"uri": target.uri, "alias": alias, "collection": f"{alias}__{uuid.uuid4().hex[:12]}",
              **_index_spec(dense_index, len(chunks))}
    if target.token_env:
        record["token_env"] = target.token_env
    n, dim = vectors.shape
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    for name in ("chunk_id", "doc_id", "title", "text"):
        schema.add_field(name, DataType.VARCHAR, max_length=VARCHAR_MAX)
    schema.add_field(JSON_FIELD, DataType.JSON)
    index_params = client.prepare_index_params()
    index_params.add_index("vector", index_type=record["index_type"], metric_type="IP",
                           params=record["index_params"])
    properties = {f"{_PROPERTY}.embedding_model": embedding_model, f"{_PROPERTY}.dimension": str(dim),
                  f"{_PROPERTY}.chunks": str(n)}
    collection = MilvusCollection(client, target.uri, record["collection"])
    collection.call("create", "create_collection", collection.name, schema=schema,
                    index_params=index_params, consistency_level="Strong", properties=properties)
    try:
        for start in range(0, n, INSERT_BATCH):
            rows = [_row(i, chunks[i], vectors[i]) for i in range(start, min(n, start + INSERT_BATCH))]
            collection.call("insert into", "insert", collection.name, rows)
        collection.call("flush", "flush", collection.name)
    except BaseException:
        drop_collection(record, client)
        raise
    return record


def _row(i: int, chunk: Chunk, vector: np.ndarray) -> dict[str, Any]:
    row = {"id": i, "vector": vector.tolist(), "chunk_id": chunk.chunk_id, "doc_id": chunk.doc_id,
           "title": chunk.title, "text": chunk.text, JSON_FIELD: chunk.metadata}
    for name in ("chunk_id", "doc_id", "title", "text"):
        if len(row[name].encode("utf-8")) > VARCHAR_MAX:
            raise InputError(f"chunk {chunk.chunk_id}: its {name} is longer than the {VARCHAR_MAX} bytes "
                             "a Milvus text field holds; build with splitting on (no --no-split) or "
                             "a smaller --chunk-size")
    return row


def _index_spec(dense_index: str, n: int) -> dict[str, Any]:
    """The Milvus index for `retrieval.dense_index`, with the faiss path's parameters."""
    if dense_index not in INDEX_TYPES:
        raise InputError(f"unknown dense index {dense_index!r}; choose from {tuple(INDEX_TYPES)}")
    if dense_index == "hnsw":
        return {"index_type": "HNSW", "index_params": {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION},
                "search_params": {"ef": HNSW_EF_SEARCH}}
    if dense_index == "ivf":
        nlist = ivf_cells(n)
        return {"index_type": "IVF_FLAT", "index_params": {"nlist": nlist},
                "search_params": {"nprobe": ivf_probes(nlist)}}
    return {"index_type": "FLAT", "index_params": {}, "search_params": {}}


def check_target(target: MilvusTarget, out: Path):
    """A client for `target`, once the server answers and the name is free for rigkit's alias
    (Milvus refuses an alias that is a collection's own name): the checks a build makes before
    it embeds anything."""
    alias = target.name_for(out)
    client = connect(target.uri, target.token_env)
    probe = MilvusCollection(client, target.uri, alias)
    if alias not in _aliases(probe) and probe.call("look up", "has_collection", alias):
        raise InputError(f"Milvus at {target.uri} has a collection named {alias}, not an alias rigkit can "
                         "point at a new build; choose another name (--milvus-collection / "
                         "retrieval.milvus_collection)")
    return client


def _aliases(collection: MilvusCollection) -> list[str]:
    found = collection.call("list the aliases of", "list_aliases")
    return list(found.get("aliases", []) if isinstance(found, dict) else found)


def publish_collection(record: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """Point the record's alias at its collection, then drop the collection `previous` (the record
    the index folder held before) named, when it lives on the same server and is another."""
    client = connect(record["uri"], record.get("token_env"))
    collection = MilvusCollection(client, record["uri"], record["alias"])
    if record["alias"] in _aliases(collection):
        collection.call("point the alias", "alter_alias", record["collection"], record["alias"])
    else:
        collection.call("create the alias", "create_alias", record["collection"], record["alias"])
    if previous and previous.get("uri") == record["uri"] and previous.get("collection") != record["collection"]:
        drop_collection(previous, client)


def drop_collection(record: dict[str, Any], client=None) -> None:
    """Drop the record's collection if it is there (best effort: a dead server keeps it)."""
    try:
        client = client or connect(record["uri"], record.get("token_env"))
        if client.has_collection(record["collection"], timeout=TIMEOUT_S):
            client.drop_collection(record["collection"], timeout=TIMEOUT_S)
    except Exception as err:  # the build's own error, or its success, matters more
        logging.getLogger(__name__).warning("could not drop Milvus collection %s at %s (%s)",
                                            record["collection"], record["uri"], _reason(err))


# -- loading -----------------------------------------------------------------------------------


def open_collection(manifest: dict[str, Any], path: Path, uri: str | None = None,
                    token_env: str | None = None, rebuild: str = "") -> MilvusCollection:
    """The collection an index's manifest names, checked: it exists, holds one row per chunk and
    was built with the manifest's embedding model and dimension. `uri` overrides the recorded one
    (the server moved); `rebuild` is the hint appended to the errors."""
    record = manifest["dense"]["milvus"]
    uri = uri or record["uri"]
    client = connect(uri, token_env or record.get("token_env"))
    collection = MilvusCollection(client, uri, record["collection"])
    if not collection.call("look up", "has_collection", collection.name):
        raise IndexCorruptError(f"{path}: its Milvus collection {collection.name} is not at {uri} "
                                f"(dropped, or another server); {rebuild}")
    described = collection.call("describe", "describe_collection", collection.name)
    properties = described.get("properties") or {}
    dims = [int(f.get("params", {}).get("dim", 0)) for f in described.get("fields", []) if f.get("name") == "vector"]
    built = properties.get(f"{_PROPERTY}.embedding_model"), dims[0] if dims else None
    expected = manifest["embedding_model"], manifest["dimension"]
    if built != expected:
        raise IndexMismatchError(
            f"the Milvus collection {collection.name} at {uri} was built with another embedding model "
            f"({built[0]}, {built[1]} dimensions) than the index {path} ({expected[0]}, {expected[1]} "
            f"dimensions); {rebuild}")
    rows = collection.count()
    if rows != manifest["chunks"]:
        raise IndexCorruptError(f"the Milvus collection {collection.name} at {uri} holds {rows} rows for the "
                                f"{manifest['chunks']} chunks of {path}; {rebuild}")
    return collection


# -- searching ---------------------------------------------------------------------------------


class MilvusRetriever(EmbedsQueries, MasksOwnChunks):
    """Semantic retriever over a Milvus collection: embeds the query, Milvus ranks the rows."""

    name = "dense"

    def __init__(self, chunks: Sequence[Chunk], collection: MilvusCollection, embedding_model: str,
                 embedder=None, precision: str = "auto", search_params: dict[str, Any] | None = None):
        super().__init__(embedding_model, embedder, precision)
        self.chunks = chunks
        self.collection = collection
        self.search_params = dict(search_params or {})
        self._shapes: dict[str, FieldShape | None] = {}

    @property
    def n_vectors(self) -> int:
        return self.collection.count()

    def vectors(self) -> np.ndarray:
        return self.collection.vectors(len(self.chunks))

    def scored(
        self, query: str, depth: int, vector: np.ndarray | None = None, filters: Filters | None = None
    ) -> Scored:
        """Milvus's best `depth` chunks passing `filters`; no score for the chunks it did not list."""
        vector = self.encode(query) if vector is None else vector
        if not filters:
            return Scored(self.name, self._search(vector, depth, None))
        mask = self.filter_mask(filters)  # checks the filter as every retriever does; the last word
        expression, rest = milvus_filter(filters, {key: self._shape(key) for key in filters.keys})
        return Scored(self.name, self._search(vector, depth, expression, mask, rest))

    def _search(self, vector: np.ndarray, depth: int, expression: str | None,
                mask: np.ndarray | None = None, rest: Filters | None = None) -> list[tuple[int, float]]:
        depth = min(depth, MAX_LIMIT, len(self.chunks))
        # a few more than asked: chunks tied at the cut are then kept by position, as faiss keeps them
        limit = min(depth + TIE_ROOM, MAX_LIMIT) if rest is None else self._deeper(depth, mask, rest)
        while True:
            found = self.collection.search(vector, limit, expression, self._params(limit))
            kept = [(i, s) for i, s in found if 0 <= i < len(self.chunks) and (mask is None or mask[i])]
            if rest is None or len(kept) >= depth or len(found) < limit or limit >= MAX_LIMIT:
                break
            limit = min(MAX_LIMIT, limit * 4)  # the rest passed fewer than expected: look deeper
        kept.sort(key=lambda p: (-p[1], p[0]))  # ties by position, like every rigkit ranking
        return kept[:depth]

    def _deeper(self, depth: int, mask: np.ndarray, rest: Filters) -> int:
        """Candidates to ask for when Milvus cannot apply `rest`: enough that `depth` of them
        should pass it, at the share of chunks that do."""
        share = max(float(self.filter_mask(rest).mean()), 1 / len(self.chunks))
        return min(MAX_LIMIT, max(2 * depth, math.ceil(2 * depth / share)) + TIE_ROOM)

    def _params(self, limit: int) -> dict[str, Any]:
        if "ef" in self.search_params:  # HNSW visits at least as many nodes as it returns
            return {**self.search_params, "ef": max(self.search_params["ef"], limit)}
        return self.search_params

    def _shape(self, key: str) -> FieldShape | None:
        if key not in self._shapes:
            self._shapes[key] = field_shape(self.chunk_filter, key)
        return self._shapes[key]

    def search(self, query: str, top_k: int = 5, filters=None) -> list[Hit]:
        """Hits best first; `filters` (any form `parse_filters` takes) restricts the chunks."""
        scored = self.scored(query, top_k * 2, filters=parse_filters(filters))
        return hits_from_scored(scored, self.chunks, top_k)

