"""Retrieval test helpers (imported explicitly by tests/test_retrieval_*.py)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from rigkit.retrieval.tokenize import tokenize

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


class HashEmbedder:
    """A model-free stand-in for SentenceTransformer.encode: hashed bag of BM25 tokens, unit length."""

    dim = 64

    def __init__(self):
        self.calls = 0

    def encode(
        self,
        texts,
        batch_size=64,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    ):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for token in tokenize(text):
                out[i, zlib.crc32(token.encode()) % self.dim] += 1.0
            out[i, 0] += 1e-3  # no zero vectors
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
