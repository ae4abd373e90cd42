"""Oracle ceilings: what this generator reaches with perfect decisions and queries, or perfect passages.

- `rig:oracle`: the RIG loop with an oracle decider and an oracle query. After each segment it
  retrieves exactly when the next hop's gold paragraph is missing from the context, and searches
  the gold sub-question of that hop (`rigkit.eval.gold`: MuSiQue's decomposition, 2Wiki's
  evidences). Each hop is asked for once: if its search misses the paragraph, the next hop comes
  next, as a perfect decider could not do better with this retriever. The segment that fired is
  written again with the passages (policy "regenerate"), and the oracle may retrieve once per hop
  (`max_rounds` is raised to the longest chain, never lowered).
- `rag:gold`: the gold paragraphs (`gold_hits`), in hop order, put before the question; nothing
  retrieved (answered by `rigkit.eval.systems.answer_with_gold`).

Controls, to split `rig:oracle`'s gap to `rag:gold` into generator, layout and loop rule:
- `rig:oracle@prefix`: the same loop with its passages before the question, where `rag:gold` has them;
- `rig:oracle~norestore`: the same loop with `controller.restore` off, so an empty rewrite after the
  passages ends the answer instead of keeping the sentence written before them;
- `rag:gold+distractors`: `rag:gold` with the distractors `rig:oracle`'s searches bring
  (`gold_with_distractors`): each hop's search with its gold sub-question, its hits in rank order,
  the hop's gold paragraph first in that block, then its other hits; so the context holds as many
  distractors as `rig:oracle`'s would when every hop is asked for, in the same order.

The gold data reaches these systems only through their construction (`gold`: question text ->
`GoldChain`); the controller, deciders and query builders of every other system never see it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rigkit.config import RunConfig
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.eval.gold import GoldChain, pid_of
from rigkit.trace import Decision, Hit, Query, Segment

__all__ = ["OracleDecider", "OracleQuery", "chain_for", "gold_hits", "gold_with_distractors", "oracle_controller",
           "by_question"]


def by_question(chains: Mapping[str, GoldChain]) -> dict[str, GoldChain]:
    """Question text -> chain (the systems are asked by text)."""
    return {chain.question: chain for chain in chains.values()}


def chain_for(gold: Mapping[str, GoldChain], question: str) -> GoldChain:
    """The gold chain of `question`; a question outside the QA file is a clear error."""
    chain = gold.get(question)
    if chain is None:
        raise InputError(f"no gold chain for the question {question[:80]!r}: oracle systems answer "
                         "only questions of the QA file they were built from")
    return chain


class OracleDecider:
    """Fire while a hop's gold paragraph is missing from context and has not been asked for."""

    name = "oracle"
    policy = "regenerate"  # the segment written without the hop is only a draft

    def __init__(self, gold: Mapping[str, GoldChain]):
        self.gold = gold
        self._asked: set[int] = set()

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        if state.round_index == 0:  # a new question: nothing asked yet
            self._asked = set()
        chain = chain_for(self.gold, state.question)
        in_context = {pid_of(h.chunk_id) for h in state.passages} | {h.doc_id for h in state.passages}
        for i, hop in enumerate(chain.hops):
            if i in self._asked or (hop.pid is not None and hop.pid in in_context):
                continue
            self._asked.add(i)
            return Decision(True, 1.0, f"hop {i + 1} ({hop.title}) is not in context", decider=self.name,
                            evidence={"hop": i + 1, "query": hop.query, "pid": hop.pid})
        return Decision(False, 0.0, "every hop is in context or was asked for", decider=self.name)


class OracleQuery:
    """The gold sub-question the oracle decider put in its decision."""

    mode = "oracle"

    def build(self, question: str, draft: str, decision: Decision,
              state: DecisionState | None = None) -> Query:
        text = decision.evidence.get("query")
        if not text:
            raise InputError("the oracle query needs the oracle decider's gold sub-question")
        return Query(text=str(text), mode=self.mode, intent=f"hop {decision.evidence.get('hop')}")


def gold_hits(chain: GoldChain) -> list[Hit]:
    """The supporting paragraphs as hits, in hop order (chunk ids as the corpus index names them)."""
    return [Hit(chunk_id=f"{p['pid']}#0", doc_id=str(p["pid"]), title=str(p.get("title", "")),
                text=str(p.get("text", "")), score=1.0, metadata={"pid": str(p["pid"]), "gold": True})
            for p in chain.paragraphs]


def gold_with_distractors(chain: GoldChain, retriever: Any, top_k: int) -> list[Hit]:
    """The gold paragraphs among the hits `rig:oracle`'s searches bring (see the module's text)."""
    gold = {str(p["pid"]): hit for p, hit in zip(chain.paragraphs, gold_hits(chain))}
    out: list[Hit] = []
    seen: set[str] = set()

    def add(hit: Hit) -> None:
        if pid_of(hit.chunk_id) not in seen:
            seen.add(pid_of(hit.chunk_id))
            out.append(hit)

    for hop in chain.hops:
        if hop.pid is not None and hop.pid in seen:  # in context already: the oracle would not search
            continue
        hits = list(retriever.search(hop.query, top_k))
        if hop.pid in gold:
            add(gold[hop.pid])
        for hit in hits:
            add(hit)
    for hit in gold.values():  # a paragraph no hop names still belongs to the gold set
        add(hit)
    return out


def oracle_controller(config: RunConfig, generator: Any, retriever: Any, gold: Mapping[str, GoldChain]):
    """A RIG controller whose decider and query builder read the gold chains."""
    from rigkit.build import assemble

    longest = max((len(c.hops) for c in gold.values()), default=1)
    rounds = max(config.controller.max_rounds, longest)
    config = dataclasses.replace(config, controller=dataclasses.replace(config.controller, max_rounds=rounds,
                                                                        policy="auto"))
    return assemble(config, generator, retriever, OracleDecider(gold), query_builder=OracleQuery())

