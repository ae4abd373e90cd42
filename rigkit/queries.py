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

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rigkit.config import QueryConfig
from rigkit.errors import InputError
from rigkit.generation.protocol import Generator
from rigkit.markers import SUBQUERY_SEPARATOR, marker_spec, split_subqueries, strip_markers
from rigkit.text import (
    count_query_units,
    fact_words,
    first_sentence,
    has_cjk,
    has_content,
    is_stop,
    key_terms,
    mentions,
    question_entities,
    split_words,
    word_units,
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


# Words that point back to an earlier turn's subject; possessives take the subject's "'s" / "的".
# ("this", "that" and 这 / 该 are left alone: they open clauses and name things too often.)
_POINTING = {"it": "", "they": "", "them": "", "he": "", "him": "", "she": "", "its": "'s", "their": "'s",
             "theirs": "'s", "his": "'s", "her": "'s", "它": "", "它们": "", "他": "", "她": "", "他们": "",
             "她们": "", "其": "的"}


def standalone_question(question: str, history: Sequence[tuple[str, str]]) -> str:
    """`question` with the words that point to an earlier turn's subject replaced by it.

    A follow-up such as "and what about its NOTICE file?" after "What does Apache-2.0 require?"
    becomes "and what about Apache-2.0's NOTICE file?" (那它的NOTICE文件呢？ -> 那Apache-2.0的NOTICE文件呢？),
    so no query searches for "its". The subject is the first entity (else name or code) of the most
    recent earlier question that has one; without history or a pointing word, `question` is kept.
    """
    pointing = [w for w in split_words(question) if w.text.lower() in _POINTING]
    subject = next((terms[0] for q, _ in reversed(history) if (terms := _subjects(q))), "")
    if not pointing or not subject or mentions(question, subject):
        return question
    out, at = [], 0
    for word in pointing:
        out += [question[at:word.start], subject + _POINTING[word.text.lower()]]
        at = word.end
    return "".join(out) + question[at:]


def resolve_query(query: Query, question: str, history: Sequence[tuple[str, str]]) -> Query:
    """`query` with its searches' pointing words named (`standalone_question`), in a conversation:
    each search is read against the history and the (standalone) `question`. Without history the
    query is kept as built."""
    if not history:
        return query
    turns = [*history, (question, "")]
    searches = [standalone_question(text, turns) for text in query.subqueries]
    text = f" {SUBQUERY_SEPARATOR} ".join(searches) if searches else standalone_question(query.text, turns)
    return dataclasses.replace(query, text=text, subqueries=searches)


def _subjects(question: str) -> list[str]:
    """What a question is about, likeliest first: its entities, else its names and codes (none: a
    question such as "Who designed it?" names nothing, and an earlier one is looked at)."""
    named = [t for t in key_terms(question) if any(c.isupper() or c.isdigit() for c in t)]
    return question_entities(question) or named


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


_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•>]|\d+[.)、])\s+")
_LEAD_IN = re.compile(
    r"^(?:sure|okay|ok|certainly|of course|absolutely|great|alright|好的|当然)(?:\s*thing)?"
    r"[\s!,.，。！]*",
    re.IGNORECASE,
)
_LABEL = re.compile(r"^(?P<label>[^:：]{0,60})[:：]\s*(?P<rest>.*)$")
_LABEL_WORDS = re.compile(r"query|search|keyword|here|查询|搜索|关键词|检索", re.IGNORECASE)
_HERE_IS = re.compile(r"^here(?:'s|’s| is| are)\b", re.IGNORECASE)
_EXPLANATION = re.compile(
    r"\s*(?:\((?:this|which|it|that|to|for|note)\b|\s[-—–]\s+(?:this|which|it|that|to|for)\b).*$",
    re.IGNORECASE | re.DOTALL,
)
_QUOTES = "\"“”«»「」『』`*"


def clean_rewrite(text: str, max_words: int = QueryConfig.max_words) -> str:
    """The search query in a chatty model reply: first useful line, no preamble, quotes,
    markdown or trailing explanation, at most `max_words` words / CJK characters."""
    text = _THINK.sub("", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    query = ""
    for line in lines:
        line = _BULLET.sub("", line).replace("**", "").strip()
        line = _LEAD_IN.sub("", line)
        label = _LABEL.match(line)
        if label and _LABEL_WORDS.search(label["label"]):
            line = label["rest"]
        if _HERE_IS.match(line) or not line.strip(_QUOTES + " '.,:;!?"):
            continue  # a preamble ("Here is a search query for you.") or nothing left
        query = line
        break
    query = strip_markers(query)
    # the first sentence only ("date. This query..."), but "U.S. law" is not a sentence end
    query = first_sentence(_EXPLANATION.sub("", query), capital_ends=False)
    query = query.translate({ord(c): " " for c in _QUOTES})
    query = query.strip(" '‘’.,;:!?。，；：！？")
    query = re.sub(r"\s+", " ", query)
    return truncate_query(query, max_words)


def truncate_query(text: str, max_words: int = QueryConfig.max_words) -> str:
    """`text` cut after `max_words` units, a unit being a word or one CJK character."""
    if count_query_units(text) <= max_words:
        return text
    units = word_units(text)
    return text[: units[max_words - 1].end()].strip() if max_words > 0 else ""


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
            searches = _distinct([q for p in phrases for q in split_subqueries(p)], self.max_subqueries)
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


# small models echo the prompt's own fields ("Question: ...", "Reply: ...") instead of answering
_ECHO = re.compile(r"^\s*(?:question|answer so far|missing|reply|问题|当前回答|缺少)\s*[:：]", re.IGNORECASE)


def parse_subqueries(reply: str, limit: int, max_words: int = QueryConfig.max_words) -> list[str]:
    """Up to `limit` distinct search queries in a model reply: one per line (or per `##`), each
    cleaned like a rewrite. When the reply holds a numbered or bulleted list, only its items
    count, so a closing remark ("These queries will help...") is not searched; echoed prompt
    lines ("Question: ...") are not queries."""
    lines = [ln for ln in _THINK.sub("", reply).splitlines() if ln.strip() and not _ECHO.match(ln)]
    listed = [ln for ln in lines if _BULLET.match(ln)]
    cleaned = [clean_rewrite(part, max_words) for ln in listed or lines for part in split_subqueries(ln)]
    return _distinct([q for q in cleaned if has_content(q)], limit)


def _distinct(queries: list[str], limit: int) -> list[str]:
    """The first `limit` queries that differ in more than case, spacing and punctuation."""
    kept: dict[str, str] = {}
    for query in queries:
        key = " ".join(w.text.lower() for w in split_words(query))
        if key and key not in kept:
            kept[key] = query
    return list(kept.values())[:limit]


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
