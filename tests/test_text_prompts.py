"""Passages stay data through a server that takes only text prompts: special-token strings in
passages, titles and the question are broken up before the server tokenises the prompt, and the
result's `model.source` says so. (Against llama.cpp's real server: test_openai_backend_server.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

from rigkit.config import ContextConfig
from rigkit.context import ContextManager
from rigkit.generation.openai import OpenAIGenerator
from rigkit.generation.text_prompts import neutralize_special_tokens, special_strings
from rigkit.trace import Hit
from rigkit.transcript import StopRule
from tests.test_safety_passages import CHATML_ATTACK, INST_ATTACK, _inst_generator
from tests.tiny_model import tiny_generator


def _server_side_specials(tokenizer, text: str) -> int:
    """Special tokens in `text` as a server tokenises it: special-token parsing on."""
    specials = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    specials.discard(tokenizer.unk_token_id)  # a character the tiny vocabulary lacks, not markup
    return sum(i in specials for i in tokenizer(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("make, attack", [(tiny_generator, CHATML_ATTACK), (_inst_generator, INST_ATTACK)],
                         ids=["chatml", "inst"])
def test_broken_up_special_strings_match_no_token_and_read_the_same(make, attack):
    tokenizer = make().tokenizer
    specials = special_strings(tokenizer)
    assert _server_side_specials(tokenizer, attack) > 0
    safe = neutralize_special_tokens(attack, specials)
    assert _server_side_specials(tokenizer, safe) == 0
    assert safe.replace("\u2060", "") == attack
    assert neutralize_special_tokens("Paris is in France.", specials) == "Paris is in France."


def _llamacpp(seen: list[dict]):
    """A text-only server (llama.cpp's kind): records each completion body, answers "It is."."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "llamacpp"}]})
        seen.append(json.loads(request.content))
        event = {"choices": [{"text": "It is.", "finish_reason": "stop", "logprobs": {
            "tokens": ["It is."], "token_logprobs": [-0.1], "top_logprobs": [{"It is.": -0.1}]}}]}
        return httpx.Response(200, content=f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())
    return httpx.MockTransport(answer)


def _sent_prompt(passage: str, question: str = "capital?") -> tuple[str, OpenAIGenerator]:
    seen: list[dict] = []
    generator = OpenAIGenerator("http://models.test/v1", "m", tiny_generator(0).tokenizer,
                                transport=_llamacpp(seen))
    context = ContextManager(ContextConfig(), generator.count_tokens, generator.render_chat)
    context.start(question, passages=[Hit("d0#0", "d0", "Paris", passage, 1.0)])
    generator.next_segment(context.pieces(), StopRule(), 8)
    return seen[0]["prompt"], generator


def test_a_text_only_server_sees_no_more_special_tokens_than_for_a_clean_corpus():
    tokenizer = tiny_generator(0).tokenizer
    clean, _ = _sent_prompt("Paris is in France.")
    attacked, generator = _sent_prompt(CHATML_ATTACK)
    asked, _ = _sent_prompt("Paris is in France.", question=CHATML_ATTACK)
    assert isinstance(attacked, str)  # text prompts: the server tokenises them
    assert _server_side_specials(tokenizer, clean) > 0  # the template's own markup keeps its tokens
    assert _server_side_specials(tokenizer, attacked) == _server_side_specials(tokenizer, clean)
    assert _server_side_specials(tokenizer, asked) == _server_side_specials(tokenizer, clean)
    assert "special-token strings in passages and questions broken up" in generator.source
