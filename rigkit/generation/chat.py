"""A chat model as the generator: any server with `/v1/chat/completions` (vLLM, SGLang, llama.cpp,
Ollama's OpenAI-compatible API, hosted APIs), with no tokenizer, template or weights of it here.

`backend: chat` (or `ollama`, whose base URL defaults to `http://localhost:11434/v1`). The
transcript is rendered in a private markup (`chat_messages`) and read back into chat messages
for every segment; the server applies its own chat template. What the server can do is asked
once (`chat_probe`) and said in `source`, and so in every result:
- Continuing a partial answer: where the server continues a final assistant message
  (`continue_final_message`), the draft goes as that message; elsewhere the draft goes as a closed
  assistant turn of its own followed by a user turn asking to go on from where it stops, and
  the reply is the continuation.
  Each segment records which way it took (`Segment.continuation`: continue | new_turn, or empty
  when the assistant turn had nothing to continue).
- Stops: the stop rule (`find_stop`) cuts the streamed text and closes the stream. vLLM also gets
  the stop strings, kept in its output (`include_stop_str_in_output`); a server that strips them
  would drop the very text the rule keeps, so others get none and are cut by rigkit alone.
- Token scores: `logprobs: true, top_logprobs: k` where the server gives them; the entropy is the
  truncated top-k estimate. A server without them runs the text deciders only
  (`check_decider_support` refuses the others before the first call).
- Reasoning (`reasoning_content` / `reasoning`, or a leading `<think>` block) is kept out of the
  segment's text, tokens and scores, so the answer, the citations and the decider never see it;
  `Segment.reasoning` shows it in the trace. A reply that is only reasoning is refused.
- Token counts: the server's tokenize route where it has one, else `TokenEstimate` (characters,
  corrected by each reply's `usage.prompt_tokens`). Cached prompt tokens
  (`usage.prompt_tokens_details.cached_tokens`) become `tokens_reused`; None when unsaid.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from rigkit.config import DEFAULT_CONTEXT_LIMIT, GeneratorConfig
from rigkit.errors import InputError
from rigkit.generation.chat_messages import (
    TokenEstimate,
    messages_of,
    render_markup,
    split_reasoning,
)
from rigkit.generation.chat_probe import ChatServer, probe_server, tokens_in
from rigkit.generation.chat_stream import ChatReply, choice_zero, stream_events
from rigkit.generation.server_replies import (
    TEMPLATE_TOKENS,
    ServerError,
    api_key_from_env,
    before_special,
    check_not_empty,
    read_event,
    read_json,
    special_cut,
    usage_count,
)
from rigkit.generation.stops import segment_end
from rigkit.http import ServerClient
from rigkit.text import detect_language
from rigkit.trace import Segment
from rigkit.transcript import Piece, StopRule

__all__ = ["ChatGenerator", "OLLAMA_URL", "CONTINUATIONS"]

OLLAMA_URL = "http://localhost:11434/v1"
CONTINUATIONS = ("auto", "continue", "new_turn")
MAX_STOP_STRINGS = 4
_CONTINUE_TURN = {
    "en": "Continue your answer from exactly where it stops, without repeating any of it.",
    "zh": "从你的回答停下的地方接着写，不要重复已写的内容。",
}


class ChatGenerator:
    """A model behind `/v1/chat/completions`; one instance may serve several threads at once."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None,
        top_logprobs: int = GeneratorConfig.top_logprobs, temperature: float = GeneratorConfig.temperature,
        top_p: float = GeneratorConfig.top_p, seed: int | None = None,
        timeout: float = GeneratorConfig.request_timeout, max_retries: int = GeneratorConfig.max_retries,
        backoff: float = 0.5, continuation: str = "auto", transport: Any = None,
    ):
        if continuation not in CONTINUATIONS:
            raise InputError(f"generator.continuation must be one of {', '.join(CONTINUATIONS)}, not {continuation!r}")
        if top_logprobs < 1:
            raise InputError(f"top_logprobs must be >= 1, got {top_logprobs}")
        self.base_url, self.spec = base_url.rstrip("/"), model
        self.top_logprobs, self.temperature, self.top_p, self.seed = top_logprobs, temperature, top_p, seed
        self.continuation = continuation
        client = {"error": ServerError, "api_key": api_key, "timeout": timeout, "retries": max_retries,
                  "backoff": backoff, "transport": transport}
        self._client = ServerClient(self.base_url, name="model server", **client)
        root = self.base_url.removesuffix("/v1")
        self._root = ServerClient(root, name="model server", **{**client, "retries": 0})
        self._lock = threading.Lock()
        self._server: ChatServer | None = None
        self._counts: dict[str, int] = {}
        self.estimate = TokenEstimate()
        self._question_seed: int | None = None
        self._requests = 0

    @classmethod
    def from_config(cls, config: GeneratorConfig, transport: Any = None) -> ChatGenerator:
        """Built from `generator:` (`backend: chat`, or `ollama` with Ollama's default URL)."""
        base_url = config.base_url or (OLLAMA_URL if config.backend == "ollama" else None)
        if not base_url:
            raise InputError("backend chat needs generator.base_url (e.g. http://127.0.0.1:8000/v1)")
        api_key = api_key_from_env(config.api_key_env)
        return cls(base_url, config.model, api_key=api_key, top_logprobs=config.top_logprobs,
                   temperature=config.temperature, top_p=config.top_p, seed=config.seed,
                   timeout=config.request_timeout, max_retries=config.max_retries,
                   continuation=config.continuation, transport=transport)

    # -- what it says about itself -----------------------------------------------------------
    @property
    def source(self) -> str:
        from rigkit.models.registry import provenance_note

        s = self._server
        if s is None:
            return f"chat {self.base_url} (not asked yet)"
        scores = (f"logprobs top-{self.top_logprobs}; entropy: truncated top-{self.top_logprobs} estimate"
                  if s.logprobs else "no logprobs: text deciders only")
        way = self._way(s)
        tokens = f"token counts: server {s.tokenize_path}" if s.tokenize_path else (
            "token counts: estimate from characters corrected by usage")
        return (f"chat {self.base_url} ({s.kind or 'server kind unsaid'}; {scores}; continuation: {way} "
                f"({s.continuation_note}); {'server stop strings + stop rule' if s.vllm else 'stop rule on the stream'}; "
                f"{tokens}; cached tokens {'reported' if s.cached_tokens else 'not reported'}"
                f"{provenance_note(self.spec)})")

    @property
    def context_limit(self) -> int:
        return self._probe().context_limit or DEFAULT_CONTEXT_LIMIT

    def missing_token_scores(self) -> str | None:
        """None where replies carry per-token log-probabilities, else what is missing (one line)."""
        if self._probe().logprobs:
            return None
        return (f"the model server at {self.base_url} sends no chat log-probabilities for {self.spec!r} "
                "(choices[].logprobs.content[].top_logprobs)")

    # -- the Generator protocol ------------------------------------------------------------
    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int,
        on_token: Callable[[str], None] | None = None,
    ) -> Segment:
        server = self._probe()
        messages, extra, way, draft = self._request_messages(messages_of(prompt), server)
        body: dict[str, Any] = {"model": self.spec, "messages": messages, "max_tokens": max_new_tokens,
                                "stream": True, "stream_options": {"include_usage": True},
                                **self._sampling(), **extra}
        if server.logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        if server.vllm and (strings := _stop_strings(stop)):
            body.update(stop=strings, include_stop_str_in_output=True)
        if server.vllm and stop.keep:
            body["skip_special_tokens"] = False
        joins = way == "new_turn" and draft and not draft[-1].isspace()
        reply = ChatReply(space_before=bool(joins), scored=server.logprobs,
                          where=f"the model server at {self.base_url}/chat/completions")
        turn_ends = tuple(s for s in TEMPLATE_TOKENS if s not in stop.keep)  # a protocol's own tags stay
        end, finish, sent = None, reply.finish, 0
        events = stream_events(self._client, "/chat/completions", body)
        try:
            for event in events:
                reply.read(event)
                texts, logprobs = reply.answer_tokens()
                if way == "continue":
                    self._check_continued("".join(texts), draft)
                end, finish = _cut(reply, texts, logprobs, stop, turn_ends, max_new_tokens)
                upto = len(texts) if end is None else end
                if on_token is not None:
                    for piece in texts[sent:upto]:
                        if piece:
                            on_token(piece)  # may raise to abort (a client that went away)
                sent = max(sent, upto)
                if end is not None:
                    if server.vllm and finish == "stop":  # it stops on the same strings: its last event carries the usage
                        reply.read_usage_after(events, limit=4)
                    break  # closing the stream tells the server to stop
        finally:
            events.close()
        # the answer's first segment; one written again after passages may end at once (the
        # controller then keeps the segment it set aside)
        first = not any(piece.role in ("draft", "passages") for piece in prompt)
        return self._segment(reply, end, finish, way, messages, max_new_tokens, first)

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """One greedy helper reply (e.g. a query rewrite); reasoning is not part of it."""
        self._probe()
        where = f"the model server at {self.base_url}/chat/completions"
        body = {"model": self.spec, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_new_tokens, "temperature": 0.0}
        reply = read_event(read_json(self._client.request("POST", "/chat/completions", body).text, where), where)
        message = (choice_zero(reply, where) or {}).get("message") or {}  # choice 0 only, as when streamed
        text = message.get("content") or ""
        if not isinstance(text, str):
            raise ServerError(f"{where} sent the content {text!r} where a string belongs")
        return before_special(text[split_reasoning(text).start:], TEMPLATE_TOKENS).strip()

    def count_tokens(self, text: str) -> int:
        server = self._probe()
        if not server.tokenize_path or not text:
            return self.estimate.count(text)
        with self._lock:
            if text in self._counts:
                return self._counts[text]
        where = f"the model server at {self._root.base_url}{server.tokenize_path}"
        body = {"model": self.spec, server.tokenize_key: text}
        count = tokens_in(read_json(self._root.request("POST", server.tokenize_path, body).text, where))
        if count is None:
            raise ServerError(f"{where} sent no token count (count or tokens) for a text")
        with self._lock:
            if len(self._counts) > 8192:
                self._counts.clear()
            self._counts[text] = count
        return count

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return render_markup(messages, add_generation_prompt)

    def reset(self, seed: int | None = None) -> None:
        """A new question: its sampled requests are seeded from `seed`, one seed per request."""
        with self._lock:
            self._question_seed, self._requests = seed, 0

    def close(self) -> None:
        self._client.close()
        self._root.close()

    # -- internals -------------------------------------------------------------------------
    def _probe(self) -> ChatServer:
        with self._lock:
            if self._server is None:
                server = probe_server(self._client, self._root, self.spec, self.top_logprobs)
                if self.continuation == "continue" and server.continuation != "continue":
                    raise ServerError(f"the model server at {self.base_url} cannot continue an assistant "
                                      f"message: {server.continuation_note}; use generator.continuation: "
                                      "new_turn or auto")
                self._server = server
            return self._server

    def _way(self, server: ChatServer) -> str:
        return "new_turn" if self.continuation == "new_turn" else server.continuation

    def _request_messages(self, messages: list[dict[str, str]], server: ChatServer):
        """(messages to send, extra body fields, the way the draft is continued, the draft)."""
        if not messages or messages[-1]["role"] != "assistant":
            raise ServerError("the transcript does not end in an open assistant turn")
        draft = messages[-1]["content"]
        if not draft:
            return messages[:-1], {}, "", ""
        if self._way(server) == "continue":
            return messages, {"continue_final_message": True, "add_generation_prompt": False}, "continue", draft
        # the draft closes as an assistant turn and a user turn asks for the rest: roles keep
        # alternating, which some templates require
        turn = {"role": "user", "content": _CONTINUE_TURN[detect_language(draft)]}
        return [*messages, turn], {}, "new_turn", draft

    def _check_continued(self, answer: str, draft: str) -> None:
        """A server asked to continue the assistant message that starts the answer over instead."""
        head = " ".join(draft.split())[:24]
        if len(head) >= 24 and " ".join(answer.split()).startswith(head):
            raise ServerError(f"the model server at {self.base_url} dropped the assistant message it was "
                              "asked to continue (its reply starts the answer again); set "
                              "generator.continuation: new_turn")

    def _segment(self, reply: ChatReply, end: int | None, finish: str, way: str, messages: list,
                 max_new_tokens: int, first: bool) -> Segment:
        texts, logprobs = reply.answer_tokens()
        entropies = reply.answer_entropies()
        keep = len(texts) if end is None else end
        text = "".join(texts[:keep])
        reasoning = reply.reasoning_text()
        if not text.strip() and reasoning:
            raise ServerError(
                f"the model server at {self.base_url}/chat/completions ({self.spec}) wrote only reasoning "
                f"({len(reasoning)} characters) and no answer in {max_new_tokens} tokens; raise "
                "generator.max_segment_tokens or turn the model's thinking off")
        where = f"the model server at {self.base_url}/chat/completions"
        if first:
            check_not_empty(text, reply.finish, where)
        segment = Segment(text=text, tokens=texts[:keep], token_ids=[-1] * keep, logprobs=logprobs[:keep],
                          entropies=entropies[:keep], finish_reason=finish, reasoning=reasoning,
                          continuation=way)
        usage = reply.usage or {}
        prompt_len = usage_count(usage, "prompt_tokens", where)
        sent = render_markup(messages, True)
        if prompt_len is not None:
            self.estimate.correct(sent, prompt_len)
        cached = usage_count(usage.get("prompt_tokens_details") or {}, "cached_tokens", where,
                             "usage.prompt_tokens_details")
        segment.tokens_reused = cached
        segment.tokens_prefilled = (prompt_len if prompt_len is not None else self.estimate.count(sent)) - (cached or 0)
        return segment

    def _sampling(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"temperature": 0.0}
        with self._lock:
            self._requests += 1
            question, request = self._question_seed, self._requests
        seed = self.seed if question is None else _request_seed(question, request)
        return {"temperature": self.temperature, "top_p": self.top_p, **({"seed": seed} if seed is not None else {})}


