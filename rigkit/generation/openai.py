"""A served model as the generator: any OpenAI-compatible `/v1/completions` endpoint.

vLLM, SGLang, llama.cpp's server and the like do the batching and the prefix caching; rigkit
keeps the transcript. The chat template is rendered here with the model's own tokenizer, and
each segment continues the open assistant turn as a plain completion, so the server never
re-renders the conversation. Concessions, each recorded in `source` (and so in every result):
- Prompts are token ids where the server takes them (vLLM: text is never re-tokenised
  differently), else text (llama.cpp's server takes only strings). Which one is probed once.
  A text prompt is tokenised by the server with special tokens parsed anywhere, so the
  special-token strings in its data (passages, the question) are broken up first
  (`rigkit.generation.text_prompts`): passages stay data, as in-process.
- The stop rule is the in-process one (`find_stop`) applied to the streamed text, cutting at the
  first match and closing the stream, so both backends split an answer at the same places.
  Stop strings (at most 4: OpenAI's limit) go to the server only where it keeps them in the
  output (vLLM's `include_stop_str_in_output`); a server that strips them would drop the very
  token the stop rule keeps.
- Per-token log-probabilities come from `logprobs` top-k (default 20, vLLM's default cap):
  the chosen token's log-probability is exact; the entropy is a truncated estimate from the
  top-k, `-sum p log p - r log r` with `r` the mass outside the top-k (a lower bound of the
  true entropy).
- Prefix reuse happens on the server: `usage.prompt_tokens_details.cached_tokens` becomes
  `tokens_reused` when the server reports it, else `None` ("unknown", not 0).
- `on_token` gets each token's text as the stream delivers it, never past the stop rule's cut.
- A server is not believed further than the protocol: only choice 0 is read (rigkit asks for
  one); text without its log-probabilities, or more scored tokens than the text has bytes, ends
  the call in one line naming the server (every decider reads the tokens from them); and a
  server that ignores `max_tokens` is cut on this side, its stream closed.
- Marker tags that are special tokens (`StopRule.keep`, e.g. R1-Searcher's `<|begin_of_search|>`)
  must survive decoding. vLLM sends token ids, decoded here with those tags kept, and is asked
  for `skip_special_tokens: false` so its stop strings see them; SGLang is asked the same. Other
  servers (llama.cpp's) decide themselves whether special tokens reach the text: where the
  tokenizer makes a kept tag a special token, `source` says they may be dropped, and a protocol
  with word tags (`<search>`) is the safe choice there.
No attentions or hidden states: the generator does not satisfy `SupportsAttention` /
`SupportsHiddenStates`, and deciders that need them refuse it when they are built.

Thread safety: one instance may serve several threads at once (e.g. concurrent evaluation).
The HTTP client is thread-safe and each call keeps its state on the stack; the tokenizer, its
piece cache and the one-time server probe sit behind a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rigkit.config import DEFAULT_CONTEXT_LIMIT, GeneratorConfig
from rigkit.errors import InputError
from rigkit.generation.chat_stream import choice_zero, stream_events
from rigkit.generation.openai_stream import (
    Server,
    StreamedTokens,
    probe_server,
    stop_strings,
    usage_after,
)
from rigkit.generation.served_tokenizer import load_tokenizer
from rigkit.generation.server_replies import (
    ServerError,
    api_key_from_env,
    before_special,
    check_not_empty,
    read_event,
    read_json,
    special_cut,
    truncated_entropy,
    usage_count,
)
from rigkit.generation.stops import segment_end
from rigkit.generation.text_prompts import neutralize_special_tokens, special_strings, text_prompt
from rigkit.http import ServerClient
from rigkit.trace import Segment
from rigkit.transcript import (
    Piece,
    PieceTokens,
    StopRule,
    encode_transcript,
    kept_tag_ids,
)

if TYPE_CHECKING:
    from rigkit.config import GeneratorConfig

__all__ = ["OpenAIGenerator", "ServerError", "load_tokenizer", "truncated_entropy"]


class OpenAIGenerator:
    """A model behind an OpenAI-compatible server, continuing rigkit's transcript segment by segment."""

    # the served model's own window is not asked for: runs budget for the common default
    context_limit = DEFAULT_CONTEXT_LIMIT

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        top_logprobs: int = GeneratorConfig.top_logprobs,
        temperature: float = GeneratorConfig.temperature,
        top_p: float = GeneratorConfig.top_p,
        seed: int | None = None,
        timeout: float = GeneratorConfig.request_timeout,
        max_retries: int = GeneratorConfig.max_retries,
        backoff: float = 0.5,
        prompt_format: str = "auto",
        transport: Any = None,
    ):
        if prompt_format not in ("auto", "tokens", "text"):
            raise InputError(f"prompt_format must be auto, tokens or text, not {prompt_format!r}")
        if top_logprobs < 1:
            raise InputError(f"top_logprobs must be >= 1, got {top_logprobs}")
        self.base_url = base_url.rstrip("/")
        self.spec, self.tokenizer = model, tokenizer
        self.top_logprobs, self.temperature, self.top_p, self.seed = top_logprobs, temperature, top_p, seed
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.prompt_format = prompt_format
        self._client = ServerClient(self.base_url, name="model server", error=ServerError, api_key=api_key,
                                    timeout=timeout, retries=max_retries, backoff=backoff, transport=transport)
        self._lock = threading.Lock()
        self._server: Server | None = None
        self._piece_tokens = PieceTokens(tokenizer)  # scaffold text, tokenised once
        self._special_tags_at_risk = False  # kept tags are special tokens the server may skip
        self._question_seed: int | None = None  # set by reset(): one question's sampled requests
        self._requests = 0
        self._specials = special_strings(tokenizer)  # broken up in the data of text prompts
        self.eos_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    @classmethod
    def from_config(cls, config: GeneratorConfig, transport: Any = None) -> OpenAIGenerator:
        """Built from `generator:` in a run config (`backend: openai`)."""
        if not config.base_url:
            raise InputError("backend openai needs generator.base_url (e.g. http://127.0.0.1:8000/v1)")
        api_key = api_key_from_env(config.api_key_env)
        tokenizer = load_tokenizer(config.tokenizer or config.model, config.trust_remote_code)
        return cls(
            config.base_url, config.model, tokenizer, api_key=api_key, top_logprobs=config.top_logprobs,
            temperature=config.temperature, top_p=config.top_p, seed=config.seed,
            timeout=config.request_timeout, max_retries=config.max_retries, transport=transport,
        )

    @property
    def source(self) -> str:
        """How this backend produced its numbers, for the result's `model.source`."""
        from rigkit.models.registry import provenance_note

        server = self._server
        prompts = "?" if server is None else "token-id prompts" if self._token_prompts(server) else (
            "text prompts, special-token strings in passages and questions broken up")
        stops = "?" if server is None else "server stop strings + stop rule" if server.vllm else "stop rule on the stream"
        tags = "; special-token marker tags may be dropped by this server" if self._special_tags_at_risk else ""
        return (
            f"openai-compatible {self.base_url} ({prompts}; {stops}; logprobs top-{self.top_logprobs}; "
            f"entropy: truncated top-{self.top_logprobs} estimate{tags}{provenance_note(self.spec)})"
        )

    # -- the Generator protocol ------------------------------------------------------------
    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int,
        on_token: Callable[[str], None] | None = None,
    ) -> Segment:
        server = self._probe()
        ids = self.encode(prompt)
        tokens = self._token_prompts(server)
        body: dict[str, Any] = {
            "model": self.spec,
            "prompt": ids if tokens else text_prompt(prompt, self._specials),
            "max_tokens": max_new_tokens,
            "logprobs": self.top_logprobs,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._sampling(),
        }
        if server.vllm:
            body.update(return_tokens_as_token_ids=True, include_stop_str_in_output=True,
                        skip_special_tokens=False)
            if strings := stop_strings(stop):
                body["stop"] = strings
        elif server.sglang and stop.keep:
            body["skip_special_tokens"] = False
        elif stop.keep and kept_tag_ids(self.tokenizer, stop):
            self._special_tags_at_risk = True  # no way to ask this server: said in `source`
        finish, usage, end, sent, reason = "length", None, None, 0, None
        turn_ends = tuple(s for s in self._specials if s not in stop.keep)  # leaked template tokens
        where = f"the model server at {self.base_url}/completions"
        got = StreamedTokens(self.tokenizer, self._piece_tokens, self._lock, server.vllm,
                             kept_tag_ids(self.tokenizer, stop) if server.vllm else frozenset(), where)
        texts = got.texts
        events = self._stream("/completions", body)
        try:
            for chunk in events:
                usage = chunk.get("usage") or usage
                choice = choice_zero(chunk, where)  # others a server weaves in never reach the answer
                if choice is not None:
                    got.read(choice)
                    if choice.get("finish_reason"):
                        reason = choice["finish_reason"]
                        finish = "end_of_turn" if reason == "stop" else "length"
                capped = got.over(max_new_tokens)
                if capped:  # a server that ignores max_tokens: cut here, its stream closed below
                    got.cut(max_new_tokens)
                    finish = reason = "length"
                special = special_cut(texts, turn_ends)
                if special is not None:  # the server wrote a turn's end as text: the answer ends before it
                    got.cut(special)
                    finish = reason = "end_of_turn"
                end = segment_end(texts, got.logprobs, stop)
                if on_token is not None:
                    upto = len(texts) if end is None else end
                    for piece in texts[sent:upto]:
                        if piece:
                            on_token(piece)  # may raise to abort (a client that went away)
                    sent = max(sent, upto)
                if end is None and (special is not None or capped):
                    break  # closing the stream tells the server to stop
                if end is not None:
                    if server.vllm:  # it stops on the same strings: its last event carries the usage
                        usage = usage_after(events, limit=4) or usage
                    break  # closing the stream tells the server to stop
        finally:
            events.close()
        keep = len(texts)
        if end is not None:
            finish, keep = "stop", end
        elif finish == "end_of_turn" and got.token_ids and got.token_ids[-1] in self.eos_token_ids:
            keep -= 1  # vLLM sends the end-of-turn token too; as in-process, it is not the answer's
        segment = Segment(
            text="".join(texts[:keep]), tokens=texts[:keep], token_ids=got.token_ids[:keep],
            logprobs=got.logprobs[:keep], entropies=got.entropies[:keep], finish_reason=finish,
        )
        # the answer's first segment; a segment written again after passages (regenerate) may end at
        # once: the controller keeps the one it set aside
        if not any(piece.role in ("draft", "passages") for piece in prompt):
            check_not_empty(segment.text, reason, where)
        cached = usage_count((usage or {}).get("prompt_tokens_details") or {}, "cached_tokens", where,
                             "usage.prompt_tokens_details")
        prompt_len = usage_count(usage, "prompt_tokens", where)
        if prompt_len is None:  # the server did not say: count what it was sent, as it tokenises it
            prompt_len = len(ids) if tokens else self._text_tokens(body["prompt"])
        segment.tokens_reused = cached
        segment.tokens_prefilled = prompt_len - (cached or 0)
        return segment

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """One greedy helper reply (e.g. a query rewrite) through the same completions endpoint."""
        self._probe()
        content = neutralize_special_tokens(prompt, self._specials)  # sent as text: the server parses it
        text = self.render_chat([{"role": "user", "content": content}], add_generation_prompt=True)
        body = {"model": self.spec, "prompt": text, "max_tokens": max_new_tokens, "temperature": 0.0}
        where = f"the model server at {self.base_url}/completions"
        reply = read_event(read_json(self._client.request("POST", "/completions", body).text, where), where)
        text = (choice_zero(reply, where) or {}).get("text", "")
        if not isinstance(text, str):
            raise ServerError(f"{where} sent the text {text!r} where a string belongs")
        return before_special(text, self._specials).strip()

    def count_tokens(self, text: str) -> int:
        return len(self._piece_tokens(text))

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        with self._lock:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )

    def encode(self, prompt: Sequence[Piece]) -> list[int]:
        """Token ids of the prompt: generated pieces verbatim, text pieces tokenised locally."""
        return encode_transcript(prompt, self.tokenizer, self._piece_tokens)

    def close(self) -> None:
        self._client.close()

    def _text_tokens(self, text: str) -> int:
        """Tokens a text-prompt server reads in `text`: the whole string tokenised with special
        tokens parsed, as such a server does (not the sum of the pieces' own counts)."""
        with self._lock:
            return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def reset(self, seed: int | None = None) -> None:
        """A new question: its sampled requests are seeded from `seed`, a seed per request in order,
        so a sampled run repeats exactly and each run of `rigkit eval --runs N` samples anew."""
        with self._lock:
            self._question_seed, self._requests = seed, 0

    def _sampling(self) -> dict[str, Any]:
        if self.temperature <= 0:
            return {"temperature": 0.0}
        seed = self._request_seed()
        extra = {"seed": seed} if seed is not None else {}
        return {"temperature": self.temperature, "top_p": self.top_p, **extra}

    def _request_seed(self) -> int | None:
        with self._lock:
            if self._question_seed is None:
                return self.seed
            self._requests += 1
            request = self._requests
        # Independent streams for (question seed, request number): the same seed on every round
        # would replay one random stream, and seed + n would hand run r's second round run r+1's first.
        import numpy as np

        return int(np.random.SeedSequence((self._question_seed % 2**64, request)).generate_state(1)[0] >> 1)

    def _token_prompts(self, server: Server) -> bool:
        return self.prompt_format == "tokens" or (self.prompt_format == "auto" and server.vllm)

    # -- HTTP ------------------------------------------------------------------------------
    def _probe(self) -> Server:
        """Once: list the served models, check ours is among them, and learn the server kind."""
        with self._lock:
            if self._server is None:
                self._server = probe_server(self._client, self.base_url, self.spec)
            return self._server

    def _stream(self, path: str, body: dict) -> Iterator[dict]:
        """Parsed server-sent events of a streamed completion, until `[DONE]` or the caller stops."""
        return stream_events(self._client, path, body)
