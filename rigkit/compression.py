"""Fitting passages and history to the budget by relevance: order, compress, summarise.

- **Order** (`context.order`): `arrival` keeps the retriever's order within each injection and
  the injections in the order they came; `relevance` puts the best fused score first; `edges`
  puts the best first and last and the weakest in the middle, since models read the ends of a
  long context best (Liu et al. 2023, "Lost in the Middle"; LangChain's `LongContextReorder`).
  Order applies within each block the model reads as one (the up-front passages, each injected
  block): reordering across blocks would re-render text the KV cache already holds.
- **Extractive compression**: a passage keeps its sentences most similar to the focus (the
  question and the draft's tail), by cosine of the retrieval embedder's vectors, in their own
  order, within a token target (RECOMP's extractive compressor, with the embedder already loaded
  for dense retrieval instead of a trained one).
- **Abstractive compression**: the generator writes 3-5 key points of the passage (at most
  `MAX_POINT_CHARS` characters each); a reply with no usable point leaves the passage whole.
- **History summary**: earlier turns beyond `max_history_tokens` become one short summary turn
  written by the generator, instead of being dropped.

The components receive their model (generator or embedder) from `rigkit.build`; the context
manager only calls them, so its tests use doubles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from rigkit.config import ConfigError, ContextConfig
from rigkit.text import has_cjk, split_sentences
from rigkit.trace import HistoryFit, Hit

__all__ = [
    "ORDERS",
    "COMPRESSION_MODES",
    "ALLOCATIONS",
    "MAX_POINTS",
    "MAX_POINT_CHARS",
    "check_context_options",
    "ordered",
    "Compressor",
    "ExtractiveCompressor",
    "AbstractiveCompressor",
    "key_points",
    "HistorySummarizer",
    "compression_target",
    "compressed_hit",
    "fit_history",
]

ORDERS = ("arrival", "relevance", "edges")
COMPRESSION_MODES = ("none", "extractive", "abstractive")
ALLOCATIONS = ("rank", "score")
MAX_POINTS = 5
MAX_POINT_CHARS = 150


def check_context_options(config: ContextConfig) -> None:
    """Refuse an unknown order, compression mode or allocation, or a share outside (0, 1]."""
    for key, value, allowed in (("order", config.order, ORDERS), ("compress", config.compress, COMPRESSION_MODES),
                                ("allocate", config.allocate, ALLOCATIONS)):
        if value not in allowed:
            raise ConfigError(f"context.{key}: unknown value {value!r}; use one of {', '.join(allowed)}")
    share = config.passage_share
    if share is not None and not 0 < share <= 1:
        raise ConfigError(f"context.passage_share: a share of the context window in (0, 1], got {share!r}")
    if not 0 < config.compress_ratio <= 1:
        raise ConfigError(f"context.compress_ratio: a share of a passage in (0, 1], got {config.compress_ratio!r}")


def ordered(hits: Sequence[Hit], order: str) -> list[Hit]:
    """`hits` in reading order; ties keep the order they came in."""
    if order == "arrival":
        return list(hits)
    best_first = sorted(hits, key=lambda h: -h.score)  # stable: equal scores keep their order
    if order == "relevance":
        return best_first
    front, back = [], []  # edges: 1st, 3rd, 5th... from the front; 2nd, 4th... from the back
    for i, hit in enumerate(best_first):
        (front if i % 2 == 0 else back).append(hit)
    return front + back[::-1]


@runtime_checkable
class Compressor(Protocol):
    """Shortens one passage's text for `focus` (what the answer needs), aiming at `max_tokens`."""

    mode: str

    def compress(self, focus: str, hit: Hit, max_tokens: int) -> str: ...


class ExtractiveCompressor:
    """The passage's sentences most similar to the focus, in passage order, within `max_tokens`."""

    mode = "extractive"

    def __init__(self, embed: Callable[[list[str]], Any], count_tokens: Callable[[str], int]):
        self.embed = embed  # texts -> (n, dim) unit vectors: the dense retriever's own model
        self.count_tokens = count_tokens

    def compress(self, focus: str, hit: Hit, max_tokens: int) -> str:
        sentences = split_sentences(hit.text)
        if len(sentences) < 2:
            return hit.text  # nothing to choose between; the per-passage cap still applies
        import numpy as np

        vectors = np.asarray(self.embed([focus, *sentences]))  # one batch
        similarity = vectors[1:] @ vectors[0]  # (n_sentences,)
        chosen, used = [], 0
        for i in np.argsort(-similarity, kind="stable"):  # the best sentences, as many as fit
            size = self.count_tokens(sentences[i])
            if chosen and used + size > max_tokens:
                break  # no filler: a shorter but less similar sentence does not jump the queue
            chosen.append(int(i))
            used += size
        return " ".join(sentences[i] for i in sorted(chosen))


