"""A streamed chat reply as rigkit reads it: answer tokens with their scores, reasoning apart.

Each event's `choices[0]` carries `delta.content` (answer text), maybe `delta.reasoning_content`
or `delta.reasoning` (a reasoning model's thinking, sent apart), and with `logprobs` requested
`logprobs.content[i].{token, logprob, top_logprobs}`. A chunk's scored tokens are taken as its
tokens when they spell its content; where they do not (a multi-byte character split across
tokens) the chunk's text goes with its first token, so the text is always what was written.
Without scores each chunk is one token of probability 1 (text deciders only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rigkit.generation.chat_messages import split_reasoning
from rigkit.generation.server_replies import (
    ServerError,
    read_event,
    read_json,
    shown,
    truncated_entropy,
)
from rigkit.http import ServerClient

__all__ = ["ChatReply", "stream_events"]


@dataclass
class ChatReply:
    """What a stream has delivered so far."""

    space_before: bool = False  # the answer continues a draft in a new turn: it needs a space first
    raw: list[str] = field(default_factory=list)  # content tokens, reasoning block included
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)  # sent apart by the server
    finish: str = "length"
    usage: dict | None = None

    def read(self, event: dict) -> None:
        self.usage = event.get("usage") or self.usage
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ServerError(f"a chat stream sent the delta {shown(delta)!r} where an object belongs")
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str):
                self.reasoning.append(thought)
            self._read_content(delta.get("content"), choice.get("logprobs"))
            if choice.get("finish_reason"):
                self.finish = "length" if choice["finish_reason"] == "length" else "end_of_turn"

    def _read_content(self, content: Any, logprobs: Any) -> None:
        if content is not None and not isinstance(content, str):
            raise ServerError(f"a chat stream sent the content {shown(content)!r} where a string belongs")
        scored = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
        if not scored:
            if content:
                self.raw.append(content)
                self.logprobs.append(0.0)
                self.entropies.append(0.0)
            return
        tokens, values, entropies = [], [], []
        for item in scored:
            token, value = (item.get("token"), item.get("logprob")) if isinstance(item, dict) else (None, None)
            if not isinstance(token, str) or not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise ServerError(f"a chat stream sent the token score {shown(item)!r}; expected "
                                  "{token, logprob, top_logprobs}")
            tops = [t.get("logprob") for t in item.get("top_logprobs") or [] if isinstance(t, dict)]
            tokens.append(token)
            values.append(min(0.0, float(value)))
            entropies.append(truncated_entropy([float(v) for v in tops if isinstance(v, int | float)]))
        if content is not None and "".join(tokens) != content:
            tokens = [content] + [""] * (len(tokens) - 1)
        self.raw += tokens
        self.logprobs += values
        self.entropies += entropies

    def _start(self) -> tuple[int, int, str]:
        """(first answer token, characters of it that are reasoning, reasoning text in the content)."""
        split = split_reasoning("".join(self.raw))
        seen = 0
        for i, token in enumerate(self.raw):
            if seen + len(token) > split.start:
                return i, split.start - seen, split.text
            seen += len(token)
        return len(self.raw), 0, split.text

    def answer_tokens(self) -> tuple[list[str], list[float]]:
        first, cut, _ = self._start()
        texts = list(self.raw[first:])
        if texts:
            texts[0] = texts[0][cut:]
            if self.space_before and not texts[0][:1].isspace() and texts[0][:1] not in ",.;:!?)":
                texts[0] = " " + texts[0]
        return texts, self.logprobs[first:]

    def answer_entropies(self) -> list[float]:
        return self.entropies[self._start()[0]:]

    def reasoning_text(self) -> str:
        inline = self._start()[2]
        return ("".join(self.reasoning) + ("\n" if self.reasoning and inline else "") + inline).strip()

    def read_usage_after(self, events: Iterator[dict], limit: int) -> None:
        """The usage event that ends a stream, read past at most `limit` further events."""
        for event in events:
            if event.get("usage"):
                self.usage = event["usage"]
                return
            limit -= 1
            if limit < 0:
                return


def stream_events(client: ServerClient, path: str, body: dict) -> Iterator[dict]:
    """Parsed server-sent events of a streamed reply, until `[DONE]` or the caller stops; a stream
    that ends before a finish reason (cut off, empty, or `[DONE]` first) is refused.

    `[DONE]` before any finish reason is a reply cut short, not one that ran to its token limit:
    llama-cpp-python's server ends a stream that way when another request arrives while it streams
    (unless started with `--interrupt_requests false`), often before the first word."""
    where = f"the model server at {client.base_url}{path}"
    lines = client.stream_lines("POST", path, body)
    finished, events = False, 0
    try:
        for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if not finished:
                    raise ServerError(
                        f"{where} ended its stream with [DONE] before any finish_reason (after {events} "
                        "events): the reply was cut short, e.g. by the server taking another request "
                        "(llama-cpp-python's server: start it with --interrupt_requests false, or use "
                        "--concurrency 1)")
                return
            event = read_event(read_json(data, where), where)
            finished = finished or any(c.get("finish_reason") for c in event.get("choices") or [])
            events += 1
            yield event
    finally:
        lines.close()
    if not finished:
        raise ServerError(f"{where} ended its stream before the answer ended (after {events} events, "
                          "no finish_reason and no [DONE]); check the server's log")
