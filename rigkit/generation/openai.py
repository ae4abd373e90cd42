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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rigkit.config import DEFAULT_CONTEXT_LIMIT, GeneratorConfig
from rigkit.errors import InputError
from rigkit.generation.chat_stream import MAX_TOKEN_CHARS, choice_zero, stream_events
from rigkit.generation.server_replies import (
    ServerError,
    api_key_from_env,
    before_special,
    check_not_empty,
    read_event,
    read_json,
    served_models,
    shown,
    special_cut,
    token_scores,
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
    decode_keeping,
    encode_transcript,
    kept_tag_ids,
)

if TYPE_CHECKING:
    from rigkit.config import GeneratorConfig

__all__ = ["OpenAIGenerator", "ServerError", "truncated_entropy"]

MAX_STOP_STRINGS = 4


@dataclass
class _Server:
    """What the one-time probe of `/models` found."""

    models: list[str]
    vllm: bool  # vLLM takes token-id prompts, returns token ids and keeps stop strings on request
    sglang: bool = False  # SGLang takes `skip_special_tokens` (text back, not token ids)


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
        self._server: _Server | None = None
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
            if strings := _stop_strings(stop):
                body["stop"] = strings
        elif server.sglang and stop.keep:
            body["skip_special_tokens"] = False
        elif stop.keep and kept_tag_ids(self.tokenizer, stop):
            self._special_tags_at_risk = True  # no way to ask this server: said in `source`
        texts, token_ids, logprobs, entropies = [], [], [], []
        finish, usage, end, sent, reason = "length", None, None, 0, None
        turn_ends = tuple(s for s in self._specials if s not in stop.keep)  # leaked template tokens
        keep = kept_tag_ids(self.tokenizer, stop) if server.vllm else frozenset()  # marker tags as text
        where = f"the model server at {self.base_url}/completions"
        events = self._stream("/completions", body)
        try:
            for chunk in events:
                usage = chunk.get("usage") or usage
                choice = choice_zero(chunk, where)  # others a server weaves in never reach the answer
                if choice is not None:
                    self._read_choice(choice, server, keep, texts, token_ids, logprobs, entropies)
                    if choice.get("finish_reason"):
                        reason = choice["finish_reason"]
                        finish = "end_of_turn" if reason == "stop" else "length"
                capped = _over(texts, max_new_tokens)
                if capped:  # a server that ignores max_tokens: cut here, its stream closed below
                    n = max_new_tokens
                    del texts[n:], token_ids[n:], logprobs[n:], entropies[n:]
                    finish = reason = "length"
                special = special_cut(texts, turn_ends)
                if special is not None:  # the server wrote a turn's end as text: the answer ends before it
                    del texts[special:], token_ids[special:], logprobs[special:], entropies[special:]
                    finish = reason = "end_of_turn"
                end = segment_end(texts, logprobs, stop)
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
                        usage = _usage_after(events, limit=4) or usage
                    break  # closing the stream tells the server to stop
        finally:
            events.close()
        keep = len(texts)
        if end is not None:
            finish, keep = "stop", end
        elif finish == "end_of_turn" and token_ids and token_ids[-1] in self.eos_token_ids:
            keep -= 1  # vLLM sends the end-of-turn token too; as in-process, it is not the answer's
        segment = Segment(
            text="".join(texts[:keep]), tokens=texts[:keep], token_ids=token_ids[:keep],
            logprobs=logprobs[:keep], entropies=entropies[:keep], finish_reason=finish,
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

    # -- reading a streamed choice ---------------------------------------------------------
    def _read_choice(self, choice: dict, server: _Server, keep: frozenset[int], texts: list,
                     token_ids: list, logprobs: list, entropies: list) -> None:
        where = f"the model server at {self.base_url}/completions"
        lp, text = choice.get("logprobs"), choice.get("text")
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        if not tokens:  # the answer is read from the scored tokens: text without them would be lost
            if text:
                raise ServerError(
                    f"{where} sent the text {shown(text)!r} without log-probabilities "
                    "(choices[0].logprobs.tokens); rigkit reads every token from them (llama.cpp's "
                    "server: start it with --logits_all true)"
                )
            return
        scores = token_scores(lp, where)
        tokens = scores.tokens
        # each token holds a byte at least; up to 3 bytes of a character split across tokens may
        # come in the next chunk's text (vLLM holds them back)
        if len(tokens) > 3 + (len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0):
            raise ServerError(f"{where} sent {len(tokens)} token scores for the text {shown(text or '')!r}: "
                              "they do not line up with its tokens (each token holds at least one byte)")
        if server.vllm:
            new_ids = [_token_id(t) for t in tokens]
            texts.extend(self._texts_of(token_ids, new_ids, keep))
            token_ids.extend(new_ids)
        else:
            texts.extend(tokens)
            token_ids.extend(self._id_of(t) for t in tokens)
        logprobs.extend(scores.logprobs)
        entropies.extend(truncated_entropy(top) for top in scores.tops)

    def _texts_of(self, before: list[int], new_ids: list[int], keep: frozenset[int]) -> list[str]:
        """Per-token text of `new_ids` following `before` (multi-byte safe, like the HF backend)."""
        with self._lock:
            head = decode_keeping(self.tokenizer, before, keep)
            out = []
            for i in range(len(new_ids)):
                text = decode_keeping(self.tokenizer, before + new_ids[: i + 1], keep)
                if text.endswith("\ufffd"):
                    out.append("")
                    continue
                out.append(text[len(head):])
                head = text
            return out

    def _text_tokens(self, text: str) -> int:
        """Tokens a text-prompt server reads in `text`: the whole string tokenised with special
        tokens parsed, as such a server does (not the sum of the pieces' own counts)."""
        with self._lock:
            return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _id_of(self, token_text: str) -> int:
        """A text-mode token's id, re-tokenised locally (the server only sent its text)."""
        ids = self._piece_tokens(token_text)
        return ids[0] if ids else (self.tokenizer.unk_token_id or 0)

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

    def _token_prompts(self, server: _Server) -> bool:
        return self.prompt_format == "tokens" or (self.prompt_format == "auto" and server.vllm)

    # -- HTTP ------------------------------------------------------------------------------
    def _probe(self) -> _Server:
        """Once: list the served models, check ours is among them, and learn the server kind."""
        with self._lock:
            if self._server is None:
                where = f"the model server at {self.base_url}/models"
                data = served_models(read_json(self._client.request("GET", "/models").text, where), where)
                names = [str(m.get("id")) for m in data]
                if names and self.spec not in names:
                    raise ServerError(
                        f"model {self.spec!r} is not served at {self.base_url}; it serves: {', '.join(names)}"
                    )
                owner = str(next((m.get("owned_by") for m in data if m.get("id") == self.spec), "")).lower()
                self._server = _Server(names, vllm=owner == "vllm", sglang=owner == "sglang")
            return self._server

    def _stream(self, path: str, body: dict) -> Iterator[dict]:
        """Parsed server-sent events of a streamed completion, until `[DONE]` or the caller stops."""
        return stream_events(self._client, path, body)


def load_tokenizer(name: str, trust_remote_code: bool = GeneratorConfig.trust_remote_code) -> Any:
    """The served model's tokenizer by hub name or path; the default short name stays offline."""
    from rigkit.generation.default_model import DEFAULT_MODEL, default_tokenizer

    if name.lower() == DEFAULT_MODEL:
        return default_tokenizer()
    from transformers import AutoTokenizer

    from rigkit.models.registry import MODELS

    if name.lower() in MODELS:
        return _offline_tokenizer(MODELS[name.lower()])

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise InputError(
            f"cannot load the tokenizer {name!r} ({type(err).__name__}); name the served model's tokenizer "
            "with generator.tokenizer (a hub id or a local folder)"
        ) from None


def _over(texts: list[str], max_tokens: int) -> bool:
    """More tokens than asked for, or more text than they could spell (`MAX_TOKEN_CHARS` each)."""
    return len(texts) > max_tokens or sum(map(len, texts)) > max_tokens * MAX_TOKEN_CHARS


def _offline_tokenizer(model: Any) -> Any:
    """An offline model's tokenizer: its converted copy's, else read from its installed GGUF."""
    from transformers import AutoTokenizer

    from rigkit.models.install import converted_dir, require_installed

    converted = converted_dir(model)
    if (converted / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(converted))
    gguf = require_installed(model, f"{model.name}'s tokenizer")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _stop_strings(stop: StopRule) -> list[str]:
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


def _usage_after(events: Iterator[dict], limit: int) -> dict | None:
    """The usage event that ends a stream, read past at most `limit` further token events."""
    for chunk in events:
        if chunk.get("usage"):
            return chunk["usage"]
        limit -= 1
        if limit < 0:
            return None
    return None

