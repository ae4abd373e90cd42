"""Budgets that are the same for every system: passage budget, per-passage cap, context limit.

The scripted generator counts whitespace-separated words as tokens, so sizes here are word counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rigkit.config import (
    ContextConfig,
    ControllerConfig,
    GeneratorConfig,
    QueryConfig,
    RunConfig,
    load_config,
)
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.errors import InputError
from rigkit.eval.systems import answer_with_passages, build_system, parse_system
from rigkit.queries import build_query_builder
from rigkit.testing import AlwaysDecider, DictRetriever, NeverDecider, ScriptedGenerator
from rigkit.trace import Hit, RIGResult

ROOT = Path(__file__).resolve().parents[1]


def hit(cid: str, words: int, title: str = "Doc") -> Hit:
    text = " ".join(f"{cid.split('#')[0]}{i}" for i in range(words))  # distinct words: no near-duplicates
    return Hit(chunk_id=cid, doc_id=cid.split("#")[0], title=title, text=text, score=1.0)


def context(gen: ScriptedGenerator, limit: int = 8192, **config) -> ContextManager:
    return ContextManager(ContextConfig(**{"layout": "append", **config}), gen.count_tokens, gen.render_chat, context_limit=limit)


FIVE = [hit(f"p{i}#0", 30) for i in range(5)]


# -- plain RAG obeys the passage budget --------------------------------------------------------
def test_upfront_passages_keep_the_best_ranked_within_max_retrieval_tokens():
    ctx = context(ScriptedGenerator([]), max_retrieval_tokens=100)
    ctx.start("Which one?", passages=FIVE)
    assert [h.chunk_id for h in ctx.passages] == ["p0#0", "p1#0"]  # rank order, cut from the end
    assert ctx.upfront.added == ["p0#0", "p1#0"]
    assert ctx.upfront.dropped_budget == ["p2#0", "p3#0", "p4#0"]
    assert 0 < ctx.budget().passages <= 100
    assert ctx.upfront.tokens_added == ctx.budget().passages
    assert {h.chunk_id for h in ctx.seen_passages} == {"p0#0", "p1#0"}  # dropped ones are not citable


def _systems_config(max_retrieval_tokens: int) -> RunConfig:
    return RunConfig().override(
        context={"max_retrieval_tokens": max_retrieval_tokens},
        retrieval={"top_k": 5},
        generator={"max_answer_tokens": 200},
        controller={"max_rounds": 3},
    )


def test_rag_and_rig_are_budget_matched():
    config = _systems_config(150)
    retriever = DictRetriever({}, default=FIVE)
    rag = build_system(parse_system("rag:5"), config, ScriptedGenerator(["A.", "B."]), retriever)
    rig = build_system(parse_system("rig:always"), config, ScriptedGenerator(["A.", "B.", "C.", "D."]), retriever)
    rag_result, rig_result = rag.answer("Which one?", 0), rig.answer("Which one?", 0)
    for result in (rag_result, rig_result):
        assert max(r.budget.passages for r in result.rounds) <= 150, result.rounds[0].budget
        assert all(r.budget.max_retrieval_tokens == 150 for r in result.rounds)
    assert rag_result.upfront is not None and rag_result.upfront.dropped_budget  # 5 x 30 words do not fit
    assert len(rag_result.passages) < 5


def test_titles_ids_and_headers_count_as_passage_tokens_not_system():
    gen = ScriptedGenerator([])
    bare = context(gen)
    bare.start("Which one?")
    with_passages = context(gen)
    long_title = " ".join(["Title"] * 40)
    with_passages.start("Which one?", passages=[hit("p0#0", 10, title=long_title)])
    b0, b1 = bare.budget(), with_passages.budget()
    assert b1.system == b0.system  # the passages' message is not "system"
    assert b1.passages >= 10 + 40  # its text and its title at least
    total = sum(gen.count_tokens(p.text) for p in with_passages.pieces())
    assert b1.used == total  # the parts add up to the prompt


def test_injected_block_header_counts_as_passages():
    gen = ScriptedGenerator([])
    ctx = context(gen)
    ctx.start("Which one?")
    system_before = ctx.budget().system
    injection = ctx.inject([hit("p0#0", 10)])
    b = ctx.budget()
    assert b.system == system_before
    block = [p for p in ctx.pieces() if p.role == "passages"][0]
    assert b.passages == gen.count_tokens(block.text) == injection.tokens_added


# -- a cut passage is recorded ------------------------------------------------------------------
def test_a_passage_cut_to_the_cap_is_recorded_in_the_injection():
    ctx = context(ScriptedGenerator([]), max_passage_tokens=12)
    ctx.start("Which one?")
    injection = ctx.inject([hit("long#0", 40), hit("short#0", 5)])
    assert injection.truncated == ["long#0"]
    cut = next(h for h in ctx.passages if h.chunk_id == "long#0")
    assert cut.metadata["truncated"] and cut.metadata["original_tokens"] == 40
    assert len(cut.text.split()) <= 13  # 12 words and the ellipsis


def test_a_cut_upfront_passage_is_recorded_in_the_result():
    config = RunConfig().override(context={"max_passage_tokens": 12})
    result = answer_with_passages(ScriptedGenerator(["A."]), "Which one?", [hit("long#0", 40)], config)
    assert result.upfront is not None and result.upfront.truncated == ["long#0"]
    again = RIGResult.from_json(result.to_json())
    assert again.upfront == result.upfront


def test_old_traces_without_the_new_fields_still_load():
    result = answer_with_passages(ScriptedGenerator(["A."]), "Which one?", [hit("p#0", 5)])
    data = result.to_dict()
    data.pop("upfront")
    for r in data["rounds"]:
        if r["injection"]:
            r["injection"].pop("truncated")
    assert RIGResult.from_dict(data).upfront is None


def test_cpu_profile_does_not_cut_a_chunk_of_the_default_embedder():
    from rigkit.retrieval.index import resolve_chunk_size

    config = load_config(ROOT / "configs" / "cpu.yaml")
    chunk = resolve_chunk_size(config.retrieval.embedding_model, config.retrieval.chunk_size)
    assert config.context.max_passage_tokens >= chunk
    assert config.context.max_retrieval_tokens >= config.retrieval.top_k * config.context.max_passage_tokens


@pytest.mark.slow
def test_cpu_profile_cuts_no_shipped_2wiki_or_demo_chunk():
    """Counted in the generator's tokens: the cap is applied with the generator's tokenizer."""
    from rigkit.corpus import chunk_documents
    from rigkit.embeddings import load_tokenizer
    from rigkit.generation.loading import default_tokenizer
    from rigkit.readers import load_documents
    from rigkit.retrieval.index import resolve_chunk_size

    config = load_config(ROOT / "configs" / "cpu.yaml")
    embedder_tokens = load_tokenizer(config.retrieval.embedding_model)
    size = resolve_chunk_size(config.retrieval.embedding_model, config.retrieval.chunk_size)
    generator_tokens = default_tokenizer()
    for corpus in ("data/demo/corpus.jsonl", "data/2wikimultihopqa/corpus.jsonl"):
        chunks = chunk_documents(load_documents(ROOT / corpus), embedder_tokens, size)
        longest = max(len(generator_tokens(c.text, add_special_tokens=False)["input_ids"]) for c in chunks)
        assert longest <= config.context.max_passage_tokens, corpus


# -- the model's context limit is enforced ------------------------------------------------------
class NextTwo:
    """Two new passages per search."""

    def __init__(self):
        self.left = list(FIVE)

    def search(self, query, top_k):
        found, self.left = self.left[:2], self.left[2:]
        return found


def _rig(gen, limit, **ctx):
    context_manager = context(gen, limit=limit, **ctx)
    return RIGController(
        gen, NextTwo(), AlwaysDecider(),
        build_query_builder(QueryConfig(mode="masked"), gen), context_manager,
        config=ControllerConfig(max_rounds=3, policy="continue"),
        generation=GeneratorConfig(max_segment_tokens=20, max_answer_tokens=60),
    )


def test_rig_evicts_passages_to_keep_the_next_segment_within_the_context():
    gen = ScriptedGenerator(["First sentence here.", "Second sentence here.", "Third one.", "Done."])
    limit = 200  # one block of two passages and a segment fit; two blocks do not
    result = _rig(gen, limit).run("Which one?")
    evicted = [c for r in result.rounds if r.injection for c in r.injection.evicted]
    assert evicted, [r.budget for r in result.rounds]
    for prompt in gen.prompts:  # every prompt left room for a full segment
        assert sum(gen.count_tokens(p.text) for p in prompt) + 20 <= limit


def test_plain_rag_that_cannot_fit_the_context_is_refused():
    gen = ScriptedGenerator(["A."])
    ctx = context(gen, limit=60, max_retrieval_tokens=1000)
    c = RIGController(gen, DictRetriever({}), NeverDecider(), build_query_builder(QueryConfig(), gen), ctx,
                      generation=GeneratorConfig(max_segment_tokens=20, max_answer_tokens=20))
    with pytest.raises(InputError, match="does not fit the model"):
        c.run("Which one?", passages=FIVE[:2])
    assert gen.prompts == []  # refused before generating anything


def test_round_stepper_shows_a_cut_passage():
    from rigkit.widgets import RoundStepper

    gen = ScriptedGenerator(["First sentence here.", "Done."])
    c = RIGController(
        gen, DictRetriever({}, default=[hit("long#0", 40)]), AlwaysDecider(),
        build_query_builder(QueryConfig(mode="masked"), gen), context(gen, max_passage_tokens=12),
        config=ControllerConfig(max_rounds=1, policy="continue"),
        generation=GeneratorConfig(max_segment_tokens=20, max_answer_tokens=60),
    )
    result = c.run("Which one?")
    assert result.rounds[0].injection.truncated == ["long#0"]
    stepper = RoundStepper(result)
    assert "rig-truncated" in stepper.hits_pane.value and "long#0" in stepper.hits_pane.value
