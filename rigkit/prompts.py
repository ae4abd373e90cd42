"""Prompt texts: system prompts, the passage injection template (English and Chinese).

The injection template says the passages are a source of facts, not of style: without it, models
copy the passages' wording into the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rigkit.text import citation_tag

__all__ = [
    "SYSTEM_PROMPT",
    "MARKER_SYSTEM_PROMPT",
    "INJECTION_HEADER",
    "START_INSTRUCTION",
    "CONTINUE_INSTRUCTION",
    "GROUNDING_INSTRUCTION",
    "NUMBERED_HEADER",
    "system_prompt",
    "render_passages",
]

SYSTEM_PROMPT = {
    "en": "You are a careful assistant. Answer the question in a few short, factual sentences.",
    "zh": "你是一个严谨的助手。请用几句简短、准确的话回答问题。",
}

MARKER_SYSTEM_PROMPT = {
    "en": (
        "You are a careful assistant. Answer the question in a few short, factual sentences. "
        "Retrieve only when a needed fact is missing from the context; otherwise answer directly. "
        "To retrieve, write <{tag}>what you need to know</{tag}> and stop; passages will follow."
    ),
    "zh": (
        "你是一个严谨的助手。请用几句简短、准确的话回答问题。"
        "只有当上下文缺少所需的事实时才检索，否则直接回答。"
        "检索时写 <{tag}>需要了解的内容</{tag}> 然后停下，随后会给出资料。"
    ),
}

INJECTION_HEADER = {
    "en": (
        "Retrieved passages. Use them as a source of facts only: do not copy their wording or "
        "style, and ignore any passage that is irrelevant. Each passage starts with its citation id."
    ),
    "zh": "检索到的资料。仅把它们当作事实来源：不要照抄其措辞或风格，忽略无关的资料。每段资料以其引用编号开头。",
}

# context.grounding: strict. In the passages message, not the system prompt: a RIG answer starts
# before any passage arrives, and a rule about passages not yet there would ask it to refuse.
GROUNDING_INSTRUCTION = {
    "en": (
        "Answer only from these passages. If they do not contain the answer, say that the "
        "passages do not contain it instead of answering from memory."
    ),
    "zh": "只根据这些资料回答。如果资料中没有答案，请说明资料中没有，不要凭记忆回答。",
}

# context.cite: model. The passages are labelled [1], [2], ... instead of [[citation:ID]], and
# the model is asked to cite those numbers itself.
NUMBERED_HEADER = {
    "en": (
        "Retrieved passages, numbered. Use them as a source of facts only: do not copy their "
        "wording or style, and ignore any passage that is irrelevant. After each sentence that "
        "uses a passage, write that passage's number in square brackets, like [1]."
    ),
    "zh": (
        "检索到的资料（已编号）。仅把它们当作事实来源：不要照抄其措辞或风格，忽略无关的资料。"
        "每句话用到某段资料时，在句末用方括号写出该资料的编号，例如 [1]。"
    ),
}

# After passages injected mid-answer: small models drift into commenting on "the document" unless
# the question is restated, so both instructions name it.
START_INSTRUCTION = {"en": "Now answer the question: {question}", "zh": "现在回答问题：{question}"}
CONTINUE_INSTRUCTION = {
    "en": 'Continue your answer to "{question}" from where you stopped, without repeating it.',
    "zh": "继续回答“{question}”，从你停下的地方接着写，不要重复已写的内容。",
}

# A rewrite that came back empty (the model ended its turn right after the passages) is asked
# once more, in its own turn, to write from them: the passages are what the answer was waiting for.
GO_ON_INSTRUCTION = {
    "en": 'Go on with your answer to "{question}": write its next sentence from the passages above.',
    "zh": "请根据上面的资料继续回答“{question}”，写出下一句。",
}

QUESTION_WITH_PASSAGES = {"en": "Question: {question}", "zh": "问题：{question}"}

_SEP = {"en": " ", "zh": ""}  # between sentences: Chinese is written without spaces


def system_prompt(language: str, marker_tag: Any = None) -> str:
    """The built-in system prompt; `marker_tag` (a word tag or a `MarkerProtocol`) adds the
    prompt that teaches the model to ask for retrieval with those tags."""
    if not marker_tag:
        return SYSTEM_PROMPT[language]
    if isinstance(marker_tag, str):
        return MARKER_SYSTEM_PROMPT[language].format(tag=marker_tag)
    return marker_tag.prompt(language)


def render_passages(
    passages: list[tuple[str, str, str]],
    language: str,
    instruction: str | None = None,
    numbers: Mapping[str, int] | None = None,
    strict: bool = False,
) -> str:
    """The passages message: header, one `[[citation:ID]] Title: text` block per passage, then
    the instruction (when the passages arrive mid-answer).

    `numbers` (chunk id -> passage number) labels the passages `[n]` and asks the model to cite
    them so; `strict` asks it to answer only from the passages.
    """
    label = (lambda cid: f"[{numbers[cid]}]") if numbers is not None else citation_tag
    blocks = [f"{label(cid)} {title}: {text}" for cid, title, text in passages]
    header = (NUMBERED_HEADER if numbers is not None else INJECTION_HEADER)[language]
    if strict:
        header += _SEP[language] + GROUNDING_INSTRUCTION[language]
    parts = [header, *blocks]
    if instruction:
        parts.append(instruction)
    return "\n\n".join(parts)
