"""Fitting passages and history by relevance: order, share budget, score allocation, compression,
history summary; their records in the trace and the widgets.

The scripted generator counts whitespace-separated words as tokens, so sizes here are word counts;
the embedder double embeds a text as its bag of words, so "similar" means "shares words".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rigkit.build import build_run
from rigkit.compression import (
    SUMMARY_REQUEST,
    AbstractiveCompressor,
    ExtractiveCompressor,
    HistorySummarizer,
    compressed_hit,
    key_points,
    ordered,
)
from rigkit.config import ConfigError, ContextConfig, RunConfig
from rigkit.context import ContextManager
from rigkit.testing import AlwaysDecider, DictRetriever, NeverDecider, ScriptedGenerator
from rigkit.trace import Hit, RIGResult
from rigkit.widgets import render

ROOT = Path(__file__).resolve().parents[1]


class WordEmbedder:
    """A text's vector is its bag of lowercase words, hashed into 256 dimensions, normalised."""

    def __init__(self):
        self.calls = 0

    def __call__(self, sentences):
        self.calls += 1
        out = np.zeros((len(sentences), 256), dtype=np.float32)
        for row, text in enumerate(sentences):
            for word in text.lower().replace(".", " ").split():
                out[row, sum(map(ord, word)) % 256] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


class CountingCompressor:
    """Halves a passage (its first words) and counts its calls."""

    mode = "extractive"

    def __init__(self):
        self.calls: list[str] = []

    def compress(self, focus, hit, max_tokens):
        self.calls.append(hit.chunk_id)
        return " ".join(hit.text.split()[:max_tokens])


def hit(cid: str, words: int, score: float = 1.0) -> Hit:
    text = " ".join(f"{cid.split('#')[0]}w{i}" for i in range(words))  # distinct: no near-duplicates
    return Hit(chunk_id=cid, doc_id=cid.split("#")[0], title="Doc", text=text, score=score)


def context(gen=None, limit: int = 8192, compressor=None, summarizer=None, **config) -> ContextManager:
    gen = gen or ScriptedGenerator([])
    return ContextManager(ContextConfig(**{"layout": "append", **config}), gen.count_tokens, gen.render_chat, context_limit=limit,
                          compressor=compressor, summarizer=summarizer)


def reading_order(ctx: ContextManager, ids: list[str]) -> list[str]:
    text = "".join(p.text for p in ctx.pieces())
    return sorted(ids, key=text.index)


# -- ordering ---------------------------------------------------------------------------------------
SCORED = [hit(f"p{i}#0", 5, score) for i, score in enumerate([0.3, 0.9, 0.1, 0.7, 0.5])]


def test_orders_arrival_relevance_and_edges():
    ids = lambda hits: [h.chunk_id for h in hits]  # noqa: E731
    assert ids(ordered(SCORED, "arrival")) == ["p0#0", "p1#0", "p2#0", "p3#0", "p4#0"]
    assert ids(ordered(SCORED, "relevance")) == ["p1#0", "p3#0", "p4#0", "p0#0", "p2#0"]
    # best first, second best last, the weakest in the middle
    assert ids(ordered(SCORED, "edges")) == ["p1#0", "p4#0", "p2#0", "p0#0", "p3#0"]


@pytest.mark.parametrize("order", ["arrival", "relevance", "edges"])
def test_order_sets_how_the_model_reads_up_front_and_injected_passages(order):
    ctx = context(order=order)
    ctx.start("Which one?", passages=SCORED)
    expected = [h.chunk_id for h in ordered(SCORED, order)]
    assert reading_order(ctx, expected) == expected
    assert [h.chunk_id for h in ctx.passages] == [h.chunk_id for h in SCORED]  # the record keeps arrival
    block = [hit(f"q{i}#0", 5, s) for i, s in enumerate([0.2, 0.8, 0.5])]
    before = ctx.pieces()
    ctx.inject(block)
    after = ctx.pieces()
    assert [p.text for p in after[: len(before)]] == [p.text for p in before]  # still append-only
    expected = [h.chunk_id for h in ordered(block, order)]
    assert reading_order(ctx, expected) == expected


