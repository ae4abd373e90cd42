"""Per-question metrics for RIG evaluation, all pure functions of a `RIGResult` and its gold data.

Answer quality follows the SQuAD / HotpotQA evaluation script that 2WikiMultihopQA and MuSiQue
reuse: lowercase, strip punctuation and English articles, collapse whitespace; exact match (EM)
and token F1, maximised over the gold answer and its aliases; a yes/no gold (or prediction)
scores F1 only when both agree, as in HotpotQA. Chinese text is scored per character, the
usual CMRC / DuReader concession since it has no spaces. Because small chat models answer in
sentences, `cover_em` (the gold's tokens appear contiguously in the prediction, the "accuracy" of
Self-RAG and DRAGIN's tables) is reported beside the strict scores.

Retrieval-side figures come from the trace: which passages were injected (supporting-paragraph
recall by title, and by paragraph id where the data has them, which is the stricter measure
for MuSiQue), how often the decider fired, what was pre-filled versus reused from the KV cache,
and how many extra model calls the decider and query builder cost. Faithfulness is a cheap
embedding check, not an entailment model: an answer sentence whose best cosine similarity to
any cited passage is below a threshold counts as unsupported.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.trace import Hit, RIGResult

__all__ = [
    "QAItem",
    "normalize_answer",
    "answer_tokens",
    "strip_citations",
    "exact_match",
    "token_f1",
    "cover_match",
    "injected_passages",
    "support_recall",
    "citation_precision",
    "split_sentences",
    "FaithfulnessScorer",
    "score_result",
]

_CITATION = re.compile(r"\[\[\s*citation\s*:\s*([^\]]*?)\s*\]\]", re.IGNORECASE)
_CJK_CHAR = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"
_TOKEN = re.compile(rf"[{_CJK_CHAR}]|[^\s{_CJK_CHAR}]+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
_YES_NO = {"yes", "no", "noanswer"}


@dataclass(frozen=True)
class QAItem:
    """One gold question, whatever shape the loader gave it (dict or object)."""

    id: str
    question: str
    answer: str
    aliases: tuple[str, ...] = ()
    type: str = ""
    supporting_titles: tuple[str, ...] = ()
    supporting_pids: tuple[str, ...] = ()
    dataset: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def golds(self) -> list[str]:
        return [self.answer, *[a for a in self.aliases if a != self.answer]]

    @classmethod
    def from_record(cls, record: Any) -> QAItem:
        """Accept a `qa.jsonl` dict or any object with the same attribute names."""

        def get(name: str, default: Any = None) -> Any:
            if isinstance(record, dict):
                return record.get(name, default)
            return getattr(record, name, default)

        paragraphs = get("paragraphs") or []
        pids = [
            (p.get("pid") if isinstance(p, dict) else getattr(p, "pid", None))
            for p in paragraphs
            if (p.get("is_supporting") if isinstance(p, dict) else getattr(p, "is_supporting", False))
        ]
        return cls(
            id=str(get("id")),
            question=str(get("question")),
            answer=str(get("answer", "")),
            aliases=tuple(get("answer_aliases") or get("aliases") or ()),
            type=str(get("type") or ""),
            supporting_titles=tuple(get("supporting_titles") or ()),
            supporting_pids=tuple(p for p in pids if p),
            dataset=str(get("dataset") or ""),
        )


def strip_citations(text: str) -> str:
    """The answer without `[[citation:ID]]` marks (they are not part of what is scored)."""
    return re.sub(r"\s{2,}", " ", _CITATION.sub("", text)).strip()


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation (any Unicode P*), no English articles."""
    text = strip_citations(text).lower()
    text = "".join(" " if unicodedata.category(ch).startswith("P") or ch in string.punctuation
                   else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    """Normalised tokens: whitespace words, except that every CJK character is its own token."""
    return _TOKEN.findall(normalize_answer(text))


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    pred = answer_tokens(prediction)
    return float(any(pred == answer_tokens(g) for g in golds if g))


def _f1(pred: list[str], gold: list[str]) -> float:
    pred_norm, gold_norm = " ".join(pred), " ".join(gold)
    # HotpotQA's rule: a yes/no answer is right or wrong, never partly right.
    if (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
        return 0.0
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    pred = answer_tokens(prediction)
    return max((_f1(pred, answer_tokens(g)) for g in golds if g), default=0.0)


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def cover_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if some gold answer's tokens occur contiguously in the prediction."""
    pred = answer_tokens(prediction)
    return float(any(_contains(pred, answer_tokens(g)) for g in golds if g))


def injected_passages(result: RIGResult) -> list[Hit]:
    """Distinct passages the context manager actually added, in order (not merely retrieved)."""
    seen: dict[str, Hit] = {}
    for rnd in result.rounds:
        added = set(rnd.injection.added) if rnd.injection else None
        for hit in rnd.hits:
            if (added is None or hit.chunk_id in added) and hit.chunk_id not in seen:
                seen[hit.chunk_id] = hit
    # Plain RAG and answers that were finished from context may only list their final passages.
    for hit in result.passages:
        seen.setdefault(hit.chunk_id, hit)
    return list(seen.values())


def _hit_pids(hit: Hit) -> set[str]:
    ids = {hit.doc_id, hit.chunk_id}
    for key in ("pid", "doc_id", "id"):
        if isinstance(hit.metadata.get(key), str):
            ids.add(hit.metadata[key])
    return ids


def support_recall(hits: Iterable[Hit], item: QAItem) -> tuple[float | None, float | None]:
    """(share of supporting titles, share of supporting paragraph ids) among the hits.

    None where the gold data names none. Titles follow the reference figures; ids are stricter
    (MuSiQue repeats titles across different paragraphs).
    """
    hits = list(hits)
    titles = {h.title for h in hits}
    pids = set().union(*(_hit_pids(h) for h in hits)) if hits else set()
    gold_titles, gold_pids = set(item.supporting_titles), set(item.supporting_pids)
    by_title = len(gold_titles & titles) / len(gold_titles) if gold_titles else None
    by_pid = len(gold_pids & pids) / len(gold_pids) if gold_pids else None
    return by_title, by_pid


def citation_precision(result: RIGResult, item: QAItem, hits: Sequence[Hit]) -> float | None:
    """Share of cited chunks that contain a gold answer or are a supporting paragraph."""
    cited = list(dict.fromkeys(result.citations or _CITATION.findall(result.answer)))
    if not cited:
        return None
    by_id: dict[str, Hit] = {}
    for hit in [*hits, *result.passages]:
        for key in (hit.chunk_id, hit.doc_id):
            by_id.setdefault(key, hit)
    good = 0
    for cid in cited:
        hit = by_id.get(cid)
        if hit is None:
            continue  # a citation of nothing in context is a wrong citation
        supporting = hit.title in item.supporting_titles or bool(
            _hit_pids(hit) & set(item.supporting_pids))
        text = answer_tokens(f"{hit.title}. {hit.text}")
        if supporting or any(_contains(text, answer_tokens(g)) for g in item.golds if g):
            good += 1
    return good / len(cited)


def split_sentences(text: str) -> list[str]:
    """Answer sentences (terminal punctuation + space, or CJK 。！？), citations removed."""
    parts = _SENTENCE_END.split(strip_citations(text))
    return [p.strip() for p in parts if any(ch.isalnum() for ch in p)]


class FaithfulnessScorer:
    """Counts answer sentences with no similar passage: best cosine similarity < `threshold`.

    `embedder` is anything with SentenceTransformer's `encode(texts, normalize_embeddings=True)`;
    by default `rigkit.embeddings.load_embedder()` (loaded on first use).
    """

    def __init__(self, embedder: Any = None, threshold: float = 0.5):
        self._embedder = embedder
        self.threshold = threshold

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from rigkit.embeddings import load_embedder

            self._embedder = load_embedder()
        return self._embedder

    def __call__(self, answer: str, passages: Sequence[Hit]) -> dict[str, Any]:
        sentences = split_sentences(answer)
        if not passages or not sentences:
            return {"answer_sentences": len(sentences), "unsupported_sentences": None,
                    "faithful": None}
        import numpy as np

        texts = [f"{p.title}. {p.text}" for p in passages]
        vectors = np.asarray(self.embedder.encode(sentences + texts, normalize_embeddings=True))
        sims = vectors[: len(sentences)] @ vectors[len(sentences) :].T  # (sentences, passages)
        unsupported = int((sims.max(axis=1) < self.threshold).sum())
        return {"answer_sentences": len(sentences), "unsupported_sentences": unsupported,
                "faithful": unsupported == 0}


def _tokens_injected(result: RIGResult) -> int:
    """Passage tokens put into context: up-front passages (plain RAG) plus every injection."""
    added = sum(r.injection.tokens_added for r in result.rounds if r.injection)
    if not result.rounds:
        return added
    first = result.rounds[0]
    # The first round's budget is taken after its own injection; what remains came up front.
    upfront = first.budget.passages - (first.injection.tokens_added if first.injection else 0)
    return added + max(0, upfront)


def _trace_counts(result: RIGResult) -> dict[str, Any]:
    rounds = result.rounds
    fired = sum(1 for r in rounds if r.decision.retrieve)
    extra_passes = sum(r.decision.extra_forward_passes for r in rounds)
    llm_calls = sum(r.query.llm_calls for r in rounds if r.query)
    tokens = result.tokens or {}
    generated = int(tokens.get("generated", 0))
    return {
        "retrievals": int(result.used_retrieval_times),
        "segments": len(rounds),
        "trigger_rate": fired / len(rounds) if rounds else 0.0,
        "tokens_injected": _tokens_injected(result),
        "tokens_generated": generated,
        "tokens_prefilled": int(tokens.get("prefilled", 0)),
        "tokens_reused": int(tokens.get("reused", 0)),
        # One decode step per generated token (the first also pre-fills), plus decider passes.
        "forward_passes": generated + extra_passes,
        "extra_forward_passes": extra_passes,
        "extra_model_calls": llm_calls,
        "low_confidence": bool(result.low_confidence),
    }


def _stage_timings(result: RIGResult) -> dict[str, float]:
    if result.timings:
        return {k: float(v) for k, v in result.timings.items() if k != "total"}
    stages: dict[str, float] = {}
    for rnd in result.rounds:
        for key, value in rnd.timings.items():
            stages[key] = stages.get(key, 0.0) + float(value)
    return stages


def score_result(
    result: RIGResult, item: QAItem, faithfulness: FaithfulnessScorer | None = None
) -> dict[str, Any]:
    """Every per-question metric as a flat JSON-able dict (None where undefined)."""
    hits = injected_passages(result)
    by_title, by_pid = support_recall(hits, item)
    answer = strip_citations(result.answer)
    record: dict[str, Any] = {
        "em": exact_match(answer, item.golds),
        "f1": token_f1(answer, item.golds),
        "cover_em": cover_match(answer, item.golds),
        "support_recall": by_title,
        "support_recall_pid": by_pid,
        "passages_injected": len(hits),
        "citation_precision": citation_precision(result, item, hits),
        **_trace_counts(result),
        "timings": _stage_timings(result),
    }
    cited = [h for h in hits if h.chunk_id in set(result.citations)] or hits
    if faithfulness is not None:
        record.update(faithfulness(answer, cited))
    return record
