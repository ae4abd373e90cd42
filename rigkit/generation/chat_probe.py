"""What a chat server can do, asked once with a few one-token requests before the first answer.

- `/models`: the model is served (else one line listing what is), the server's kind (`owned_by`:
  vllm, sglang, llamacpp...) and its context window where it says (vLLM's `max_model_len`).
- Log-probabilities: a chat reply with `logprobs: true, top_logprobs: k` carries
  `choices[0].logprobs.content[i].top_logprobs`, or the server has none for rigkit's deciders.
- Continuing an assistant message: three prompts are counted by the server (`usage.prompt_tokens`):
  the user turn alone (A), plus a final assistant message sent with `continue_final_message: true,
  add_generation_prompt: false` (B), and the same message with a fresh generation prompt (C).
  B == C: the server closed the message and opened a new turn (it ignores the request); B == A:
  it dropped the message; otherwise (B above A, below C) it continues the message as sent.
- `/tokenize`: vLLM's (`POST /tokenize {model, prompt}` beside `/v1`), llama.cpp's C++ server
  (`POST /tokenize {content}`), llama-cpp-python's (`POST /extras/tokenize {input}`).
- Cached prompt tokens: whether replies carry `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rigkit.generation.server_replies import ServerError, read_json, served_models, usage_count
from rigkit.http import ServerClient

__all__ = ["ChatServer", "probe_server", "UNSUPPORTED"]

UNSUPPORTED = (400, 404, 405, 422, 501)  # the server refuses a field or has no such route
_ASK = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
_PREFIX = {"role": "assistant", "content": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}


@dataclass
class ChatServer:
    """What the probe found."""

    url: str
    models: list[str]
    kind: str  # owned_by of the served model, lower case ("vllm", "llamacpp", "" when unsaid)
    context_limit: int | None = None
    logprobs: bool = False
    continuation: str = "new_turn"  # continue | new_turn
    continuation_note: str = ""  # why, in a few words
    tokenize_path: str | None = None  # the tokenize route beside /v1, None when there is none
    tokenize_key: str = ""  # the text's key in its body
    cached_tokens: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def vllm(self) -> bool:
        return self.kind == "vllm"


def probe_server(api: ServerClient, root: ServerClient, model: str, top_logprobs: int) -> ChatServer:
    """Ask the server at `api` (its `/v1`) and `root` (the same host, no path) what it can do."""
    where = f"the model server at {api.base_url}/models"
    data = served_models(read_json(api.request("GET", "/models").text, where), where)
    names = [str(m.get("id")) for m in data]
    if names and model not in names:
        raise ServerError(f"model {model!r} is not served at {api.base_url}; it serves: {', '.join(names)} "
                          "(name one with --model)")
    entry = next((m for m in data if m.get("id") == model), {})
    limit = entry.get("max_model_len")
    server = ChatServer(api.base_url, names, str(entry.get("owned_by") or "").lower(),
                        context_limit=limit if isinstance(limit, int) and limit > 0 else None)
    reply = _chat(api, model, {"messages": _ASK, "logprobs": True, "top_logprobs": top_logprobs}, allow_refusal=True)
    if reply is not None:
        content = ((reply.get("choices") or [{}])[0].get("logprobs") or {}).get("content")
        server.logprobs = bool(content) and isinstance(content[0], dict) and bool(content[0].get("top_logprobs"))
        details = (reply.get("usage") or {}).get("prompt_tokens_details")
        server.cached_tokens = isinstance(details, dict) and "cached_tokens" in details
    server.continuation, server.continuation_note = _continuation(api, model)
    server.tokenize_path, server.tokenize_key = _tokenizer_route(root, model)
    return server


def _chat(api: ServerClient, model: str, body: dict, allow_refusal: bool = False) -> dict | None:
    """One non-streamed one-token chat reply; None where the server refuses the request's fields."""
    where = f"the model server at {api.base_url}/chat/completions"
    try:
        text = api.request("POST", "/chat/completions",
                           {"model": model, "max_tokens": 1, "temperature": 0.0, **body}).text
    except ServerError as err:
        if allow_refusal and err.status in UNSUPPORTED:
            return None
        raise
    reply = read_json(text, where)
    if not isinstance(reply, dict):
        raise ServerError(f"{where} sent {text[:120]!r} where a chat completion object belongs")
    return reply


def _prompt_tokens(api: ServerClient, model: str, body: dict) -> int | None:
    reply = _chat(api, model, body, allow_refusal=True)
    if reply is None:
        return None
    return usage_count(reply.get("usage"), "prompt_tokens", f"the model server at {api.base_url}/chat/completions")


def _continuation(api: ServerClient, model: str) -> tuple[str, str]:
    alone = _prompt_tokens(api, model, {"messages": _ASK})
    cont = _prompt_tokens(api, model, {"messages": [*_ASK, _PREFIX], "continue_final_message": True,
                                       "add_generation_prompt": False})
    fresh = _prompt_tokens(api, model, {"messages": [*_ASK, _PREFIX]})
    if None in (alone, cont, fresh):
        return "new_turn", "the server does not count prompt tokens or refused continue_final_message"
    if cont == alone:
        return "new_turn", "the server drops a final assistant message"
    if cont >= fresh:
        return "new_turn", "the server closes a final assistant message and opens a new turn"
    return "continue", "the server continues a final assistant message (continue_final_message)"


def _tokenizer_route(root: ServerClient, model: str) -> tuple[str | None, str]:
    """The first tokenize route that counts a test text: its path and the text's key."""
    for path, key in (("/tokenize", "prompt"), ("/tokenize", "content"), ("/extras/tokenize", "input")):
        try:
            reply = read_json(root.request("POST", path, {"model": model, key: "one two three"}).text, path)
        except ServerError:
            continue
        if tokens_in(reply) is not None:
            return path, key
    return None, ""


def tokens_in(reply: Any) -> int | None:
    """The token count of a tokenize reply (`count`, or the length of `tokens`), else None."""
    if not isinstance(reply, dict):
        return None
    count = reply.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = reply.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None