def _cut(reply: ChatReply, texts: list[str], logprobs: list[float], stop: StopRule, turn_ends: tuple[str, ...],
         max_new_tokens: int) -> tuple[int | None, str]:
    """Where the segment ends now (tokens kept) and why, or (None, the reply's finish) to read on:
    the stop rule ("stop"); chat-template text the server wrote (its turn ended there); or the
    token cap a server that ignores `max_tokens` ran past ("length")."""
    special = special_cut(texts, turn_ends)
    if special is not None:
        texts, logprobs = texts[:special], logprobs[:special]
    end = segment_end(texts, logprobs, stop)
    if end is not None:
        return end, "stop"
    if special is not None:
        return special, "end_of_turn"
    if reply.over(max_new_tokens):
        return min(len(texts), max_new_tokens), "length"
    return None, reply.finish


def _request_seed(question_seed: int, request: int) -> int:
    """Independent seeds for (question seed, request number), as the completions backend draws them."""
    import numpy as np

    return int(np.random.SeedSequence((question_seed % 2**64, request)).generate_state(1)[0] >> 1)


def _stop_strings(stop: StopRule) -> list[str]:
    strings = [stop.marker_close] if stop.marker_close else []
    if stop.sentence:
        strings += [". ", "? ", "! ", ".\n"]
    return strings[:MAX_STOP_STRINGS]

