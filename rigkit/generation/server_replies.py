"""What an OpenAI-compatible model server sends, checked before rigkit reads it.

A server that answers something else than the protocol (an HTML page, a list where an object
belongs, a usage count that is no whole number, log-probabilities that do not line up with the
tokens or are not numbers, an empty completion where the answer starts) ends the call in one
`ServerError` line naming the server and what it sent, never in a `KeyError` or a silent guess.
Chat-template special-token text in a reply (`<|im_end|>...`, which a server that renders special
tokens sends) ends the turn there: it and what follows never reach the answer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.errors import InputError, UpstreamError

__all__ = ["ServerError", "TokenScores", "truncated_entropy", "read_json", "read_event", "served_models", "token_scores",
           "usage_count", "shown", "special_cut", "TEMPLATE_TOKENS", "before_special", "check_not_empty", "api_key_from_env"]


class ServerError(UpstreamError, ConnectionError):
    """The model server is unreachable, refuses the request, or does not serve the model."""


def shown(value: Any, limit: int = 120) -> str:
    """`value` as it arrived, short enough for one error line."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def read_json(text: str, where: str) -> Any:
    """The JSON value of a body or event; `where` names the server and URL ("the model server at ...").

    NaN and Infinity are not JSON: Python's parser accepts them, rigkit does not (-Infinity stays:
    an alternative token of probability 0 is checked where it stands)."""
    def refuse(constant: str) -> float:
        if constant == "-Infinity":
            return -math.inf
        raise ValueError(f"{constant} is not a JSON number")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as err:
        raise ServerError(f"{where} sent something that is not JSON ({err}): {shown(text)!r}") from None


def served_models(data: Any, where: str) -> list[dict]:
    """The model entries of a `/models` answer (`{"data": [{"id": ...}, ...]}`)."""
    entries = data.get("data") if isinstance(data, dict) else data
    if not isinstance(data, dict) or not isinstance(entries, list | None):
        raise ServerError(f"{where} sent {shown(data)!r} where an object {{\"data\": [models]}} belongs")
    for entry in entries or []:
        if not isinstance(entry, dict) or "id" not in entry:
            raise ServerError(f"{where} listed {shown(entry)!r} where a model object with an \"id\" belongs")
    return entries or []


def read_event(event: Any, where: str) -> dict:
    """One streamed completion event: an object whose `choices` are objects and `usage` an object."""
    if not isinstance(event, dict):
        raise ServerError(f"{where} sent the event {shown(event)!r} where an object belongs")
    if "error" in event:
        raise ServerError(f"{where} failed: {shown(event['error'], 300)}")
    choices = event.get("choices")
    if choices is not None and not (isinstance(choices, list) and all(isinstance(c, dict) for c in choices)):
        raise ServerError(f"{where} sent choices {shown(choices)!r} where a list of objects belongs")
    if event.get("usage") is not None and not isinstance(event["usage"], dict):
        raise ServerError(f"{where} sent usage {shown(event['usage'])!r} where an object belongs")
    return event


def usage_count(usage: dict | None, key: str, where: str, section: str = "usage") -> int | None:
    """A token count from `usage` (None when absent); anything but a whole number >= 0 is refused."""
    if usage is not None and not isinstance(usage, dict):
        raise ServerError(f"{where} sent {section} {shown(usage)!r} where an object belongs")
    value = (usage or {}).get(key)
    if value is None:
        return None
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 0:
        raise ServerError(f"{where} sent {section}.{key} = {shown(value)!r}, not a whole number of tokens")
    return int(value)


@dataclass
class TokenScores:
    """One choice's tokens with their log-probabilities (chosen, and the top-k per token)."""

    tokens: list[str]
    logprobs: list[float]
    tops: list[list[float]]


