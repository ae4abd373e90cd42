"""A long conversation costs a bounded amount: the history kept word for word fits
`max_history_tokens` as the chat template renders it, and the summary reads at most
`summary_input_tokens` of the older turns, whatever the number of turns.

With the default model's real tokenizer and chat template; the summarizer's model is a double
that records its prompts (the model call is what is bounded here, not what it writes).
"""

from __future__ import annotations

import pytest

from rigkit.compression import SUMMARY_REQUEST, HistorySummarizer
from rigkit.config import ContextConfig
from rigkit.context import ContextManager
from rigkit.streaming import Cancelled


class _Chat:
    """The default model's tokenizer and chat template, without its weights."""

    def __init__(self) -> None:
        from rigkit.generation.loading import default_tokenizer

        self.tokenizer = default_tokenizer()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def render_chat(self, messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


SUMMARY = "We talked about licences: MIT, GPL and Apache, and who wrote them."


class _Recorder:
    """A summarizer's model: records each prompt, answers one short summary."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        self.prompts.append(prompt)
        return SUMMARY


@pytest.fixture(scope="module")
def chat():
    return _Chat()


# 1,000 short pairs in about 30 KB: many turns, few words each (the template's share is large)
PAIRS = [(f"Question {i}?", f"Answer {i}.") for i in range(1000)]


def _history_tokens(chat: _Chat, ctx: ContextManager) -> int:
    """The tokens the history occupies in the rendered prompt."""
    system = [{"role": "system", "content": ctx.system}]
    turns = [{"role": r, "content": t} for q, a in ctx.history for r, t in (("user", q), ("assistant", a))]
    return chat.count_tokens(chat.render_chat(system + turns, False)) - chat.count_tokens(
        chat.render_chat(system, False))


@pytest.mark.parametrize("summarize", [True, False])
def test_the_rendered_history_stays_within_its_budget(chat, summarize):
    model = _Recorder()
    summarizer = HistorySummarizer(model, input_tokens=256) if summarize else None
    ctx = ContextManager(ContextConfig(max_history_tokens=512), chat.count_tokens, chat.render_chat,
                         summarizer=summarizer)
    ctx.start("Can I sell it?", history=PAIRS)
    assert _history_tokens(chat, ctx) <= 512
    assert ctx.history[-1] == PAIRS[-1] and ctx.history_fit.kept_turns > 10
    if summarize:
        assert ctx.history[0] == (SUMMARY_REQUEST["en"], SUMMARY)


def test_the_summary_reads_only_the_newest_older_turns_that_fit_its_input(chat):
    model = _Recorder()
    ctx = ContextManager(ContextConfig(max_history_tokens=512), chat.count_tokens, chat.render_chat,
                         summarizer=HistorySummarizer(model, input_tokens=256))
    ctx.start("Can I sell it?", history=PAIRS)
    fit = ctx.history_fit
    assert len(model.prompts) == 1 and chat.count_tokens(model.prompts[0]) <= 256 + 40  # + the instruction
    assert 0 < fit.summarized_turns < fit.older_turns == 1000 - fit.kept_turns
    newest_older = PAIRS[len(PAIRS) - fit.kept_turns - 1]
    assert newest_older[0] in model.prompts[0] and PAIRS[0][0] + "\n" not in model.prompts[0]
    assert fit.summary_tokens <= 512 - sum(chat.count_tokens(q + a) for q, a in ctx.history[1:])


def test_one_turn_longer_than_the_summary_input_is_not_sent_whole(chat):
    model = _Recorder()
    long_turns = [("Tell me everything.", "word " * 3000), ("Thanks.", "You are welcome.")]
    ctx = ContextManager(ContextConfig(max_history_tokens=64), chat.count_tokens, chat.render_chat,
                         summarizer=HistorySummarizer(model, input_tokens=256))
    ctx.start("And then?", history=long_turns)
    assert len(model.prompts) == 1 and chat.count_tokens(model.prompts[0]) <= 256 + 40
    assert "Tell me everything." in model.prompts[0] and ctx.history_fit.summarized_turns == 1
    assert _history_tokens(chat, ctx) <= 64


def test_a_request_cancelled_before_its_summary_makes_no_model_call(chat):
    model = _Recorder()

    def gone() -> None:
        raise Cancelled("the client went away")

    ctx = ContextManager(ContextConfig(max_history_tokens=512), chat.count_tokens, chat.render_chat,
                         summarizer=HistorySummarizer(model, check_stop=gone))
    with pytest.raises(Cancelled):
        ctx.start("Can I sell it?", history=PAIRS)
    assert model.prompts == []