def test_default_order_is_todays():
    assert ContextConfig().order == "arrival" and ContextConfig().compress == "none"
    assert ContextConfig().allocate == "rank" and ContextConfig().passage_share is None


# -- budget by share and score ---------------------------------------------------------------------
def test_passage_share_bounds_the_passages_by_the_window_and_the_smaller_budget_wins():
    ctx = context(limit=1000, passage_share=0.1)  # 100 tokens < max_retrieval_tokens 4096
    assert ctx.passage_budget == 100
    ctx.start("Which one?", passages=[hit(f"p{i}#0", 30) for i in range(5)])
    assert 0 < ctx.budget().passages <= 100 and ctx.budget().max_retrieval_tokens == 100
    assert ctx.upfront.passage_budget == 100 and ctx.upfront.dropped_budget
    assert context(limit=1000, passage_share=0.8, max_retrieval_tokens=300).passage_budget == 300
    assert context(limit=1000).passage_budget == 4096  # null: max_retrieval_tokens alone


def test_score_allocation_drops_the_lowest_scored_up_front_passage_first():
    passages = [hit("a#0", 30, 0.2), hit("b#0", 30, 0.9), hit("c#0", 30, 0.5)]
    by_rank = context(max_retrieval_tokens=80)
    by_rank.start("Which one?", passages=passages)
    assert by_rank.upfront.dropped_budget == ["b#0", "c#0"]  # today: cut from the end
    by_score = context(max_retrieval_tokens=80, allocate="score")
    by_score.start("Which one?", passages=passages)
    assert by_score.upfront.added == ["b#0"] and set(by_score.upfront.dropped_budget) == {"a#0", "c#0"}


def test_score_allocation_keeps_a_high_scored_old_passage_over_a_weak_new_one():
    ctx = context(max_retrieval_tokens=150, allocate="score")  # room for two of the three
    ctx.start("Which one?")
    ctx.inject([hit("old#0", 30, 0.9)])
    injection = ctx.inject([hit("new#0", 30, 0.8), hit("weak#0", 30, 0.1)])
    assert injection.dropped_budget == ["weak#0"] and not injection.evicted
    assert [h.chunk_id for h in ctx.passages] == ["old#0", "new#0"]
    rank = context(max_retrieval_tokens=150)  # today: the old passage is evicted first
    rank.start("Which one?")
    rank.inject([hit("old#0", 30, 0.9)])
    assert rank.inject([hit("new#0", 30, 0.8), hit("weak#0", 30, 0.1)]).evicted == ["old#0"]


def test_compression_keeps_passages_a_budget_would_drop_and_truncates_nothing():
    passages = [hit("a#0", 60, 0.9), hit("b#0", 60, 0.5)]
    plain = context(max_retrieval_tokens=100, allocate="score")
    plain.start("Which one?", passages=passages)
    assert plain.upfront.dropped_budget == ["b#0"]
    squeezed = context(max_retrieval_tokens=100, allocate="score", compress="extractive",
                       compressor=CountingCompressor())
    squeezed.start("Which one?", passages=passages)
    assert squeezed.upfront.added == ["a#0", "b#0"] and not squeezed.upfront.truncated
    assert squeezed.upfront.compressed["b#0"]["before"] == 60
    assert squeezed.upfront.compressed["b#0"]["after"] == 30  # compress_ratio 0.5


# -- compression -----------------------------------------------------------------------------------
PASSAGE = Hit(
    "mit#0", "mit", "The MIT License",
    "The MIT License is short. Its one condition is that the copyright notice is kept in all copies. "
    "It was written at a university in Massachusetts. Lawyers disagree about patents.",
    0.9,
)


