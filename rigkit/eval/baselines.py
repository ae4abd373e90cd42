"""Systems that answer without a model: the floor every system with a model must clear.

- `question_only`: the first option an "A or B" question names, "yes" for a yes/no question, and
  nothing for an open question. On a set with many two-option and yes/no questions this scores
  well above 0 on EM without reading a passage, so a system "beats" another only if it also
  beats this one.
- `echo`: the question itself as the answer. Cover EM credits an answer that holds the gold
  anywhere, and a two-option question holds its gold, so this is Cover EM's floor.

Neither loads a generator or an index; both answer in microseconds and are deterministic.
"""

from __future__ import annotations

from rigkit.short_answer import choice_options, is_yes_no_question
from rigkit.trace import RIGResult

__all__ = ["BASELINES", "question_only_answer", "answer_question_only", "answer_echo"]

BASELINES = ("question_only", "echo")


def question_only_answer(question: str) -> str:
    """The rule's answer: the first option named, else "yes" for a yes/no question, else ""."""
    options = choice_options(question)
    if options:
        return options[0]
    return "yes" if is_yes_no_question(question) else ""


def _result(question: str, answer: str, policy: str) -> RIGResult:
    # the short answer line is the answer itself, so EM scores exactly what the rule said
    return RIGResult(question=question, answer=answer, short_answer=answer, policy=policy)


def answer_question_only(question: str, seed: int = 0) -> RIGResult:
    return _result(question, question_only_answer(question), "question_only")


def answer_echo(question: str, seed: int = 0) -> RIGResult:
    return _result(question, question, "echo")
