"""Query builders: turn a decider's verdict into the text that is actually searched.

One verb, `build(question, draft, decision) -> Query`; each `Query` records its mode, the intent
it served, the extra model calls it cost and, when a builder had to fall back, what it fell back
from. Modes follow the papers that introduced them:
- `marker`: the phrase the model wrote inside its own retrieval marker (Toolformer-style); a
  phrase shorter than `min_words` falls back to `rewrite` (or to `masked` without a generator).
  Any marker protocol's tags are read and stripped (`decision.evidence` names them); Self-RAG's
  `[Retrieval]` carries no phrase, so it always falls back.
- `masked`: FLARE's implicit query: the flagged sentence with its low-confidence words removed.
- `rewrite`: one helper call to the generator with question, draft and intent (the "consolidate"
  step of later RIG systems); small models chat around the query, so only the first useful line
  is kept, preambles / quotes / explanations are stripped and the length is capped.
- `keywords`: entities, codes and numbers of the flagged span plus the question's key terms.
- `attention`: DRAGIN's query formulation (QFS): the words the trigger token attends to most,
  in text order, from `decision.evidence["attended_words"]`; falls back to `masked`.
- `multi`: several searches for one need (multi-query retrieval, as in RAG-Fusion): one helper
  call asks for up to `max_subqueries` queries, one per line, each cleaned like a rewrite and
  deduplicated; nothing usable falls back to `masked` (no second model call). The controller
  searches each and merges the lists by RRF. A marker can carry several searches as
  ParallelSearch writes them, `<search>q1 ## q2</search>`; `marker` mode splits them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rigkit.config import QueryConfig
from rigkit.errors import InputError
from rigkit.generation.protocol import Generator
from rigkit.markers import SUBQUERY_SEPARATOR, marker_spec, split_subqueries, strip_markers
from rigkit.query_text import (
    clean_rewrite,
    distinct_queries,
    parse_subqueries,
    resolve_query,
    standalone_question,
    truncate_query,
)
from rigkit.text import (
    count_query_units,
    fact_words,
    has_cjk,
    has_content,
    is_stop,
    key_terms,
    mentions,
    split_words,
)
from rigkit.trace import Decision, Query

if TYPE_CHECKING:  # the state's type only: building a query needs no decider
    from rigkit.deciders.base import DecisionState

__all__ = [
    "QueryBuilder",
    "MarkerQuery",
    "AutoQuery",
    "MaskedQuery",
    "RewriteQuery",
    "KeywordsQuery",
    "AttentionQuery",
    "MultiQuery",
    "QUERY_BUILDERS",
    "QueryBuilderFactory",
    "build_query_builder",
    "check_query_mode",
    "clean_rewrite",
    "parse_subqueries",
    "truncate_query",
    "standalone_question",
    "resolve_query",
]


@runtime_checkable
class QueryBuilder(Protocol):
    """`build(question, draft, decision, state) -> Query`.

    `state` is the round's `DecisionState`: earlier segments, passages in context, the last
    query and its hits (None when a builder is called outside the loop). Builders are made by a
    factory `(QueryConfig, generator) -> QueryBuilder` registered in `QUERY_BUILDERS`.
    """

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query: ...


def _intent(decision: Decision) -> str:
    return "; ".join(decision.intents) if decision.intents else ""


def _missing(decision: Decision) -> str:
    """What the model is told is missing: the decider's intents, else the flagged segment."""
    return _intent(decision) or strip_markers(decision.segment_text, marker_spec(decision.evidence))


def _need_block(question: str, draft: str, intent: str) -> str:
    """The question, the draft and what is missing, in the question's language (query prompts)."""
    if has_cjk(question):
        return (f"问题：{question}\n当前回答：{draft or '（尚无）'}\n"
                + (f"缺少：{intent}\n" if intent else ""))
    return (f"Question: {question}\nAnswer so far: {draft or '(nothing yet)'}\n"
            + (f"Missing: {intent}\n" if intent else ""))


def _with_question_terms(question: str, text: str, include: bool) -> str:
    """`text` prefixed by the question's key terms that it does not already mention."""
    if not include:
        return text
    terms = [t for t in key_terms(question) if not mentions(text, t)]
    return " ".join(terms + [text]).strip()


class MaskedQuery:
    """FLARE's masked query: the segment without its low-confidence spans."""

    mode = "masked"

    def __init__(self, include_question: bool = QueryConfig.include_question):
        self.include_question = include_question

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        text = decision.segment_text
        cuts = sorted(
            (s.char_start, s.char_end) for s in decision.spans if 0 <= s.char_start < s.char_end
        )
        for start, end in reversed(cuts):  # right to left keeps earlier offsets valid
            text = text[:start] + " " + text[end:]
        for span in decision.spans:
            if span.char_start < 0 and span.text:
                text = text.replace(span.text, " ")
        text = strip_markers(text, marker_spec(decision.evidence))
        text = re.sub(r"\s+", " ", text).strip()
        if not has_content(text):  # everything was uncertain: the question is what is left
            return Query(question.strip(), "question", _intent(decision), fallback_from=self.mode)
        return Query(
            _with_question_terms(question, text, self.include_question), self.mode, _intent(decision)
        )


