"""Feature sets for the retrieval-trigger classifier, combinable by name.

- `probability`: FLARE-style confidence summaries of the segment's tokens: min / mean token
  probability, max / mean entropy (nats), and the share of *content* tokens (not stop words or
  punctuation) whose probability is below `low_prob`.
- `embedding`: a sentence-transformers embedding of "question [SEP] segment" (all-MiniLM-L6-v2 by
  default, normalised), so the classifier can learn which *kinds* of claims the model gets wrong.
- `hidden`: a probe on the generator's mean-pooled last-layer hidden state of the segment
  (in the spirit of SAPLMA / "the internal state of an LLM knows when it's lying"). Only an
  in-process model exposes it, and a probe trained on one model is meaningless on another, so the
  spec records the generator and a mismatch is an error.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError, RigkitError
from rigkit.trace import Segment

__all__ = [
    "FEATURE_SETS",
    "FeatureSpec",
    "FeatureInput",
    "FeatureExtractor",
    "probability_features",
    "content_mask",
    "parse_feature_sets",
]

FEATURE_SETS = ("probability", "embedding", "hidden")
PROBABILITY_NAMES = ("min_prob", "mean_prob", "max_entropy", "mean_entropy", "low_prob_share")
_STRIP = string.punctuation + string.whitespace + "\u0120\u2581\u010a"  # BPE space/newline marks


@dataclass(frozen=True)
class FeatureSpec:
    """Which feature sets, and what produced them; stored in every trained model file."""

    sets: tuple[str, ...] = ("probability", "embedding")
    embedding_model: str = RetrievalConfig.embedding_model  # the dense index's model
    low_prob: float = 0.3  # a content token below this probability counts as low-confidence
    generator: str | None = None  # spec of the generator whose segments (and hidden states) these are
    hidden_dim: int | None = None  # set when `hidden` is used
    embedding_dim: int | None = None

    def __post_init__(self) -> None:
        unknown = [s for s in self.sets if s not in FEATURE_SETS]
        if unknown or not self.sets:
            raise InputError(f"unknown feature set(s) {unknown}; choose from {list(FEATURE_SETS)}")

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureSpec:
        return cls(**{**data, "sets": tuple(data["sets"])})


@dataclass
class FeatureInput:
    """What the features of one segment are computed from."""

    question: str
    segment: Segment
    hidden: Sequence[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def parse_feature_sets(text: str | Sequence[str]) -> tuple[str, ...]:
    """"probability,embedding" or "probability+hidden" -> ("probability", "embedding")."""
    items = text.replace("+", ",").split(",") if isinstance(text, str) else list(text)
    sets = tuple(dict.fromkeys(s.strip() for s in items if s.strip()))
    FeatureSpec(sets=sets)  # validates
    return sets


def content_mask(tokens: Sequence[str]) -> list[bool]:
    """True for tokens that carry content: not punctuation, whitespace or a stop word."""
    from rigkit.text import is_stop  # the stop words the prob/entropy deciders skip

    mask = []
    for tok in tokens:
        word = tok.strip(_STRIP).lower()
        mask.append(bool(word) and not is_stop(word))
    return mask


def probability_features(segment: Segment, low_prob: float = 0.3) -> list[float]:
    """(5,) = min/mean prob, max/mean entropy, low-prob content share; neutral for empty segments."""
    if not segment.logprobs:
        return [1.0, 1.0, 0.0, 0.0, 0.0]
    probs = [math.exp(lp) for lp in segment.logprobs]
    ents = list(segment.entropies) or [0.0]
    mask = content_mask(segment.tokens) if segment.tokens else [True] * len(probs)
    content = [p for p, m in zip(probs, mask, strict=False) if m]
    share = sum(p < low_prob for p in content) / len(content) if content else 0.0
    return [min(probs), sum(probs) / len(probs), max(ents), sum(ents) / len(ents), share]


class FeatureExtractor:
    """Turns `FeatureInput`s into one matrix (n, d) in a fixed column order given by the spec."""

    def __init__(self, spec: FeatureSpec, embedder: Any | None = None):
        self.spec = spec
        self._embedder = embedder

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from rigkit.embeddings import load_embedder

            self._embedder = load_embedder(self.spec.embedding_model)
        return self._embedder

    def names(self) -> list[str]:
        out: list[str] = []
        for name in self.spec.sets:
            if name == "probability":
                out += list(PROBABILITY_NAMES)
            elif name == "embedding":
                out += [f"emb_{i}" for i in range(self.spec.embedding_dim or 0)]
            else:
                out += [f"hidden_{i}" for i in range(self.spec.hidden_dim or 0)]
        return out

    def transform(self, items: Sequence[FeatureInput]) -> np.ndarray:
        blocks = []
        for name in self.spec.sets:
            if name == "probability":
                blocks.append(self._probability(items))
            elif name == "embedding":
                blocks.append(self._embedding(items))
            else:
                blocks.append(self._hidden(items))
        return np.hstack(blocks).astype(np.float32) if blocks else np.zeros((len(items), 0))

    def _probability(self, items: Sequence[FeatureInput]) -> np.ndarray:
        for item in items:
            if not item.segment.logprobs and item.segment.text.strip():
                raise RigkitError(
                    "the 'probability' features need per-token log-probabilities, and this "
                    "segment has none (bring-your-own text rows, or a generator without logprobs); "
                    "train with --features embedding, or score the rows with a generator first"
                )
        low = self.spec.low_prob
        return np.array([probability_features(i.segment, low) for i in items], dtype=np.float32)

    def _embedding(self, items: Sequence[FeatureInput]) -> np.ndarray:
        texts = [f"{i.question} [SEP] {i.segment.text}".strip() for i in items]
        vecs = self.embedder.encode(
            texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False
        )
        vecs = np.asarray(vecs, dtype=np.float32).reshape(len(items), -1)
        if self.spec.embedding_dim is not None and vecs.shape[1] != self.spec.embedding_dim:
            raise RigkitError(
                f"embedding model {self.spec.embedding_model!r} gives {vecs.shape[1]} dims, the "
                f"classifier was trained on {self.spec.embedding_dim}"
            )
        return vecs

    def _hidden(self, items: Sequence[FeatureInput]) -> np.ndarray:
        if any(i.hidden is None for i in items):
            raise RigkitError(
                "the 'hidden' features need the generator's hidden state of each segment; these "
                "rows have none (labels built with --no-hidden, or bring-your-own text)"
            )
        mat = np.asarray([list(i.hidden) for i in items], dtype=np.float32)  # type: ignore[arg-type]
        if self.spec.hidden_dim is not None and mat.shape[1] != self.spec.hidden_dim:
            raise RigkitError(
                f"hidden states have {mat.shape[1]} dims, the classifier's probe expects "
                f"{self.spec.hidden_dim} (generator {self.spec.generator!r})"
            )
        return mat
