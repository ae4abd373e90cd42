"""Incremental rebuilds: what the index already at the output path lets a new build keep.

The manifest lists every corpus file with the SHA-256 of its bytes and the run of chunks it
produced (`sources`). Rebuilding into the same folder with the same embedding model and chunk
parameters keeps the chunks and vectors of every file whose bytes are unchanged (read back from
the old `chunks.jsonl` and faiss index or Milvus collection: a rebuild with the other dense
backend moves the vectors without embedding them again), embeds only new and changed files, and
leaves out deleted ones; BM25 and the dense index are rebuilt from the whole chunk list, since
corpus statistics change with any file. Another model, other chunk parameters, an older index
format or a damaged index: everything is embedded again, and the log says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.corpus import Chunk

__all__ = ["PreviousIndex", "BuildReport", "previous_index"]

log = logging.getLogger(__name__)


@dataclass
class PreviousIndex:
    """The old index's chunks and vectors, by corpus file."""

    manifest: dict[str, Any]
    chunks: list[Chunk]
    vectors: np.ndarray  # (n_chunks, dim)

    def unchanged(self, name: str, sha256: str) -> bool:
        entry = self.manifest["sources"].get(name)
        return entry is not None and entry.get("sha256") == sha256

    def take(self, name: str, modified: str) -> tuple[list[Chunk], np.ndarray, int]:
        """(chunks, vectors, documents) the old index holds for file `name`, mtime refreshed."""
        entry = self.manifest["sources"][name]
        first, count = entry["first"], entry["chunks"]
        chunks = self.chunks[first : first + count]
        for chunk in chunks:  # a touched file keeps its vectors but shows its new time
            if chunk.metadata.get("modified") == entry.get("modified"):
                chunk.metadata["modified"] = modified
        return chunks, self.vectors[first : first + count], entry.get("documents", 0)


@dataclass
class BuildReport:
    """What a build did with each corpus file."""

    reused: list[str] = field(default_factory=list)  # unchanged: chunks and vectors kept
    new: list[str] = field(default_factory=list)  # embedded: not in the old index
    changed: list[str] = field(default_factory=list)  # embedded: other bytes than before
    dropped: list[str] = field(default_factory=list)  # in the old index, gone from the corpus
    skipped: dict[str, str] = field(default_factory=dict)  # file -> why it could not be read
    embedded_chunks: int = 0
    reused_chunks: int = 0

    @property
    def indexed(self) -> int:
        return len(self.reused) + len(self.new) + len(self.changed)

    def counts(self) -> dict[str, int]:
        return {"reused_files": len(self.reused), "new_files": len(self.new),
                "changed_files": len(self.changed), "dropped_files": len(self.dropped),
                "skipped_files": len(self.skipped), "embedded_chunks": self.embedded_chunks,
                "reused_chunks": self.reused_chunks}

    def lines(self) -> list[str]:
        """Two lines for a person: what was reused / embedded / dropped, what was skipped."""
        embedded = len(self.new) + len(self.changed)
        update = (f"reused {len(self.reused)} files ({self.reused_chunks} chunks), re-embedded "
                  f"{embedded} ({len(self.new)} new, {len(self.changed)} changed; "
                  f"{self.embedded_chunks} chunks), dropped {len(self.dropped)}"
                  + (f": {', '.join(self.dropped)}" if self.dropped else ""))
        skipped = ", ".join(f"{name} ({why})" for name, why in self.skipped.items())
        summary = f"indexed {self.indexed} files, skipped {len(self.skipped)}" + (
            f": {skipped}" if skipped else "")
        return [update, summary]


def previous_index(out: Path, embedding_model: str, chunking: dict[str, Any]) -> PreviousIndex | None:
    """The index at `out` when its vectors can be reused for this build, else None."""
    from rigkit.embeddings import canonical_model_name
    from rigkit.errors import RigkitError
    from rigkit.retrieval.index_manifest import read_manifest
    from rigkit.retrieval.storage import verify_files

    if not (out / "manifest.json").exists():
        return None
    try:
        manifest = read_manifest(out)
        why = _incompatible(manifest, canonical_model_name(embedding_model), chunking)
        if why:
            log.info("re-embedding everything: the index at %s %s", out, why)
            return None
        verify_files(out, manifest, full=True)
        from rigkit.corpus import read_chunks

        chunks = read_chunks(out / "chunks.jsonl")
        vectors = _stored_vectors(out, manifest)
        if len(chunks) != len(vectors) or len(chunks) != manifest.get("chunks"):
            raise ValueError("chunk and vector counts differ")
    except (RigkitError, OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        log.warning("re-embedding everything: the index at %s cannot be reused (%s)", out, err)
        return None
    return PreviousIndex(manifest, chunks, vectors)


def _incompatible(manifest: dict[str, Any], model: str, chunking: dict[str, Any]) -> str | None:
    if not isinstance(manifest.get("sources"), dict):
        return "lists no per-file hashes (built by an older rigkit)"
    if manifest.get("embedding_model") != model:
        return f"was built with {manifest.get('embedding_model')!r}, not {model!r}"
    if manifest.get("chunking") != chunking:
        return f"was chunked with {manifest.get('chunking')}, not {chunking}"
    return None


def _stored_vectors(out: Path, manifest: dict[str, Any]) -> np.ndarray:
    """(n, dim) vectors of the index at `out`: its faiss file, or its Milvus collection."""
    if manifest["dense"].get("backend", "faiss") == "milvus":
        from rigkit.retrieval.milvus import open_collection

        return open_collection(manifest, out).vectors(manifest["chunks"])
    from rigkit.retrieval.dense import DenseRetriever

    return _faiss_vectors(DenseRetriever.read_index(out / "dense.faiss"))


def _faiss_vectors(index) -> np.ndarray:
    """(n, dim) vectors held by a faiss flat, HNSW or IVF index."""
    import faiss

    if isinstance(index, faiss.IndexIVF):
        index.make_direct_map()
    return np.ascontiguousarray(index.reconstruct_n(0, index.ntotal), dtype=np.float32)