class RewriteQuery:
    """One helper call: the model writes the search query; its reply is cleaned."""

    mode = "rewrite"

    def __init__(self, generator: object, max_words: int = QueryConfig.max_words, max_new_tokens: int = 48):
        if not isinstance(generator, Generator):
            raise InputError("query mode 'rewrite' needs a generator (it asks the model for the query)")
        self.generator = generator
        self.max_words = max_words
        self.max_new_tokens = max_new_tokens

    def prompt(self, question: str, draft: str, intent: str) -> str:
        if has_cjk(question):
            return (
                "请写一个简短的搜索查询，用来查找回答问题所缺少的信息。\n"
                + _need_block(question, draft, intent)
                + "只回复查询本身，一行。"
            )
        return (
            "Write one short search query that would find the missing information.\n"
            + _need_block(question, draft, intent)
            + "Reply with the query only, on one line."
        )

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        intent = _missing(decision)
        reply = self.generator.generate(
            self.prompt(question, draft, intent), max_new_tokens=self.max_new_tokens
        )
        text = clean_rewrite(reply, self.max_words)
        if not has_content(text):  # the model produced nothing usable
            return Query(question.strip(), "question", intent, llm_calls=1, fallback_from=self.mode)
        return Query(text, self.mode, intent, llm_calls=1)


_SOURCE_PREFIX = re.compile(r"@([A-Za-z][A-Za-z0-9_.-]{0,63})(?:\s+|$)(.*)", re.DOTALL)


class MarkerQuery:
    """The marker's own phrase; too short (< `min_words`) and it falls back to `fallback`.

    A phrase with `##` holds several searches (ParallelSearch): up to `max_subqueries` of them
    become the query's `subqueries`. A phrase that starts with `@name ` names the knowledge base
    to search (`<retrieve>@manuals pump pressure</retrieve>`): the query's `source`."""

    mode = "marker"

    def __init__(self, min_words: int = 2, fallback: QueryBuilder | None = None,
                 max_subqueries: int = QueryConfig.max_subqueries, split_markers: bool = QueryConfig.split_markers):
        self.min_words = min_words
        self.fallback = fallback or MaskedQuery()
        self.max_subqueries = max_subqueries
        self.split_markers = split_markers  # two markers in one segment: two searches

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        markers = decision.evidence.get("markers")
        phrases = [m["phrase"] for m in markers if m["phrase"]] if markers else decision.intents
        named = [_SOURCE_PREFIX.match(p.strip()) for p in phrases]
        source = next((m.group(1) for m in named if m), "")
        phrases = [(m.group(2) if m else p).strip() for m, p in zip(named, phrases)]
        phrases = [p for p in phrases if p]
        text = "; ".join(phrases)
        searches: list[str] = []
        several = self.split_markers and len(phrases) > 1
        if several or any(split_subqueries(p) != [p] for p in phrases):  # `q1 ## q2`: each is searched
            searches = distinct_queries([q for p in phrases for q in split_subqueries(p)], self.max_subqueries)
            text = f" {SUBQUERY_SEPARATOR} ".join(searches)
        if count_query_units(" ".join(searches) or text) >= self.min_words:
            return Query(text, self.mode, text, subqueries=searches if len(searches) > 1 else [], source=source)
        query = self.fallback.build(question, draft, decision, state)
        query.fallback_from, query.source = self.mode, source
        return query


class AutoQuery:
    """The marker's phrase when the decision carries a marker, else the masked sentence: one
    setting that serves `--decider marker` and every other decider alike."""

    mode = "auto"

    def __init__(self, marker: MarkerQuery, otherwise: QueryBuilder):
        self.marker, self.otherwise = marker, otherwise

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        markers = decision.evidence.get("markers") or []
        if any(m.get("phrase") for m in markers):
            return self.marker.build(question, draft, decision, state)
        return self.otherwise.build(question, draft, decision, state)


class KeywordsQuery:
    """Entities / codes / numbers of the flagged spans (else their content words), plus the
    question's key terms; deduplicated, in order, capped at `max_words`."""

    mode = "keywords"

    def __init__(self, include_question: bool = QueryConfig.include_question,
                 max_words: int = QueryConfig.max_words):
        self.include_question = include_question
        self.max_words = max_words

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        sources = [s.text for s in decision.spans] + list(decision.intents)
        if not sources:
            sources = [w.text for w in fact_words(decision.segment_text)]
        terms: list[str] = []
        for source in sources:
            source = strip_markers(source, marker_spec(decision.evidence))
            facts = [w.text for w in fact_words(source)]
            terms += facts or [w.text for w in split_words(source) if not is_stop(w.text)]
        if self.include_question:
            terms += key_terms(question)
        unique: list[str] = []
        for term in terms:
            if not any(mentions(u, term) for u in unique):
                unique = [u for u in unique if not mentions(term, u)] + [term]
        text = truncate_query(" ".join(unique), self.max_words)
        if not text:
            return Query(question.strip(), "question", _intent(decision), fallback_from=self.mode)
        return Query(text, self.mode, _intent(decision))


