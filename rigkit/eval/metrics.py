"""Per-question metrics for RIG evaluation, all pure functions of a `RIGResult` and its gold data.

Answer quality (`rigkit.eval.answers`): EM and F1 exactly as the official SQuAD v1.1 / HotpotQA
scripts that 2WikiMultihopQA and MuSiQue reuse, maximised over the gold answer and its aliases;
Chinese golds per character; the same two scores on the short answer `extract_answer` takes out
of the reply (`em_extracted`, `f1_extracted`), beside the raw ones, never instead; and
`cover_em` (the gold's tokens appear contiguously in the reply, the "accuracy" of Self-RAG and
DRAGIN's tables), and `type_aware`, Cover EM made to fit the answer asked for (`typed_match`:
yes/no questions scored as yes/no, two-option questions by the option named first).

The short answer line (`RIGResult.short_answer`, extracted or asked for in the loop; extracted
here for results that lack it) is scored as `em_short` / `f1_short`, the report's headline.
Harm: `draft_cover_em` is the Cover EM of the draft before the first retrieval (the answer as
far as it went plus the flagged segment), so the report can count answers retrieval made wrong.
What the loop's guards did is counted per answer: fallbacks, repeats cut, query guards that
fired, unfinished endings trimmed, sentences flagged unsupported, grounded rewrites tried and
kept; and, as checks on the final text, sentences that repeat an earlier one and an answer ending mid-sentence.

Retrieval-side figures come from the trace: which passages were injected (supporting-paragraph
recall by title, and by paragraph id where the data has them, which is the stricter measure
for MuSiQue), how often the decider fired, what was pre-filled versus reused from the KV cache,
and how many extra model calls the decider and query builder cost.

Sentence support is a cheap embedding check, not an entailment model. Each answer sentence is
compared with every passage that was in context when it was written (the trace records them per
sentence), not with the passages it cites: citations are chosen *because* they overlap with the
sentence, so scoring against them would be circular. A sentence is supported when its best cosine
similarity reaches a threshold; a sentence written before any passage was in context is not.
Two figures, named for what they count: `all_sentences_supported` (per question: every sentence
is supported) and `sentence_support_share` (per sentence: supported / all, pooled over sentences
by the aggregation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.citations import attribute
from rigkit.eval.answers import cover_match, exact_match, extract_answer, token_f1, typed_match
from rigkit.guards import repeated_sentence, whole_sentences
from rigkit.text import find_citations, split_sentences, strip_citations
from rigkit.trace import Action, Hit, RIGResult, answer_end

__all__ = [
    "QAItem",
    "injected_passages",
    "support_recall",
    "citation_precision",
    "FaithfulnessScorer",
    "sentence_support",
    "score_result",
]


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
    cited = list(dict.fromkeys(result.citations or find_citations(result.answer)))
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
        if supporting or cover_match(f"{hit.title}. {hit.text}", item.golds):
            good += 1
    return good / len(cited)


class FaithfulnessScorer:
    """Sentence support: best cosine similarity to a passage in context >= `threshold`.

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

    def __call__(
        self, answer: str, passages: Sequence[Hit], visible: Sequence[Sequence[str] | None] | None = None
    ) -> dict[str, Any]:
        """Support of each sentence of `answer` by `passages`.

        `visible[i]`: chunk ids in context when sentence i was written (None: all `passages`);
        without `visible` every passage counts for every sentence.
        """
        sentences = split_sentences(answer)
        if visible is not None and len(visible) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(visible)} visibility lists")
        if not passages or not sentences:
            return {"answer_sentences": len(sentences), "supported_sentences": None,
                    "all_sentences_supported": None, "sentence_support_share": None}
        import numpy as np

        texts = [f"{p.title}. {p.text}" for p in passages]
        vectors = np.asarray(self.embedder.encode(sentences + texts, normalize_embeddings=True))
        sims = vectors[: len(sentences)] @ vectors[len(sentences) :].T  # (sentences, passages)
        index = {p.chunk_id: j for j, p in enumerate(passages)}
        supported = 0
        for i in range(len(sentences)):
            ids = None if visible is None else visible[i]
            cols = list(range(len(passages))) if ids is None else [index[c] for c in ids if c in index]
            supported += bool(cols) and float(sims[i, cols].max()) >= self.threshold
        return {"answer_sentences": len(sentences), "supported_sentences": supported,
                "all_sentences_supported": supported == len(sentences),
                "sentence_support_share": supported / len(sentences)}


def sentence_support(result: RIGResult, scorer: FaithfulnessScorer) -> dict[str, Any]:
    """`scorer` on the result's answer against what each sentence could see when written.

    Results from traces older than version 2 record no visibility: every injected passage counts.
    """
    answer = strip_citations(result.answer)
    passages = injected_passages(result)
    attributions = result.attributions or attribute(answer, passages)  # old: all visible
    if [a.text for a in attributions] != split_sentences(answer):
        raise ValueError("the result's attributions do not match its answer's sentences")
    return scorer(answer, passages, [a.visible for a in attributions])


