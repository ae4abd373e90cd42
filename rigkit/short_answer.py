"""The short answer line: "Answer: X" (答案：X) after the long answer, extracted or asked for.

Small chat models answer in sentences, so exact match on the reply is near 0 even when it is
right. `extract_answer` takes the short answer out of the reply by documented rules; `ask_prompt`
and `parse_short_reply` ask the model for it in one helper call, in the question's language.
The long answer is kept either way: the short one is a separate field of the result.
"""

from __future__ import annotations

import re

from rigkit.text import (
    fact_words,
    first_sentence,
    has_cjk,
    mentions,
    normalize_words,
    strip_citations,
)

__all__ = ["SHORT_ANSWER_MODES", "extract_answer", "choice_options", "is_yes_no_question", "answer_line",
           "ask_prompt", "parse_short_reply"]

SHORT_ANSWER_MODES = ("none", "extract", "ask")

_ANSWER_IS = re.compile(
    r"(?:final answer|short answer|the answer|answer)\s*(?:is|was|would be|:)\s*:?\s*(?P<rest>.+)"
    r"|答案(?:是|为|：|:)\s*(?P<zh>.+)",
    re.IGNORECASE | re.DOTALL,
)
_YES_NO_QUESTION = re.compile(
    r"^\s*(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should)\b", re.IGNORECASE
)
_LEADING_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_TRIM = " \t\n\"'“”‘’«»()[]*.,;:!?。，；：！？"
# "Which film came out first, A or B?", "Who was born first out of A and B?", "A还是B？"
_CHOICE = re.compile(r"(?:,|\bout of\b|\bbetween\b)\s*(?P<a>.+?)\s+(?:or|and)\s+(?P<b>.+?)\s*\??\s*$",
                     re.IGNORECASE)
_CHOICE_ZH = re.compile(r"(?P<a>[^，,？?]+?)还是(?P<b>[^，,？?]+?)[？?]?\s*$")


def choice_options(question: str) -> list[str]:
    """The two options a "which of A or B" question offers, else []."""
    found = _CHOICE_ZH.search(question) if has_cjk(question) else _CHOICE.search(question)
    if not found:
        return []
    return [found.group("a").strip(_TRIM), found.group("b").strip(_TRIM)]


def is_yes_no_question(question: str) -> bool:
    """Whether the question opens with an auxiliary verb ("Is ...", "Did ...")."""
    return bool(_YES_NO_QUESTION.match(question))


def _first_mentioned(options: list[str], text: str) -> str | None:
    """The option whose words appear earliest in `text` (all its words, in order of position)."""
    haystack = normalize_words(text)
    best: tuple[int, str] | None = None
    for option in options:
        at = haystack.find(normalize_words(option))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, option)
    return best[1] if best else None


def extract_answer(reply: str, question: str) -> str:
    """The short answer in a sentence-long reply; the reply's first sentence when none is found.

    Rules, first that applies:
    1. text after "the answer is" / "answer:" / "答案是", up to the end of that sentence;
    2. a yes/no question ("Is ...", "Did ...") whose reply opens with yes or no: that word;
    3. a "which of A or B" question: the option the reply names first;
    4. the first fact-shaped phrase of the first sentence (name, title, date, number, code:
       `rigkit.text.fact_words`) that the question does not already mention: the noun phrase
       that answers it (the question's own entities are what is asked about, not the answer);
    5. otherwise the first sentence.
    """
    text = strip_citations(reply).strip()
    if not text:
        return ""
    found = _ANSWER_IS.search(text)
    if found:
        rest = found.group("rest") or found.group("zh") or ""
        short = first_sentence(rest, capital_ends=False).strip(_TRIM)
        if short:
            return short
    sentence = first_sentence(text, capital_ends=False) or text
    yes_no = _LEADING_YES_NO.match(sentence)
    if yes_no and _YES_NO_QUESTION.match(question):
        return yes_no.group(1).lower()
    options = choice_options(question)
    if options and (chosen := _first_mentioned(options, text)):
        return chosen
    for word in fact_words(sentence):
        if not mentions(question, word.text):
            return word.text.strip(_TRIM)
    return sentence.strip(_TRIM)


def answer_line(short: str, question: str) -> str:
    """The line shown after the long answer: "Answer: X", or "答案：X" for a Chinese question."""
    return f"答案：{short}" if has_cjk(question) else f"Answer: {short}"


def ask_prompt(question: str, answer: str) -> str:
    """The helper call that asks for the short answer, in the question's language."""
    if has_cjk(question):
        return (f"问题：{question}\n回答：{answer}\n"
                "请只用几个字给出简短答案（人名、地名、日期、数字或 是/否），格式为：答案：…")
    return (f"Question: {question}\nLong answer: {answer}\n"
            "Give only the short answer (a name, place, date, number, or yes/no), "
            "in a few words, as: Answer: ...")


def parse_short_reply(reply: str) -> str:
    """The short answer in the model's reply to `ask_prompt` ("" when there is none)."""
    text = strip_citations(reply).strip()
    found = _ANSWER_IS.search(text)
    if found:
        text = found.group("rest") or found.group("zh") or ""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return (first_sentence(line, capital_ends=False) or line).strip(_TRIM)