def test_extractive_keeps_the_sentences_nearest_the_query_in_passage_order():
    gen = ScriptedGenerator([])
    embedder = WordEmbedder()
    compressor = ExtractiveCompressor(embedder, gen.count_tokens)
    kept = compressor.compress("What condition does the MIT License set on copies?", PASSAGE, max_tokens=22)
    assert kept == ("The MIT License is short. Its one condition is that the copyright notice is kept "
                    "in all copies.")
    assert embedder.calls == 1  # the query and every sentence in one batch
    assert gen.count_tokens(kept) <= 22
    assert compressor.compress("x", Hit("one#0", "one", "T", "A single sentence.", 1.0), 5) == "A single sentence."


def test_compression_is_recorded_and_is_what_the_model_reads():
    gen = ScriptedGenerator([])
    ctx = context(gen, compress="extractive", compress_ratio=0.7,
                  compressor=ExtractiveCompressor(WordEmbedder(), gen.count_tokens))
    ctx.start("What condition does the MIT License set on copies?", passages=[PASSAGE])
    record = ctx.upfront.compressed["mit#0"]
    assert record["mode"] == "extractive" and record["after"] < record["before"] == gen.count_tokens(PASSAGE.text)
    assert "Massachusetts" not in record["text"] and "copyright notice" in record["text"]
    prompt = "".join(p.text for p in ctx.pieces())
    assert record["text"] in prompt and "Massachusetts" not in prompt
    assert ctx.passages[0].metadata == {"compressed": "extractive", "original_tokens": record["before"]}


def test_a_passage_is_compressed_once_even_when_it_comes_back():
    compressor = CountingCompressor()
    ctx = context(max_retrieval_tokens=70, compress="extractive", compressor=compressor)  # one at a time
    ctx.start("Which one?")
    first = ctx.inject([hit("a#0", 40)])
    text = ctx.passages[0].text
    ctx.inject([hit("b#0", 40)])  # evicts a#0
    assert [h.chunk_id for h in ctx.passages] == ["b#0"]
    again = ctx.inject([hit("a#0", 40)])
    assert compressor.calls == ["a#0", "b#0"]
    assert first.compressed["a#0"] == again.compressed["a#0"] and ctx.passages[-1].text == text


def test_key_points_are_at_most_five_of_at_most_150_characters():
    reply = "\n".join([
        "1. The MIT License is short.", "- It needs the notice kept.", "* " + "very long " * 30,
        "", "2) Fourth point.", "• Fifth point.", "6. Sixth point is one too many.", "- It needs the notice kept.",
    ])
    points = key_points(reply)
    assert len(points) == 5 and all(len(p) <= 150 for p in points)
    assert points[:2] == ["The MIT License is short.", "It needs the notice kept."]
    assert points[2].endswith("…") and points[3:] == ["Fourth point.", "Fifth point."]
    assert key_points("\n - \n") == []


def test_abstractive_asks_the_generator_for_key_points_en_and_zh():
    gen = ScriptedGenerator([], replies=["The MIT License is short.\n- The notice stays in copies.", "", "要点一"])
    compressor = AbstractiveCompressor(gen)
    text = compressor.compress("What does the MIT License ask?", PASSAGE, 50)
    assert text == "- The MIT License is short.\n- The notice stays in copies."
    assert "3 to 5 key points" in gen.helper_prompts[0] and "What does the MIT License ask?" in gen.helper_prompts[0]
    assert compressor.compress("q", PASSAGE, 50) == PASSAGE.text  # nothing usable: the passage stays whole
    compressor.compress("MIT 许可证要求什么？", PASSAGE, 50)
    assert "要点" in gen.helper_prompts[2]


