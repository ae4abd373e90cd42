"""Reading a streamed `/completions` reply: what the server is, what it is asked to stop on, and
each choice's tokens with their scores, checked against the protocol."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rigkit.generation.chat_stream import MAX_TOKEN_CHARS
from rigkit.generation.server_replies import (
    ServerError,
    read_json,
    served_models,
    shown,
    token_scores,
    truncated_entropy,
)
from rigkit.transcript import PieceTokens, StopRule, decode_keeping

__all__ = ["MAX_STOP_STRINGS", "Server", "StreamedTokens", "probe_server", "stop_strings", "usage_after"]

MAX_STOP_STRINGS = 4


@dataclass
class Server:
    """What the one-time probe of `/models` found."""

    models: list[str]
    vllm: bool  # vLLM takes token-id prompts, returns token ids and keeps stop strings on request
    sglang: bool = False  # SGLang takes `skip_special_tokens` (text back, not token ids)


def probe_server(client: Any, base_url: str, model: str) -> Server:
    """List the served models, check `model` is among them, and learn the server kind."""
    where = f"the model server at {base_url}/models"
    data = served_models(read_json(client.request("GET", "/models").text, where), where)
    names = [str(m.get("id")) for m in data]
    if names and model not in names:
        raise ServerError(f"model {model!r} is not served at {base_url}; it serves: {', '.join(names)}")
    owner = str(next((m.get("owned_by") for m in data if m.get("id") == model), "")).lower()
    return Server(names, vllm=owner == "vllm", sglang=owner == "sglang")


@dataclass
class StreamedTokens:
    """The tokens of one streamed completion so far: per-token text, ids and scores, in step.

    vLLM sends token ids (decoded here with the kept marker tags, `keep`); other servers send token
    texts, whose ids are re-tokenised locally. The tokenizer is shared across threads: `lock`.
    """

    tokenizer: Any
    piece_tokens: PieceTokens
    lock: threading.Lock
    vllm: bool
    keep: frozenset[int]
    where: str
    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)

    def read(self, choice: dict) -> None:
        """Add the tokens of one streamed choice."""
        lp, text = choice.get("logprobs"), choice.get("text")
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        if not tokens:  # the answer is read from the scored tokens: text without them would be lost
            if text:
                raise ServerError(
                    f"{self.where} sent the text {shown(text)!r} without log-probabilities "
                    "(choices[0].logprobs.tokens); rigkit reads every token from them (llama.cpp's "
                    "server: start it with --logits_all true)"
                )
            return
        scores = token_scores(lp, self.where)
        tokens = scores.tokens
        # each token holds a byte at least; up to 3 bytes of a character split across tokens may
        # come in the next chunk's text (vLLM holds them back)
        if len(tokens) > 3 + (len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0):
            raise ServerError(f"{self.where} sent {len(tokens)} token scores for the text {shown(text or '')!r}: "
                              "they do not line up with its tokens (each token holds at least one byte)")
        if self.vllm:
            new_ids = [_token_id(t) for t in tokens]
            self.texts.extend(self._texts_of(new_ids))
            self.token_ids.extend(new_ids)
        else:
            self.texts.extend(tokens)
            self.token_ids.extend(self._id_of(t) for t in tokens)
        self.logprobs.extend(scores.logprobs)
        self.entropies.extend(truncated_entropy(top) for top in scores.tops)

    def cut(self, n: int) -> None:
        """Keep the first `n` tokens."""
        del self.texts[n:], self.token_ids[n:], self.logprobs[n:], self.entropies[n:]

    def over(self, max_tokens: int) -> bool:
        """More tokens than asked for, or more text than they could spell (`MAX_TOKEN_CHARS` each)."""
        return len(self.texts) > max_tokens or sum(map(len, self.texts)) > max_tokens * MAX_TOKEN_CHARS

    def _texts_of(self, new_ids: list[int]) -> list[str]:
        """Per-token text of `new_ids` following the ids so far (multi-byte safe, like the HF backend)."""
        with self.lock:
            before = self.token_ids
            head = decode_keeping(self.tokenizer, before, self.keep)
            out = []
            for i in range(len(new_ids)):
                text = decode_keeping(self.tokenizer, before + new_ids[: i + 1], self.keep)
                if text.endswith("\ufffd"):
                    out.append("")
                    continue
                out.append(text[len(head):])
                head = text
            return out

    def _id_of(self, token_text: str) -> int:
        """A text-mode token's id, re-tokenised locally (the server only sent its text)."""
        ids = self.piece_tokens(token_text)
        return ids[0] if ids else (self.tokenizer.unk_token_id or 0)


def stop_strings(stop: StopRule) -> list[str]:
    """Strings a server can stop on that the stop rule also ends at (it checks the rest)."""
    strings = [stop.marker_close] if stop.marker_close else []
    if stop.sentence:
        strings += [". ", "? ", "! ", ".\n"]
    return strings[:MAX_STOP_STRINGS]


def _token_id(token: str) -> int:
    """vLLM's `token_id:123` form (`return_tokens_as_token_ids`)."""
    number = token.removeprefix("token_id:")
    if number == token or not number.isdigit():
        raise ServerError(f"expected a token id from the server, got {token!r}")
    return int(number)


def usage_after(events: Iterator[dict], limit: int) -> dict | None:
    """The usage event that ends a stream, read past at most `limit` further token events."""
    for chunk in events:
        if chunk.get("usage"):
            return chunk["usage"]
        limit -= 1
        if limit < 0:
            return None
    return None
