"""Fixtures for the trigger tests: synthetic labelled rows and a model-free embedder."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np

from rigkit.trigger.labelset import LabelledSegment, LabelSet

FACTS = ["born in 1932", "directed by Shawn Levy", "released in 2021", "located in Paris"]
FILLER = ["The answer is clear", "This is well known", "It is the film", "That is the one"]


class HashEmbedder:
    """A deterministic bag-of-words embedder (no model): enough to test the plumbing."""

    dim = 16

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


def make_row(qid: str, index: int, positive: bool, rng: random.Random, hidden_dim: int = 0):
    """Positive rows state a fact with low-probability tokens; negatives are confident filler."""
    text = f"{rng.choice(FILLER)} {rng.choice(FACTS)}." if positive else f"{rng.choice(FILLER)}."
    words = text.split(" ")
    tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
    probs = [rng.uniform(0.05, 0.35) if positive and i >= 4 else rng.uniform(0.7, 0.99)
             for i in range(len(tokens))]
    hidden = None
    if hidden_dim:
        hidden = [rng.gauss(1.0 if positive else -1.0, 1.0) for _ in range(hidden_dim)]
    label = int(positive)
    return LabelledSegment(
        qid=qid, question=f"Question {qid}?", text=text, label=label, index=index, tokens=tokens,
        logprobs=[math.log(p) for p in probs], entropies=[-math.log(p) * 1.5 for p in probs],
        hidden=hidden, rules={"r1": label, "r2": label, "any": label, "all": label},
    )


def synthetic_labels(n_questions: int = 40, seed: int = 0, hidden_dim: int = 0) -> LabelSet:
    rng = random.Random(seed)
    rows = []
    for q in range(n_questions):
        hard = q % 3 == 0  # a third of the questions hold the positive segments (imbalanced)
        for i in range(3):
            rows.append(make_row(f"q{q:03d}", i, hard and i > 0, rng, hidden_dim))
    meta = {"rule": "any", "generator": "scripted", "data_hash": "test", "set_dir": None}
    return LabelSet(rows, meta)
