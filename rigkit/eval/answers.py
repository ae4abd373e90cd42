"""Answer scores comparable with published numbers: official EM / F1, Chinese per character, and
the short-answer extraction small chat models need.

English (any gold without CJK characters) is scored exactly as the official SQuAD v1.1
evaluation script (`evaluate-v1.1.py`: `normalize_answer`, `f1_score`, `exact_match_score`,
`metric_max_over_ground_truths`), with HotpotQA's yes/no rule from its official
`hotpot_evaluate_v1.py` (`f1_score`: a yes / no / noanswer answer is right or wrong, never partly
right); 2WikiMultihopQA and MuSiQue reuse these scripts. Their normalisation lowercases, *removes*
ASCII punctuation (so "Jean-Luc" is "jeanluc"), removes the English articles a / an / the and
collapses whitespace; Unicode punctuation such as “ ” is kept, as the scripts keep it.

A gold with CJK characters takes a separate path (the scripts would make a whole Chinese sentence
one token): lowercase, every Unicode punctuation character removed, each CJK character its own
token and Latin runs whole (CMRC 2018's mixed segmentation), then the same bag-of-tokens F1.

Small chat models answer in sentences, so strict EM is near 0 even when the answer is right.
`extract_answer` takes the short answer out of the reply (documented rules below); the
evaluation reports EM / F1 on it *beside* the raw scores, never instead of them.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from rigkit.short_answer import extract_answer
from rigkit.text import has_cjk, strip_citations, word_units

__all__ = [
    "normalize_answer",
    "squad_f1",
    "squad_exact",
    "normalize_chinese",
    "chinese_tokens",
    "answer_tokens",
    "exact_match",
    "token_f1",
    "cover_match",
    "extract_answer",
    "answer_kind",
    "typed_match",
    "with_open_scores",
    "OPEN_SCORES",
    "OPEN_SCORES_BEFORE_SHORT",
    "before_short_answer",
]

_YES_NO = ("yes", "no", "noanswer")


# -- the official scripts, ported line for line ----------------------------------------------
def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (SQuAD v1.1, verbatim)."""

    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text: str) -> str:
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _bag_f1(prediction_tokens: list[str], ground_truth_tokens: list[str]) -> float:
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_f1(prediction: str, ground_truth: str) -> float:
    """Token F1 of SQuAD v1.1's `f1_score`, with HotpotQA's yes/no/noanswer rule first."""
    normalized_prediction = normalize_answer(prediction)
    normalized_ground_truth = normalize_answer(ground_truth)
    if normalized_prediction in _YES_NO and normalized_prediction != normalized_ground_truth:
        return 0.0
    if normalized_ground_truth in _YES_NO and normalized_prediction != normalized_ground_truth:
        return 0.0
    return _bag_f1(normalized_prediction.split(), normalized_ground_truth.split())


def squad_exact(prediction: str, ground_truth: str) -> float:
    """SQuAD v1.1's `exact_match_score` as 0.0 / 1.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


# -- the Chinese path -------------------------------------------------------------------------
def normalize_chinese(text: str) -> str:
    """Lowercase, no punctuation of any script, no English articles, single spaces."""
    text = "".join(" " if unicodedata.category(ch).startswith("P") or ch in string.punctuation
                   else ch for ch in text.lower())
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def chinese_tokens(text: str) -> list[str]:
    """Every CJK character its own token, Latin/digit runs whole ("KL320 型号" -> kl320 型 号)."""
    return [m.group(0) for m in word_units(normalize_chinese(text))]


# -- what the evaluation calls ----------------------------------------------------------------
def answer_tokens(text: str, chinese: bool | None = None) -> list[str]:
    """Normalised tokens on the path the text's script selects (or `chinese` forces)."""
    if chinese is None:
        chinese = has_cjk(text)
    return chinese_tokens(text) if chinese else normalize_answer(text).split()


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """Best EM over the gold answer and its aliases (each gold picks its script's path)."""
    scores = [
        float(chinese_tokens(prediction) == chinese_tokens(g)) if has_cjk(g) else squad_exact(prediction, g)
        for g in golds if g
    ]
    return max(scores, default=0.0)


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best F1 over the golds (`metric_max_over_ground_truths`)."""
    scores = [
        _bag_f1(chinese_tokens(prediction), chinese_tokens(g)) if has_cjk(g) else squad_f1(prediction, g)
        for g in golds if g
    ]
    return max(scores, default=0.0)


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def cover_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if some gold answer's normalised tokens occur contiguously in the prediction."""
    return float(any(
        _contains(answer_tokens(prediction, has_cjk(g)), answer_tokens(g, has_cjk(g)))
        for g in golds if g
    ))


