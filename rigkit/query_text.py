"""Query text: follow-up questions made standalone, chatty model rewrites cleaned down to a
search query, and a model's list of sub-queries parsed. Plain text in, plain text out: the
builders in `rigkit.queries` call these."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rigkit.config import QueryConfig
from rigkit.markers import SUBQUERY_SEPARATOR, split_subqueries, strip_markers
from rigkit.text import (
    count_query_units,
    first_sentence,
    has_content,
    key_terms,
    mentions,
    question_entities,
    split_words,
    word_units,
)
from rigkit.trace import Query

__all__ = ["clean_rewrite", "distinct_queries", "parse_subqueries", "resolve_query", "standalone_question",
           "truncate_query"]


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
    return distinct_queries([q for q in cleaned if has_content(q)], limit)


def distinct_queries(queries: list[str], limit: int) -> list[str]:
    """The first `limit` queries that differ in more than case, spacing and punctuation."""
    kept: dict[str, str] = {}
    for query in queries:
        key = " ".join(w.text.lower() for w in split_words(query))
        if key and key not in kept:
            kept[key] = query
    return list(kept.values())[:limit]