_BULLET = re.compile(r"^\s*(?:[-*•·]+|\d+[.)、:]|[（(]?\d+[)）])\s*")
_POINT_PROMPT = {
    "en": ("List 3 to 5 key points of the passage that help answer the question, one per line, "
           "each under 150 characters. Keep names, numbers and dates.\n"
           "Question: {focus}\nPassage: {title}. {text}\nKey points:\n- "),
    "zh": ("列出这段文字中有助于回答问题的3到5个要点，每行一个，每个不超过150个字符，"
           "保留人名、数字和日期。\n问题：{focus}\n文字：{title}。{text}\n要点：\n- "),
}


def key_points(reply: str, limit: int = MAX_POINTS, max_chars: int = MAX_POINT_CHARS) -> list[str]:
    """The generator's reply as at most `limit` points of at most `max_chars` characters:
    one per line, bullets and numbering removed, repeats skipped."""
    points: list[str] = []
    for line in reply.splitlines():
        point = _BULLET.sub("", line).strip()
        if not any(ch.isalnum() for ch in point) or point in points:
            continue
        if len(point) > max_chars:  # cut at a word where there is one
            cut = point[: max_chars - 1]
            point = (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"
        points.append(point)
        if len(points) == limit:
            break
    return points


class AbstractiveCompressor:
    """The generator's 3-5 key points of the passage, one per line."""

    mode = "abstractive"

    def __init__(self, generator: Any, max_new_tokens: int = 160):
        self.generator = generator  # anything with `generate(prompt, max_new_tokens) -> str`
        self.max_new_tokens = max_new_tokens

    def prompt(self, focus: str, hit: Hit) -> str:
        lang = "zh" if has_cjk(focus + hit.text) else "en"
        return _POINT_PROMPT[lang].format(focus=focus.strip(), title=hit.title, text=hit.text)

    def compress(self, focus: str, hit: Hit, max_tokens: int) -> str:
        reply = self.generator.generate(self.prompt(focus, hit), max_new_tokens=self.max_new_tokens)
        points = key_points(reply)
        return "\n".join(f"- {p}" for p in points) if points else hit.text


_SUMMARY_PROMPT = {
    "en": ("Summarise this earlier conversation in two or three short sentences. Keep names, "
           "numbers and dates.\n\n{turns}\n\nSummary:"),
    "zh": "用两三句话概括下面这段之前的对话，保留人名、数字和日期。\n\n{turns}\n\n概括：",
}
_TURN = {"en": "User: {q}\nAssistant: {a}", "zh": "用户：{q}\n助手：{a}"}
SUMMARY_INPUT_TOKENS = 1024  # the most history tokens one summary prompt holds (context.summary_input_tokens)
# the summary enters the history as an answer to this request, so the chat stays user/assistant
SUMMARY_REQUEST = {"en": "Summarise our conversation so far.", "zh": "概括一下我们之前的对话。"}


class HistorySummarizer:
    """The generator's short summary of earlier turns; the same turns are summarised once.

    The summary prompt holds only the newest older turns that fit `input_tokens`, so one summary
    costs at most that much prompt and `max_new_tokens` of answer however long the history is.
    `check_stop` (the request's cancellation check, which raises) runs before the model is called."""

    def __init__(self, generator: Any, max_new_tokens: int = 96, input_tokens: int = SUMMARY_INPUT_TOKENS,
                 check_stop: Callable[[], None] | None = None):
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.input_tokens = input_tokens
        self.check_stop = check_stop
        self._done: dict[tuple[tuple[str, str], ...], str] = {}

    def summarize(self, turns: Sequence[tuple[str, str]], language: str) -> str:
        key = tuple(turns)
        if key not in self._done:
            if self.check_stop is not None:
                self.check_stop()
            lang = language if language in _SUMMARY_PROMPT else "en"
            text = "\n".join(_TURN[lang].format(q=q.strip(), a=a.strip()) for q, a in turns)
            reply = self.generator.generate(_SUMMARY_PROMPT[lang].format(turns=text),
                                            max_new_tokens=self.max_new_tokens)
            self._done = {**dict(list(self._done.items())[-31:]), key: reply.strip()}  # bounded
        return self._done[key]


def compression_target(size: int, ratio: float, max_passage_tokens: int, share: int) -> int:
    """The token target of one passage: `ratio` of it, within the per-passage cap and its share."""
    return max(1, min(math.ceil(size * ratio), max_passage_tokens, share))


def compressed_hit(
    compressor: Compressor, focus: str, hit: Hit, target: int, count_tokens: Callable[[str], int],
) -> tuple[Hit, dict[str, Any] | None]:
    """`hit` with its text compressed toward `target` tokens, and the record of the cut
    (`{"before", "after", "mode", "text", "seconds"}`); the hit unchanged and None when the
    compressor gave nothing shorter."""
    import time

    start = time.perf_counter()
    before = count_tokens(hit.text)
    text = compressor.compress(focus, hit, target).strip()
    after = count_tokens(text)
    if not text or after >= before:
        return hit, None
    record = {"before": before, "after": after, "mode": compressor.mode, "text": text,
              "seconds": round(time.perf_counter() - start, 4)}
    metadata = {**hit.metadata, "compressed": compressor.mode, "original_tokens": before}
    return Hit(**{**hit.__dict__, "text": text, "metadata": metadata}), record


def fit_history(
    turns: list[tuple[str, str]], budget: int, count_tokens: Callable[[str], int],
    summarizer: HistorySummarizer | None, language: str, turn_overhead: int = 0,
) -> tuple[list[tuple[str, str]], HistoryFit | None]:
    """The most recent turns that fit `budget` tokens, after one summary turn of the older ones
    (room for it is kept) when there is a `summarizer`; without one the older turns are dropped.

    A turn costs its words plus `turn_overhead`, the chat template's tokens around one
    user / assistant pair, so the rendered history stays within `budget`. The summary covers the
    newest older turns that fit the summarizer's `input_tokens`; turns before them are dropped.
    The record is None when every turn fits."""
    sizes = [count_tokens(q) + count_tokens(a) + turn_overhead for q, a in turns]
    if sum(sizes) <= budget:
        return turns, None
    request = SUMMARY_REQUEST.get(language, SUMMARY_REQUEST["en"])
    room = 0
    if summarizer is not None:
        room = min(summarizer.max_new_tokens + count_tokens(request) + turn_overhead, budget // 2)
    kept = _newest_within(sizes, budget - room)
    older, recent = turns[: len(turns) - kept], turns[len(turns) - kept :]
    fit = HistoryFit(kept_turns=kept, older_turns=len(older), older_tokens=sum(sizes[: len(older)]))
    if summarizer is None or not older:
        return recent, fit
    lang = language if language in _TURN else "en"
    labels = max(0, count_tokens(_TURN[lang].format(q="a", a="b") + "\n") - count_tokens("a") - count_tokens("b"))
    told = _newest_within([s - turn_overhead + labels for s in sizes[: len(older)]], summarizer.input_tokens)
    read = older[len(older) - told :]
    if not told:  # the newest older turn alone is over the input: its beginning is summarised
        told, read = 1, [_cut_turn(older[-1], summarizer.input_tokens - labels, count_tokens)]
    summary = summarizer.summarize(read, language)
    cost = count_tokens(request) + count_tokens(summary) + turn_overhead
    while recent and cost + sum(sizes[len(turns) - len(recent) :]) > budget:
        recent.pop(0)  # a summary longer than its room: the oldest kept turns make way
        fit.kept_turns, fit.older_turns = fit.kept_turns - 1, fit.older_turns + 1
    fit.older_tokens = sum(sizes[: fit.older_turns])
    if summary and cost <= budget:
        fit.summary, fit.summary_tokens, fit.summarized_turns = summary, cost, told
        recent.insert(0, (request, summary))
    return recent, fit


def _newest_within(sizes: Sequence[int], budget: int) -> int:
    """How many of the last `sizes` fit `budget` together."""
    taken, used = 0, 0
    while taken < len(sizes) and used + sizes[-1 - taken] <= budget:
        used += sizes[-1 - taken]
        taken += 1
    return taken


def _cut_turn(turn: tuple[str, str], limit: int, count_tokens: Callable[[str], int]) -> tuple[str, str]:
    """`turn` within `limit` tokens: the question (at most half of them), then the answer's beginning."""
    question = _cut_text(turn[0], max(1, limit // 2), count_tokens)
    return question, _cut_text(turn[1], max(0, limit - count_tokens(question)), count_tokens)


def _cut_text(text: str, limit: int, count_tokens: Callable[[str], int]) -> str:
    """The longest beginning of `text` within `limit` tokens (a binary search over characters)."""
    if count_tokens(text) <= limit:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count_tokens(text[:mid]) <= limit else (lo, mid - 1)
    return text[:lo]