class AttentionQuery:
    """DRAGIN's QFS: the words the trigger token attended to most; else `fallback` (masked)."""

    mode = "attention"

    def __init__(self, include_question: bool = QueryConfig.include_question, fallback: QueryBuilder | None = None):
        self.include_question = include_question
        self.fallback = fallback or MaskedQuery(include_question)

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        words = decision.evidence.get("attended_words") or []
        if not words:
            query = self.fallback.build(question, draft, decision, state)
            query.fallback_from = self.mode
            return query
        text = _with_question_terms(question, " ".join(words), self.include_question)
        return Query(text, self.mode, _intent(decision))


class MultiQuery:
    """One helper call: the model lists up to `max_queries` searches for what the draft lacks."""

    mode = "multi"

    def __init__(self, generator: object, max_queries: int = QueryConfig.max_subqueries,
                 max_words: int = QueryConfig.max_words, fallback: QueryBuilder | None = None):
        if not isinstance(generator, Generator):
            raise InputError("query mode 'multi' needs a generator (it asks the model for the queries)")
        if max_queries < 1:
            raise InputError(f"query.max_subqueries must be at least 1, got {max_queries}")
        self.generator, self.max_queries, self.max_words = generator, max_queries, max_words
        self.fallback = fallback or MaskedQuery()
        self.max_new_tokens = 16 + 20 * max_queries  # a short query is 5-20 tokens, plus list marks

    def prompt(self, question: str, draft: str, intent: str) -> str:
        n = self.max_queries
        if has_cjk(question):
            return (
                f"请写最多{n}个简短的搜索查询，合起来能找到回答问题所缺少的信息，每个查询找一方面。\n"
                + _need_block(question, draft, intent)
                + "只回复查询本身，每行一个。"
            )
        return (
            f"Write up to {n} short search queries that together would find the missing "
            "information, each for a different part of it.\n"
            + _need_block(question, draft, intent)
            + "Reply with the queries only, one per line."
        )

    def build(
        self, question: str, draft: str, decision: Decision, state: DecisionState | None = None
    ) -> Query:
        intent = _missing(decision)
        reply = self.generator.generate(self.prompt(question, draft, intent), max_new_tokens=self.max_new_tokens)
        searches = parse_subqueries(reply, self.max_queries, self.max_words)
        if not searches:  # nothing usable: the one query the fallback builds, no second call
            query = self.fallback.build(question, draft, decision, state)
            query.llm_calls += 1
            query.fallback_from = self.mode
            return query
        return Query(f" {SUBQUERY_SEPARATOR} ".join(searches), self.mode, intent, llm_calls=1,
                     subqueries=searches)


QueryBuilderFactory = Callable[[QueryConfig, "Generator | None"], QueryBuilder]


def _marker(config: QueryConfig, generator: Generator | None) -> MarkerQuery:
    # too-short marker phrases fall back to a rewrite when a model is at hand, else to masked
    fallback = (RewriteQuery(generator, config.max_words) if generator is not None
                else MaskedQuery(config.include_question))
    return MarkerQuery(config.min_marker_words, fallback, config.max_subqueries, config.split_markers)


QUERY_BUILDERS: dict[str, QueryBuilderFactory] = {
    "auto": lambda config, generator: AutoQuery(_marker(config, generator), MaskedQuery(config.include_question)),
    "marker": _marker,
    "masked": lambda config, generator: MaskedQuery(config.include_question),
    "rewrite": lambda config, generator: RewriteQuery(generator, max_words=config.max_words),
    "keywords": lambda config, generator: KeywordsQuery(config.include_question, config.max_words),
    "attention": lambda config, generator: AttentionQuery(
        config.include_question, MaskedQuery(config.include_question)
    ),
    "multi": lambda config, generator: MultiQuery(
        generator, config.max_subqueries, config.max_words, MaskedQuery(config.include_question)
    ),
}


def build_query_builder(config: QueryConfig, generator: Generator | None = None) -> QueryBuilder:
    """The builder for `config.mode`, made by its factory from the config and the generator.

    Register your own: `QUERY_BUILDERS["mine"] = lambda config, generator: MyBuilder()`.
    """
    return QUERY_BUILDERS[check_query_mode(config.mode)](config, generator)


def check_query_mode(mode: str) -> str:
    """`mode` if `QUERY_BUILDERS` holds it; else an InputError naming the known modes."""
    if mode not in QUERY_BUILDERS:
        raise InputError(f"unknown query mode {mode!r}; known: {', '.join(QUERY_BUILDERS)}")
    return mode