def token_scores(logprobs: Any, where: str) -> TokenScores:
    """The checked `logprobs` object of a completion choice: one number per token, all finite
    (an alternative in the top-k may be -inf: probability 0)."""
    if not isinstance(logprobs, dict):
        raise ServerError(f"{where} sent logprobs {shown(logprobs)!r} where an object belongs")
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    tops = logprobs.get("top_logprobs")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ServerError(f"{where} sent logprobs.tokens {shown(tokens)!r} where a list of strings belongs")
    values = [] if values is None else values
    if not isinstance(values, list) or len(values) != len(tokens):
        raise ServerError(f"{where} sent {len(tokens)} tokens but "
                          f"{len(values) if isinstance(values, list) else shown(values)!r} log-probabilities")
    tops = [None] * len(tokens) if tops is None else tops
    if not isinstance(tops, list) or len(tops) != len(tokens):
        raise ServerError(f"{where} sent {len(tokens)} tokens but top_logprobs {shown(tops)!r}")
    chosen = [_logprob(v, where, allow_minus_inf=False) for v in values]  # a None is no score, not p = 1
    top_values = []
    for top in tops:
        if top is not None and not isinstance(top, dict):
            raise ServerError(f"{where} sent the top-k {shown(top)!r} where an object belongs")
        top_values.append([_logprob(v, where, allow_minus_inf=True) for v in (top or {}).values() if v is not None])
    return TokenScores(tokens, chosen, top_values)


def _logprob(value: Any, where: str, allow_minus_inf: bool) -> float:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or math.isnan(number) or number == math.inf or (number == -math.inf and not allow_minus_inf):
        raise ServerError(f"{where} sent the log-probability {shown(value)!r}, not a finite number")
    return float(number)


# The special-token spellings of the common chat templates (ChatML, Llama 2 / 3, Gemma, Phi,
# Mistral, DeepSeek): a chat server has no tokenizer here to ask, and a reply holding one wrote
# past its turn's end.
TEMPLATE_TOKENS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|end|>", "<|user|>", "<|assistant|>",
                   "<|system|>", "</s>", "[INST]", "[/INST]", "<start_of_turn>", "<end_of_turn>",
                   "<\uff5cend\u2581of\u2581sentence\uff5c>")


def special_cut(texts: list[str], specials: tuple[str, ...] | list[str]) -> int | None:
    """How many of the tokens `texts` come before the first chat-template special-token string
    (`specials`, e.g. `<|im_end|>`), or None when there is none. The token where it starts is
    dropped whole, with the rest: the turn ended there (a string spread over tokens too)."""
    if not specials:
        return None
    text = "".join(texts)
    found = [i for i in (text.find(s) for s in specials) if i >= 0]
    if not found:
        return None
    at, seen = min(found), 0
    for i, piece in enumerate(texts):
        if seen + len(piece) > at:
            return i
        seen += len(piece)
    return len(texts)


def before_special(text: str, specials: tuple[str, ...] | list[str]) -> str:
    """`text` up to the first chat-template special-token string in it."""
    found = [i for i in (text.find(s) for s in specials) if i >= 0]
    return text[: min(found)] if found else text


def check_not_empty(text: str, finish: Any, where: str) -> None:
    """Refuse a completion with no text where the answer starts: no model means that as an answer."""
    if not text.strip():
        raise ServerError(f"{where} sent an empty completion ({shown(text)!r}, finish_reason "
                          f"{shown(finish)!r}) where the answer starts")


def truncated_entropy(top_logprobs: Sequence[float]) -> float:
    """Entropy (nats) estimated from the top-k log-probabilities of one step.

    `-sum p log p` over the top-k plus `-r log r` for the mass `r` outside them: a lower bound of
    the true entropy (the tail, spread over many tokens, contributes at least `-r log r`).
    """
    probs = [math.exp(v) for v in top_logprobs if v is not None and math.isfinite(v)]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    rest = 1.0 - sum(probs)
    if rest > 1e-9:
        entropy -= rest * math.log(rest)
    return max(0.0, entropy)


def api_key_from_env(name: str | None) -> str | None:
    """The model server's key from the environment variable `generator.api_key_env` names; None
    when it names none, one line when the variable is not set."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise InputError(f"environment variable {name} (generator.api_key_env) is not set")
    return key