def _tokens_injected(result: RIGResult) -> int:
    """Passage tokens put into context: up-front passages (plain RAG) plus every injection."""
    added = sum(r.injection.tokens_added for r in result.rounds if r.injection)
    if result.upfront is not None:  # recorded by the context manager (traces since budgets matched)
        return added + result.upfront.tokens_added
    if not result.rounds:
        return added
    first = result.rounds[0]
    # The first round's budget is taken after its own injection; what remains came up front.
    upfront = first.budget.passages - (first.injection.tokens_added if first.injection else 0)
    return added + max(0, upfront)


def _trace_counts(result: RIGResult) -> dict[str, Any]:
    rounds = result.rounds
    fired = sum(1 for r in rounds if r.decision.retrieve)
    judged = sum(r.action is not Action.GROUND for r in rounds)  # a grounded rewrite is not the decider's
    extra_passes = sum(r.decision.extra_forward_passes for r in rounds)
    llm_calls = sum(r.query.llm_calls for r in rounds if r.query)
    tokens = result.tokens or {}
    generated = int(tokens.get("generated", 0))
    return {
        "retrievals": int(result.used_retrieval_times),
        "segments": len(rounds),
        "trigger_rate": fired / judged if judged else 0.0,
        "tokens_injected": _tokens_injected(result),
        "tokens_generated": generated,
        "tokens_prefilled": int(tokens.get("prefilled", 0)),
        "tokens_reused": None if tokens.get("reused", 0) is None else int(tokens.get("reused", 0)),  # None: server did not say
        # One decode step per generated token (the first also pre-fills), plus decider passes.
        "forward_passes": generated + extra_passes,
        "extra_forward_passes": extra_passes,
        "extra_model_calls": llm_calls,
        "model_calls": len(rounds) + llm_calls,  # a generation request per round, plus the helpers'
        "low_confidence": bool(result.low_confidence),
    }


def _guard_counts(result: RIGResult, answer: str) -> dict[str, Any]:
    """What the loop's guards did, and the two checks on the final text they aim at."""
    sentences = split_sentences(answer)
    repeated = sum(repeated_sentence(s, sentences[:i]) is not None for i, s in enumerate(sentences))
    guards = [g for r in result.rounds for g in r.guards]
    unfinished = bool(answer.strip()) and whole_sentences(answer) != answer
    grounded = [r for r in result.rounds if r.action is Action.GROUND]
    end = answer_end(result.rounds)  # the segment the answer ends with, and whether a repeat was cut there
    return {
        # a rewrite dropped for the segment it was to replace: the rewrite check's, a grounded one's
        "fallbacks": sum(bool(r.fallback) for r in result.rounds),  # each records why
        "repeats_cut": sum(r.action is Action.REPEAT for r in result.rounds),
        "query_guard_hits": sum(not g.startswith(("repeat:", "phrase loop:")) for g in guards),
        "trimmed": int(bool(result.trimmed)),
        "unsupported_flagged": sum(len(r.unsupported) for r in result.rounds),
        "grounded_rewrites": len(grounded),  # controller.rewrite_unsupported: rewrites tried
        "grounded_kept": sum(not r.fallback for r in grounded),  # ... and kept (supported)
        "repeated_sentences": repeated,
        "ends_mid_sentence": int(unfinished),
        # unfinished because generation was cut (the token budget, or a guard cutting a repeat or
        # phrase loop), not because the model itself ended its turn after a phrase ("Letitia Green
        # Stevenson (1843 – 1913)")
        "cut_mid_sentence": int(unfinished and end is not None and (end[1] or not end[0].finished)),
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
    short = extract_answer(answer, item.question)
    line = result.short_answer or short  # results written before the short answer line: extracted
    draft = result.pre_retrieval_draft
    record: dict[str, Any] = {
        "em_short": exact_match(line, item.golds),
        "f1_short": token_f1(line, item.golds),
        "short_answer": line,
        "em": exact_match(answer, item.golds),
        "f1": token_f1(answer, item.golds),
        "em_extracted": exact_match(short, item.golds),
        "f1_extracted": token_f1(short, item.golds),
        "extracted_answer": short,
        "cover_em": cover_match(answer, item.golds),
        "type_aware": typed_match(answer, item.question, item.golds),
        "draft_cover_em": None if draft is None else cover_match(draft, item.golds),
        "support_recall": by_title,
        "support_recall_pid": by_pid,
        "passages_injected": len(hits),
        "citation_precision": citation_precision(result, item, hits),
        # answer sentences whose facts no passage they could see holds (rigkit.grounding); None
        # without passages, where the check does not run
        "suspicious_share": len(result.suspicious) / len(result.attributions) if hits and result.attributions else None,
        **_trace_counts(result),
        **_guard_counts(result, answer),
        "timings": _stage_timings(result),
    }
    if faithfulness is not None:
        record.update(sentence_support(result, faithfulness))
    return record
