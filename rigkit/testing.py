"""A test kit shipped with rigkit: parts that need no model, for tests and notebook demos.

`ScriptedGenerator` replays segments you write (like DSPy's DummyLM); `DictRetriever` returns
fixed hits per query; `AlwaysDecider` / `NeverDecider` are the baselines under their test-kit names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from rigkit.config import DEFAULT_CONTEXT_LIMIT
from rigkit.deciders.baselines import AlwaysRetrieve as AlwaysDecider
from rigkit.deciders.baselines import NeverRetrieve as NeverDecider
from rigkit.trace import Hit, Segment
from rigkit.transcript import Piece, StopRule

__all__ = ["ScriptedGenerator", "DictRetriever", "AlwaysDecider", "NeverDecider", "make_segment"]


def make_segment(
    text: str,
    probs: Sequence[float] | None = None,
    finish_reason: str = "stop",
    entropies: Sequence[float] | None = None,
    margins: Sequence[float] | None = None,
) -> Segment:
    """A segment split on whitespace into tokens with the given probabilities (default 0.9)."""
    words = text.split(" ") if text else []
    tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
    probs = list(probs) if probs is not None else [0.9] * len(tokens)
    if len(probs) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(probs)} probabilities")
    return Segment(
        text=text,
        tokens=tokens,
        token_ids=list(range(len(tokens))),
        logprobs=[math.log(max(p, 1e-12)) for p in probs],
        entropies=list(entropies) if entropies is not None else [-math.log(max(p, 1e-12)) for p in probs],
        margins=list(margins) if margins is not None else [max(0.0, 2 * p - 1) for p in probs],  # p1 - the rest, as one rival
        finish_reason=finish_reason,
    )


class ScriptedGenerator:
    """Returns pre-written segments in order; the last one ends the turn unless told otherwise.

    Each item is a `Segment` or a plain string. `generate` answers helper calls from `replies`.
    Every call's prompt is recorded in `prompts` so tests can check what the model would see.
    """

    spec = ""  # no model behind it: results name the class instead
    source = "scripted segments (rigkit.testing)"
    context_limit = DEFAULT_CONTEXT_LIMIT

    def __init__(self, segments: Iterable[Segment | str], replies: Iterable[str] = ()):
        self.segments = [s if isinstance(s, Segment) else make_segment(s) for s in segments]
        if self.segments and self.segments[-1].finish_reason == "stop":
            self.segments[-1].finish_reason = "end_of_turn"
        self.replies = list(replies)
        self.prompts: list[list[Piece]] = []
        self.helper_prompts: list[str] = []

    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int,
        on_token: Callable[[str], None] | None = None,
    ) -> Segment:
        self.prompts.append(list(prompt))
        if not self.segments:
            return Segment(text="", finish_reason="end_of_turn")
        segment = self.segments.pop(0)
        for token in segment.tokens if on_token is not None else ():
            on_token(token)
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        self.helper_prompts.append(prompt)
        return self.replies.pop(0) if self.replies else ""

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        out = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
        return out + ("<|assistant|>\n" if add_generation_prompt else "")


class DictRetriever:
    """Fixed hits per query substring; unmatched queries get `default` (empty by default)."""

    def __init__(self, table: dict[str, list[Hit]], default: list[Hit] | None = None):
        self.table = table
        self.default = default or []
        self.queries: list[str] = []

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        self.queries.append(query)
        for key, hits in self.table.items():
            if key.lower() in query.lower():
                return hits[:top_k]
        return self.default[:top_k]
