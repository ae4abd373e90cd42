"""A streamed chat reply as rigkit reads it: answer tokens with their scores, reasoning apart.

Each event's `choices[0]` carries `delta.content` (answer text), maybe `delta.reasoning_content`
or `delta.reasoning` (a reasoning model's thinking, sent apart), and with `logprobs` requested
`logprobs.content[i].{token, logprob, top_logprobs}`. A chunk's scored tokens are taken as its
tokens when they spell its content; where they do not (a multi-byte character split across
tokens) the chunk's text goes with its first token, so the text is always what was written.
Without scores each chunk is one token of probability 1 (text deciders only).

A server is not believed further than the protocol: only choice 0 is read (rigkit asks for one);
where log-probabilities were asked for, a chunk of text without them, or with more scored tokens
than its text has bytes, ends the call in one line naming the server; and a server that ignores
`max_tokens` is cut on this side (`ChatReply.over`), so its stream is closed, not read to the end.
An HTML page where the event stream belongs says so.
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

__all__ = ["ChatReply", "stream_events", "choice_zero", "MAX_TOKEN_CHARS"]

MAX_TOKEN_CHARS = 32  # characters one token may hold, for the client-side cap (long tokens are ~16)


@dataclass
class ChatReply:
    """What a stream has delivered so far."""

    space_before: bool = False  # the answer continues a draft in a new turn: it needs a space first
    scored: bool = False  # log-probabilities were asked for: every chunk of text must carry them
    where: str = "a chat stream"  # the server and URL, for errors
    raw: list[str] = field(default_factory=list)  # content tokens, reasoning block included
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)  # sent apart by the server
    finish: str = "length"
    usage: dict | None = None

    def read(self, event: dict) -> None:
        self.usage = event.get("usage") or self.usage
        choice = choice_zero(event, self.where)
        if choice is None:
            return
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise ServerError(f"{self.where} sent the delta {shown(delta)!r} where an object belongs")
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str):
            self.reasoning.append(thought)
        self._read_content(delta.get("content"), choice.get("logprobs"))
        if choice.get("finish_reason"):
            self.finish = "length" if choice["finish_reason"] == "length" else "end_of_turn"

    def over(self, max_tokens: int) -> bool:
        """Whether the reply holds more than `max_tokens` tokens (reasoning included), or more
        text than they could spell: a server that ignores `max_tokens` is stopped here."""
        chars = sum(map(len, self.raw)) + sum(map(len, self.reasoning))
        return len(self.raw) + len(self.reasoning) > max_tokens or chars > max_tokens * MAX_TOKEN_CHARS

    def _read_content(self, content: Any, logprobs: Any) -> None:
        if content is not None and not isinstance(content, str):
            raise ServerError(f"{self.where} sent the content {shown(content)!r} where a string belongs")
        scored = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
        if not scored:
            if content and self.scored:  # read as probability 1, it would hide every doubt from the decider
                raise ServerError(f"{self.where} sent the text {shown(content)!r} without log-probabilities "
                                  "(choices[0].logprobs.content), which it gave when asked before; a decider "
                                  "reading token probabilities cannot run on it")
            if content:
                self.raw.append(content)
                self.logprobs.append(0.0)
                self.entropies.append(0.0)
            return
        if not isinstance(scored, list) or len(scored) > max(1, len((content or "").encode("utf-8", "surrogatepass"))):
            count = len(scored) if isinstance(scored, list) else shown(scored)
            raise ServerError(f"{self.where} sent {count} token scores for the text {shown(content or '')!r}: "
                              "they do not line up with its tokens (each token holds at least one byte)")
        tokens, values, entropies = [], [], []
        for item in scored:
            token, value = (item.get("token"), item.get("logprob")) if isinstance(item, dict) else (None, None)
            if not isinstance(token, str) or not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                raise ServerError(f"{self.where} sent the token score {shown(item)!r}; expected "
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


def choice_zero(event: dict, where: str) -> dict | None:
    """The event's choice 0 (an `index` of 0, or none given), None when it carries none. rigkit
    asks for one choice: others a server sends beside it are never read into the answer."""
    zeros = [c for c in event.get("choices") or [] if c.get("index", 0) == 0]
    if len(zeros) > 1:
        raise ServerError(f"{where} sent {len(zeros)} choices numbered 0 in one event; rigkit asks for one")
    return zeros[0] if zeros else None


def _html(line: str) -> bool:
    """A line of markup: no server-sent event starts with "<" (field names are words)."""
    return line.lstrip().startswith("<")


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
                if _html(line):  # a proxy's or a web server's error page, answered with 200
                    raise ServerError(f"{where} sent an HTML page where an event stream belongs: "
                                      f"{shown(line)!r}; is the URL the API's (.../v1)?")
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
            finished = finished or bool((choice_zero(event, where) or {}).get("finish_reason"))
            events += 1
            yield event
    finally:
        lines.close()
    if not finished:
        raise ServerError(f"{where} ended its stream before the answer ended (after {events} events, "
                          "no finish_reason and no [DONE]); check the server's log")