def test_abstractive_compression_through_the_loop_is_recorded_per_round():
    gen = ScriptedGenerator(["The licence is short.", "It keeps the notice."],
                            replies=["The MIT License is short.\nThe notice is kept."])
    config = RunConfig().override(context={"compress": "abstractive"}, controller={"max_rounds": 1},
                                  retrieval={"top_k": 1})
    run = build_run(config, gen, DictRetriever({}, default=[PASSAGE]))
    assert isinstance(run.context.compressor, AbstractiveCompressor)
    controller = run.controller
    controller.decider = AlwaysDecider()
    result = controller.run("What does the MIT License ask?")
    injected = [r.injection for r in result.rounds if r.injection and r.injection.added]
    assert injected and injected[0].compressed["mit#0"]["text"] == "- The MIT License is short.\n- The notice is kept."
    assert result.passages[0].text == injected[0].compressed["mit#0"]["text"]
    loaded = RIGResult.from_json(result.to_json())
    assert loaded.rounds == result.rounds and loaded.to_dict() == result.to_dict()
    html = render.hits_html(result.rounds[0].hits, injected[0])
    assert "rig-compressed" in html and "→" in html and "The notice is kept." in html


# -- history ---------------------------------------------------------------------------------------
TURNS = [("Who wrote the MIT License?", "It came from MIT in the 1980s."),
         ("And the GPL?", "Richard Stallman wrote the GPL."),
         ("Which is shorter?", "The MIT License is shorter.")]


def test_history_beyond_the_budget_is_summarised_into_one_turn():
    gen = ScriptedGenerator([], replies=["We talked about who wrote the MIT License and the GPL."])
    ctx = context(gen, max_history_tokens=28, summarizer=HistorySummarizer(gen, max_new_tokens=20))
    ctx.start("Can I sell it?", history=TURNS)
    fit = ctx.history_fit
    assert fit is not None and fit.older_turns == 2 and fit.kept_turns == 1 and not fit.dropped
    assert ctx.history[0] == (SUMMARY_REQUEST["en"], fit.summary) and ctx.history[1:] == TURNS[2:]
    assert "Richard Stallman wrote the GPL." in gen.helper_prompts[0]
    assert fit.summary in ctx.pieces()[0].text and "It came from MIT" not in ctx.pieces()[0].text
    assert sum(gen.count_tokens(q + " " + a) for q, a in ctx.history) <= 28  # the summary turn fits too


def test_without_a_summarizer_history_is_dropped_as_today_and_recorded():
    ctx = context(max_history_tokens=12)
    ctx.start("Can I sell it?", history=TURNS)
    assert ctx.history == TURNS[2:]
    assert ctx.history_fit.dropped and ctx.history_fit.older_turns == 2 and not ctx.history_fit.summary
    fits = context()
    fits.start("Can I sell it?", history=TURNS)
    assert fits.history == TURNS and fits.history_fit is None


def test_the_summary_is_in_the_result_json_and_the_widgets():
    gen = ScriptedGenerator(["It is permissive."], replies=["Earlier: MIT and GPL authors."])
    config = RunConfig().override(context={"max_history_tokens": 12})
    run = build_run(config, gen, DictRetriever({}))
    assert isinstance(run.context.summarizer, HistorySummarizer)
    run.controller.decider = NeverDecider()
    result = run.controller.run("Can I sell it?", history=TURNS)
    assert result.history is not None and result.history.summary == "Earlier: MIT and GPL authors."
    loaded = RIGResult.from_json(result.to_json())
    assert loaded.history == result.history
    html = render.context_html(loaded)
    assert "rig-history-summary" in html and "Earlier: MIT and GPL authors." in html
    assert render.context_html(RIGResult.from_dict({**json.loads(result.to_json()), "history": None})) == ""


# -- configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, words", [
    ("order", "middle", "arrival, relevance, edges"), ("compress", "zip", "none, extractive, abstractive"),
    ("allocate", "luck", "rank, score"), ("passage_share", 1.5, "(0, 1]"),
])
def test_bad_options_are_one_clear_line(key, value, words):
    with pytest.raises(ConfigError, match=f"context.{key}") as err:
        context(**{key: value})
    assert words in str(err.value) and "\n" not in str(err.value)


