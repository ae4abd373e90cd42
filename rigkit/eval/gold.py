"""The gold reasoning chain of a question: its hops, in order, each with its paragraph and query.

MuSiQue gives the hops directly: `question_decomposition` lists the sub-questions in order, each
with the index of the paragraph that answers it and its answer; a later sub-question names an
earlier answer as `#k`. A sub-question is either a question or `entity >> relation`; the query is
the sub-question with every `#k` replaced by the k-th answer and `>>` dropped
("Mountrail County capital"). 2WikiMultihopQA gives `supporting_facts` (titles, in chain order)
and `evidences` (subject, relation, object triples): one hop per supporting title, in that order,
queried with the title and the relations its triples ask for ("Forbidden Ground director").

Only the evaluation reads these: the oracle systems get them through their construction, and the
per-hop tables match them against the retrievals an answer recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigkit.errors import InputError

__all__ = ["GoldHop", "GoldChain", "gold_chain", "load_gold", "pid_of"]

_REF = re.compile(r"#(\d+)")


@dataclass(frozen=True)
class GoldHop:
    """One step of the chain: the paragraph that holds it, the query that asks for it, its answer."""

    pid: str | None  # None when the data names no paragraph for this step
    title: str
    query: str
    answer: str = ""


@dataclass
class GoldChain:
    """A question's hops in order and its supporting paragraphs (for `rag:gold`)."""

    id: str
    question: str
    type: str
    hops: list[GoldHop]
    paragraphs: list[dict[str, Any]] = field(default_factory=list)  # supporting, in hop order

    @property
    def facts(self) -> list[str]:
        """The answers written along the chain (bridge entities and the final answer)."""
        return [h.answer for h in self.hops if h.answer]


def pid_of(chunk_id: str) -> str:
    """The paragraph a chunk comes from: `musique-ab12#0` -> `musique-ab12`."""
    return str(chunk_id).split("#", 1)[0]


def gold_chain(record: dict[str, Any]) -> GoldChain:
    """The hops of one qa.jsonl record (MuSiQue decomposition, 2Wiki supporting facts)."""
    paragraphs = list(record.get("paragraphs") or [])
    if record.get("question_decomposition"):
        hops = _musique_hops(record["question_decomposition"], paragraphs)
    elif record.get("supporting_facts"):
        hops = _wiki_hops(record["supporting_facts"], record.get("evidences") or [], paragraphs)
    else:  # a set without a chain: one hop per supporting paragraph, queried with the question
        hops = [GoldHop(p.get("pid"), p.get("title", ""), str(record.get("question", "")))
                for p in paragraphs if p.get("is_supporting")]
    by_pid = {p.get("pid"): p for p in paragraphs}
    ordered = [by_pid[h.pid] for h in hops if h.pid in by_pid]
    ordered += [p for p in paragraphs if p.get("is_supporting") and p not in ordered]
    return GoldChain(str(record.get("id")), str(record.get("question", "")), str(record.get("type") or ""),
                     hops, ordered)


def _musique_hops(steps: list[dict[str, Any]], paragraphs: list[dict[str, Any]]) -> list[GoldHop]:
    answers = [str(s.get("answer", "")) for s in steps]
    hops = []
    for step in steps:
        text = _REF.sub(lambda m: _answer(answers, int(m.group(1))), str(step.get("question", "")))
        query = " ".join(part.strip() for part in text.split(">>") if part.strip())
        idx = step.get("paragraph_support_idx")
        para = paragraphs[idx] if isinstance(idx, int) and 0 <= idx < len(paragraphs) else {}
        hops.append(GoldHop(para.get("pid"), para.get("title", ""), query, str(step.get("answer", ""))))
    return hops


def _answer(answers: list[str], k: int) -> str:
    return answers[k - 1] if 1 <= k <= len(answers) else f"#{k}"


def _wiki_hops(facts: list[Any], evidences: list[Any], paragraphs: list[dict[str, Any]]) -> list[GoldHop]:
    titles = list(dict.fromkeys(str(f[0]) for f in facts if f))
    by_title = {p.get("title"): p.get("pid") for p in paragraphs if p.get("is_supporting")}
    hops = []
    triples_all = [e for e in evidences if len(e) == 3]
    for i, title in enumerate(titles):
        triples = _triples_of(title, i, triples_all, len(titles))
        relations = list(dict.fromkeys(str(e[1]) for e in triples))
        query = " ".join([title, *relations])
        answer = str(triples[-1][2]) if triples else ""
        hops.append(GoldHop(by_title.get(title), title, query, answer))
    return hops


def _triples_of(title: str, i: int, triples: list[Any], n_titles: int) -> list[Any]:
    """The triples about `title`: same subject, else a subject the title starts with
    ("The Zone" for "The Zone (2017 film)"), else the i-th triple when there is one per title."""
    low = title.lower()
    same = [e for e in triples if str(e[0]).lower() == low]
    if same:
        return same
    prefix = [e for e in triples if low.startswith(str(e[0]).lower())]
    if prefix:
        return prefix
    return [triples[i]] if len(triples) == n_titles else []


def load_gold(qa: str | Path) -> dict[str, GoldChain]:
    """Question id -> its chain, for every question of a qa.jsonl."""
    from rigkit.datasets import load_qa

    path = Path(qa)
    if not path.exists():
        raise InputError(f"QA file not found: {path}")
    return {chain.id: chain for chain in map(gold_chain, load_qa(path))}
