"""The context as prompt pieces: the chat head, each passage block, and what the passages cost.

A block closes the assistant turn, adds the passages as a user message and reopens the assistant
turn; with an inline marker protocol (Search-R1 `<information>`, R1-Searcher, Self-RAG) it goes
inside the open assistant turn, between the protocol's result tags. Titles and texts are defused
when rendered, so no passage can open or close a retrieval marker or plant a citation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rigkit.compression import ordered
from rigkit.config import ContextConfig
from rigkit.context.layout import Layout
from rigkit.markers import MarkerProtocol, format_passages, neutralize_markers, render_results
from rigkit.prompts import QUESTION_WITH_PASSAGES, render_passages
from rigkit.text import neutralize_citations
from rigkit.trace import Hit, Segment
from rigkit.transcript import Piece, plain_spans

__all__ = ["Asked", "Renderer"]

_SENTINEL = "\u2063RIGKIT\u2063"  # marks where the draft goes when slicing the chat template


@dataclass(frozen=True)
class Asked:
    """What a question's prompt opens with: the system prompt, earlier turns, the question."""

    question: str = ""
    language: str = "en"
    system: str = ""
    history: Sequence[tuple[str, str]] = ()


class Renderer:
    """Renders a `Layout` for one question; each block once (and again only if an eviction
    changes its passages): `pieces()` runs every round."""

    def __init__(
        self,
        config: ContextConfig,
        count_tokens: Callable[[str], int],
        render_chat: Callable[[list[dict[str, str]], bool], str],
        protocol: MarkerProtocol,
        marker_protocol: MarkerProtocol | None,
        numbers: Callable[[], dict[str, int]],
    ):
        self.config = config
        self.count_tokens = count_tokens
        self.render_chat = render_chat
        self.protocol = protocol  # passages are defused against its tags
        self.marker_protocol = marker_protocol  # set when the run uses markers: where passages go
        self.numbers = numbers  # chunk id -> citation number, as passages entered the context
        self._overhead: int | None = None  # the template's tokens per earlier turn, measured once
        self.start(Asked())

    def start(self, asked: Asked) -> None:
        """A new question: nothing rendered yet."""
        self.asked = asked
        self._blocks: dict[tuple[tuple[str, ...], str], Piece] = {}
        self._token_counts: dict[tuple[tuple[str, ...], str], int] = {}

    def turn_overhead(self, system: str) -> int:
        """The chat template's tokens around one earlier user / assistant pair (measured once)."""
        if self._overhead is None:
            head = [{"role": "system", "content": system}]
            pair = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
            both = self.count_tokens(self.render_chat(head + pair, False))
            alone = self.count_tokens(self.render_chat(head, False))
            self._overhead = max(0, both - alone - self.count_tokens("a") - self.count_tokens("b"))
        return self._overhead

    def pieces(self, layout: Layout) -> list[Piece]:
        """The prompt for the next segment."""
        pieces = [self.head(layout.initial)]
        for event in layout.events:
            if isinstance(event, Segment):
                pieces.append(Piece(event.text, tuple(event.token_ids), role="draft"))
            elif event.hits:
                pieces.append(self.block(event.hits, event.instruction))
            elif event.nudge:
                pieces.append(self._user_block(event.instruction))
        return pieces

    def head(self, initial: list[Hit]) -> Piece:
        """System prompt, earlier turns and the question (after the up-front passages)."""
        messages = [{"role": "system", "content": self.asked.system}]
        for q, a in self.asked.history:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": self._user_message(initial)})
        rendered = self.render_chat(messages, True)
        # The user's and the documents' words are data: tokenised with special tokens off.
        data = [m["content"] for m in messages[1:] if m["role"] in ("user", "assistant")]
        return Piece(rendered, role="question", plain=plain_spans(rendered, data))

    def block(self, hits: list[Hit], instruction: str) -> Piece:
        """One block of injected passages, rendered once per set of passages."""
        key = (tuple(h.chunk_id for h in hits), instruction)
        if key not in self._blocks:
            self._blocks[key] = self._render_block(hits, instruction)
        return self._blocks[key]

    def passage_tokens(self, layout: Layout, exclude: set[str] = frozenset()) -> int:
        """Tokens the passages occupy as rendered (ids, titles, texts, headers, turn tokens);
        `exclude`: leave these passages out (a block left empty costs nothing)."""
        total = 0
        initial = [h for h in layout.initial if h.chunk_id not in exclude]
        if initial:  # what the up-front passages add to the question message (labels included)
            total += self._count(initial, "", lambda: self._user_message(initial)) - self.count_tokens(
                self.asked.question)
        for block in layout.blocks():
            hits = [h for h in block.hits if h.chunk_id not in exclude]
            if hits:
                render = lambda h=hits, i=block.instruction: self.block(h, i).text  # noqa: E731
                total += self._count(hits, block.instruction, render)
        return total

    def _count(self, hits: list[Hit], instruction: str, render: Callable[[], str]) -> int:
        key = (tuple(h.chunk_id for h in hits), instruction if instruction else "\0head")
        if key not in self._token_counts:
            self._token_counts[key] = self.count_tokens(render())
        return self._token_counts[key]

    def _user_message(self, passages: list[Hit]) -> str:
        """The question, after the up-front passages when there are any (plain RAG)."""
        asked = self.asked
        if not passages:
            return asked.question
        rendered = render_passages(self._triples(passages), asked.language, **self._passage_rules())
        return rendered + "\n\n" + QUESTION_WITH_PASSAGES[asked.language].format(question=asked.question)

    def _passage_rules(self) -> dict:
        """How the passages message labels passages and what it asks (context.cite, context.grounding)."""
        numbers = self.numbers() if self.config.cite == "model" else None
        return {"numbers": numbers, "strict": self.config.grounding == "strict"}

    def grounding_block(self, hits: list[Hit], instruction: str) -> Piece:
        """`hits` in a user message that asks to answer only from them (the strict grounding
        prompt), whatever `context.grounding` says: for writing an unsupported segment again."""
        rules = {**self._passage_rules(), "strict": True}
        return self._user_block(render_passages(self._triples(hits), self.asked.language, instruction, **rules))

    def _render_block(self, hits: list[Hit], instruction: str) -> Piece:
        """Close the assistant turn, add the passages as a user message, reopen the assistant."""
        if self.marker_protocol is not None and self.marker_protocol.inline:
            return self._render_inline(hits)
        return self._user_block(render_passages(self._triples(hits), self.asked.language, instruction,
                                                **self._passage_rules()))

    def _user_block(self, content: str) -> Piece:
        """`content` as a user message between two assistant turns (passages: data, not markup)."""
        base = [{"role": "user", "content": "q"}]
        before = self.render_chat(base + [{"role": "assistant", "content": _SENTINEL}], False)
        after = self.render_chat(
            base + [{"role": "assistant", "content": _SENTINEL}, {"role": "user", "content": content}],
            True,
        )
        cut = after.index(_SENTINEL) + len(_SENTINEL)
        if after[:cut] != before[: before.index(_SENTINEL) + len(_SENTINEL)]:
            raise ValueError("the chat template does not render turns append-only")
        text = after[cut:]
        return Piece(text, role="passages", plain=plain_spans(text, [content]))

    def _render_inline(self, hits: list[Hit]) -> Piece:
        """Search-R1 / R1-Searcher style: the results go inside the open assistant turn, between
        the protocol's result tags, and the model goes on writing right after them."""
        triples = self._triples(hits)
        text = render_results(self.marker_protocol, triples)
        return Piece(text, role="passages", plain=plain_spans(text, [format_passages(self.marker_protocol, triples)]))

    def _triples(self, hits: list[Hit]) -> list[tuple[str, str, str]]:
        """(id, title, text) with markers and citation tags defused: passages are data."""
        p = self.protocol

        def defuse(text: str) -> str:
            return neutralize_citations(neutralize_markers(text, p))

        return [(h.chunk_id, defuse(h.title), defuse(h.text)) for h in ordered(hits, self.config.order)]