# -- the real models -----------------------------------------------------------------------------------
def demo_passage(doc_id: str) -> Hit:
    for line in (ROOT / "data/demo/corpus.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        if row["id"] == doc_id:
            return Hit(f"{doc_id}#0", doc_id, row["title"], row["text"], 1.0)
    raise LookupError(doc_id)


@pytest.mark.slow
def test_extractive_with_the_real_embedder_on_a_demo_passage(default_generator):
    from rigkit.embeddings import load_embedder

    passage = demo_passage("demo-mit")
    from rigkit.retrieval.dense import embed_texts

    compressor = ExtractiveCompressor(lambda texts: embed_texts(load_embedder(), texts),
                                      default_generator.count_tokens)
    kept = compressor.compress("Does the MIT License give a patent licence?", passage, max_tokens=60)
    assert default_generator.count_tokens(kept) <= 60 < default_generator.count_tokens(passage.text)
    assert "patent" in kept
    sentences = [s for s in passage.text.split(". ")]
    positions = [passage.text.index(s[:30]) for s in kept.split(". ") if s[:30] in passage.text]
    assert positions == sorted(positions) and len(positions) < len(sentences)


@pytest.mark.slow
def test_abstractive_and_history_summary_with_the_real_default_model(default_generator):
    passage = demo_passage("demo-mit")
    hit_, record = compressed_hit(
        AbstractiveCompressor(default_generator), "What does the MIT License require?", passage, 100,
        default_generator.count_tokens)
    if record is not None:  # a reply with points: at most five, each within 150 characters
        lines = hit_.text.splitlines()
        assert 1 <= len(lines) <= 5 and all(len(line) <= 152 for line in lines)
        assert record["after"] < record["before"] and record["mode"] == "abstractive"
    else:  # no usable point: the passage stays whole, never an empty one
        assert hit_ is passage
    summarizer = HistorySummarizer(default_generator, max_new_tokens=48)
    # both turns as the template renders them: 84 tokens; the newest alone 27, beside a summary of ~38
    ctx = ContextManager(ContextConfig(max_history_tokens=80), default_generator.count_tokens,
                         default_generator.render_chat, summarizer=summarizer)
    two_turns = [("Who may use MIT-licensed code?", "Anyone may use it, also in closed-source products. " * 3),
                 ("What must I keep?", "You must keep the copyright notice and the permission notice.")]
    ctx.start("Can I sell it?", history=two_turns)
    assert ctx.history_fit is not None and ctx.history_fit.older_turns == 1
    assert ctx.history_fit.summary and ctx.history[0][1] == ctx.history_fit.summary
    assert ctx.history[-1] == two_turns[-1]


def test_build_hands_the_context_its_compressor_and_summarizer():
    gen, retriever = ScriptedGenerator([]), DictRetriever({})
    extractive = build_run(RunConfig().override(context={"compress": "extractive"}), gen, retriever)
    assert isinstance(extractive.context.compressor, ExtractiveCompressor)  # its model loads on first use
    plain = build_run(RunConfig().override(context={"summarize_history": False}), gen, retriever)
    assert plain.context.compressor is None and plain.context.summarizer is None


@pytest.mark.slow
def test_edges_order_and_extractive_compression_in_a_real_answer(default_generator, demo_retriever):
    config = RunConfig().override(decider={"name": "always"}, retrieval={"top_k": 4},
                                  context={"order": "edges", "compress": "extractive"},
                                  generator={"max_answer_tokens": 24})
    run = build_run(config, default_generator, demo_retriever)
    result = run.controller.run("Can I use Apache-2.0 code in a commercial product?")
    first = result.rounds[0]
    assert first.injection is not None and len(first.injection.added) >= 3
    added = [h for h in first.hits if h.chunk_id in first.injection.added]
    shown = {cid: record["text"] for cid, record in first.injection.compressed.items()}
    text = "".join(p.text for p in run.context.pieces())
    # the model read the best hit first and the second best last (edges), compressed where cut
    read = sorted(added, key=lambda h: text.index((shown.get(h.chunk_id) or h.text)[:40]))
    assert [h.chunk_id for h in read] == [h.chunk_id for h in ordered(added, "edges")]
    assert first.injection.compressed and all(
        r["after"] < r["before"] and r["mode"] == "extractive" for r in first.injection.compressed.values())