# -- a score that fits the kind of answer asked for -------------------------------------------
_YES_NO_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def _options(question: str, gold: str) -> tuple[str, str] | None:
    """(gold, the other option) of a two-option question ("Which film came first, A or B?"),
    normalised as `normalize_answer` does (so a title's own "?" or "the" does not matter)."""
    _, comma, tail = question.strip().partition(", ")
    low, g = normalize_answer(tail), normalize_answer(gold)
    if not comma or not g:
        return None
    if low.startswith(g + " or "):
        return g, low[len(g) + 4:]
    if low.endswith(" or " + g):
        return g, low[: -(len(g) + 4)]
    return None


def answer_kind(question: str, golds: Sequence[str]) -> str:
    """"yes/no", "choice" (one of two options the question names) or "open"."""
    gold = golds[0] if golds else ""
    if normalize_answer(gold) in ("yes", "no"):
        return "yes/no"
    return "choice" if _options(question, gold) else "open"


OPEN_SCORES = {"em_open": "em_short", "f1_open": "f1_short"}  # score on open questions -> its source
# a run from before the short-answer line scored the answer its extraction rules cut from the reply
OPEN_SCORES_BEFORE_SHORT = {"em_open": "em_extracted", "f1_open": "f1_extracted"}


def before_short_answer(row: dict) -> bool:
    """A scored result line from a run before the short-answer line: EM on its extracted answer only."""
    return not row.get("error") and row.get("em_short") is None and row.get("em_extracted") is not None


def with_open_scores(rows: Sequence[dict]) -> list[dict]:
    """The rows, each with `em_open` / `f1_open`: its short-answer EM / F1 on an open question
    (`answer_kind` "open": neither yes/no nor one of two options the question names), None on
    the others. Two-option questions give EM near a coin's .5 whatever the system; these do not.
    A row with no short answer (a run from before the short-answer line) is scored on its extracted
    answer instead, and says so in `open_from`."""
    out = []
    for row in rows:
        if "em_open" not in row and not row.get("error"):
            is_open = answer_kind(row.get("question", ""), row.get("gold") or []) == "open"
            before_short = before_short_answer(row)
            sources = OPEN_SCORES_BEFORE_SHORT if before_short else OPEN_SCORES
            row = {**row, **{key: (row.get(source) if is_open else None) for key, source in sources.items()},
                   **({"open_from": "extracted"} if before_short else {})}
        out.append(row)
    return out


def _first_mention(text: str, phrase: str) -> int | None:
    words, needle = answer_tokens(text), answer_tokens(phrase)
    n = len(needle)
    return next((i for i in range(len(words) - n + 1) if n and words[i : i + n] == needle), None)


def typed_match(prediction: str, question: str, golds: Sequence[str]) -> float:
    """Cover EM made to fit the answer asked for, 1.0 or 0.0.

    - yes/no gold: the first "yes" or "no" the reply says is the gold's (a reply that says
      neither scores 0: "both are from the United Kingdom" has not answered);
    - a two-option question ("..., A or B?"): the option the reply names first is the gold
      (Cover EM credits a reply that names both, or merely repeats the question's options);
    - otherwise Cover EM.
    """
    kind = answer_kind(question, golds)
    text = strip_citations(prediction)
    if kind == "yes/no":
        said = _YES_NO_WORD.search(text)
        return float(bool(said) and said.group(1).lower() == normalize_answer(golds[0]))
    if kind == "choice":
        gold, other = _options(question, golds[0])  # type: ignore[misc]
        mine = _first_mention(text, gold)
        theirs = _first_mention(text, other)
        if mine is None or theirs is None:
            return float(mine is not None)
        # at one place the longer option is what was written ("Rocky II" holds "Rocky")
        return float((mine, -len(answer_tokens(gold))) < (theirs, -len(answer_tokens(other))))
    return cover_match(prediction, golds)
