"""Chinese text on its way to and from the model: caps that cut between characters (real CMRC
chunks, the real tokenizer, every shipped profile), the passage text the model reads, no split
character in a segment cut by the budget, and a repeated unpunctuated Chinese clause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.config import ContextConfig, ControllerConfig, GeneratorConfig, QueryConfig, load_config
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.guards import phrase_loop_at
from rigkit.queries import build_query_builder
from rigkit.testing import AlwaysDecider, DictRetriever, ScriptedGenerator
from rigkit.trace import Hit
from rigkit.truncation import cap_text, cut_points

ROOT = Path(__file__).resolve().parents[1]
CMRC = ROOT / "data" / "cmrc2018-zh" / "corpus.jsonl"
PROFILES = [None, *sorted(ROOT.glob("configs/*.yaml"))]  # the library default and each shipped profile


def chars(text: str) -> int:
    return len(text)


def cmrc_rows() -> list[dict]:
    return [json.loads(line) for line in CMRC.read_text(encoding="utf-8").splitlines()]


# -- the cap, as a pure function ----------------------------------------------------------------
def test_chinese_is_cut_between_characters_and_at_a_near_full_stop():
    text = "战国无双是一个游戏。它由光荣开发，发行于二零零七年"
    assert cap_text(text, 100, chars) == text
    capped = cap_text(text, 12, chars)
    assert capped == "战国无双是一个游戏。…"  # the 。 lies in the kept prefix's last fifth
    capped = cap_text(text, 18, chars)
    assert capped.endswith("…") and capped.startswith(text[:12]) and chars(capped) <= 18


def test_english_is_still_cut_at_spaces_and_a_tool_result_keeps_its_note():
    text = "Apache-2.0 allows commercial use and you must ship the NOTICE file with it"
    capped = cap_text(text, 31, chars, note=" … [truncated]")
    assert capped == "Apache-2.0 allows … [truncated]"
    assert all(text[p].isspace() for p in cut_points(text))


def test_one_long_word_is_cut_by_characters_rather_than_emptied():
    assert cap_text("x" * 50, 10, chars) == "x" * 8 + " …"


# -- real CMRC chunks, the real tokenizer, every shipped profile -------------------------------
@pytest.fixture(scope="module")
def cmrc_chunks():
    from rigkit.corpus import chunk_documents
    from rigkit.embeddings import E5_MODEL, load_tokenizer, max_seq_length
    from rigkit.readers import load_documents

    return chunk_documents(load_documents(CMRC), load_tokenizer(E5_MODEL), max_seq_length(E5_MODEL))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: "default" if p is None else p.name)
def test_no_cmrc_chunk_reaches_the_model_empty(cmrc_chunks, default_generator, profile):
    limit = load_config(profile).context.max_passage_tokens
    count = default_generator.count_tokens
    assert len(cmrc_chunks) == 240
    capped = [cap_text(c.text, limit, count) for c in cmrc_chunks]
    assert sum(t != c.text for t, c in zip(capped, cmrc_chunks)) > 100  # most chunks run past the cap
    empty = [c.chunk_id for c, t in zip(cmrc_chunks, capped) if len(t.rstrip(" …")) < 50]
    assert empty == []  # cut at spaces alone, 152 (cpu.yaml) and 173 (default) of them were " …"
    assert all(count(t) <= limit for t in capped)
    assert all(c.text.startswith(t.rstrip("…").rstrip()) for c, t in zip(cmrc_chunks, capped))


def test_the_model_reads_the_chinese_passage_text(default_generator):
    """The prompt string of the round after a retrieval holds the capped paragraph's own words."""
    row = cmrc_rows()[0]  # 战国无双3, 512 characters: past a 64-token cap
    passage = Hit(chunk_id=f"{row['id']}#0", doc_id=row["id"], title=row["title"], text=row["text"], score=1.0)
    gen = ScriptedGenerator(["它是一个游戏。", "它由光荣和ω-force开发。"])
    gen.count_tokens = default_generator.count_tokens  # the real tokenizer measures the cap
    context = ContextManager(ContextConfig(max_passage_tokens=64), gen.count_tokens, gen.render_chat)
    controller = RIGController(
        gen, DictRetriever({}, default=[passage]), AlwaysDecider(),
        build_query_builder(QueryConfig(mode="masked"), gen), context,
        config=ControllerConfig(max_rounds=1), generation=GeneratorConfig(max_answer_tokens=200))
    result = controller.run("《战国无双3》是由哪两个公司合作开发的？")
    assert result.used_retrieval_times == 1
    prompt = "".join(piece.text for piece in gen.prompts[1])
    assert "《战国无双3》（）是由光荣和ω-force开发的战国无双系列的正统第三续作。" in prompt
    kept = cap_text(row["text"], 64, default_generator.count_tokens)
    assert kept.endswith("…") and kept.rstrip("…") in prompt and len(kept) > 30


# -- no split character ----------------------------------------------------------------------
def test_a_segment_cut_inside_a_character_holds_its_bytes(default_generator):
    """SmolLM2's tokenizer writes most Chinese characters as two or three byte tokens."""
    import torch

    from rigkit.transcript import StopRule

    tokenizer = default_generator.tokenizer
    text = "回答问题"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # byte tokens: some prefixes end inside a character
    vocab = default_generator.model.config.vocab_size
    split = 0
    for n in range(1, len(ids) + 1):
        segment = default_generator._to_segment(ids[:n], torch.zeros(n, vocab), StopRule(), n)
        assert "\ufffd" not in segment.text and text.startswith(segment.text)
        assert tokenizer.decode(segment.token_ids) == segment.text  # no held byte left in the segment
        split += len(segment.token_ids) < n
    assert split > 0


# -- the repeat guard --------------------------------------------------------------------------
@pytest.mark.parametrize("segment", ["他是一个好演员他是一个好演员", "他是一个好演员，他是一个好演员。"])
def test_a_repeated_unpunctuated_chinese_clause_is_cut_where_it_comes_back(segment):
    assert phrase_loop_at("战国无双3是一个游戏。", segment) == 7 + (segment[7] == "，")


def test_a_chinese_sentence_without_a_repeat_passes():
    assert phrase_loop_at("", "本作以三大故事为主轴，分别是以武田信玄等人为主的关东三国志") is None
