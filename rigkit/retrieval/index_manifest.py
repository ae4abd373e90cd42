"""An index folder's manifest: written at build, read and checked at every load."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rigkit.errors import IndexCorruptError, IndexMismatchError, InputError
from rigkit.retrieval.storage import rebuild_hint
from rigkit.retrieval.tokenize import TOKENIZER_VERSION, user_dict_record

__all__ = ["FORMAT_VERSION", "check_manifest", "new_manifest", "read_manifest"]

FORMAT_VERSION = 2  # 2: the manifest lists every file's size and SHA-256


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


def new_manifest(
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
