"""Request bodies as pydantic models: wrong types become a 422 that names the field.

Unknown fields are ignored, as OpenAI's API does, so clients sending newer fields still work.
Whatever passes validation can be answered: no NaN or infinity, text is valid Unicode (a lone
surrogate cannot be encoded, so it would fail deep inside the run), integers fit in 64 bits, and
a question or query that is empty once invisible characters are removed is refused.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = [
    "Options",
    "ChatRequest",
    "ChatCompletionRequest",
    "Message",
    "RetrieveRequest",
    "AskParams",
    "SearchParams",
    "MAX_QUERIES",
    "lone_surrogate_at",
    "history_too_large",
    "MAX_HISTORY_TURNS",
    "MAX_HISTORY_BYTES",
    "RequestError",
]

MAX_HISTORY_TURNS = 256  # earlier (question, answer) pairs in one request
MAX_HISTORY_BYTES = 262_144  # their text, UTF-8: what one request may make the server tokenise and fit
MAX_QUERIES = 256  # queries in one /retrieve or rig.search call, so one request cannot hold the searcher long
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # int64: what torch and OpenAI-compatible servers take


class RequestError(ValueError):
    """A request that is well-typed but unusable; `param` names the field (HTTP 422)."""

    def __init__(self, message: str, param: str, status: int = 422, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """Where in `value` (a JSON value) a string holds a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"{path or 'the text'} (character {err.start})"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        found = lone_surrogate_at(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def history_too_large(history: list[tuple[str, str]]) -> str | None:
    """Why `history` is over the bounds one request may bring (answered 413), or None."""
    if len(history) > MAX_HISTORY_TURNS:
        return (f"history: {len(history)} earlier turns, over the limit of {MAX_HISTORY_TURNS}; send the "
                f"newest {MAX_HISTORY_TURNS} (older ones would be summarised or dropped anyway)")
    size = sum(len(q.encode("utf-8", "surrogatepass")) + len(a.encode("utf-8", "surrogatepass")) for q, a in history)
    if size > MAX_HISTORY_BYTES:
        return (f"history: {size} bytes of earlier turns, over the limit of {MAX_HISTORY_BYTES}; "
                "send fewer or shorter turns")
    return None


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(a) for a in typing.get_args(annotation))


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any, info: ValidationInfo) -> Any:
        # a nested request model checks its own fields (so the error names the innermost one)
        nested = _holds_model(cls.model_fields[info.field_name].annotation) if info.field_name else False
        probe = [v for v in value if not isinstance(v, dict)] if nested and isinstance(value, list) else value
        if nested and isinstance(value, dict):
            return value
        found = lone_surrogate_at(probe)
        if found:
            raise ValueError(f"a lone surrogate in {found}: text must be valid Unicode (UTF-8)")
        return value


class Options(_Body):
    """Sampling and loop settings for one request (`options` in every endpoint)."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: Seed | None = None
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_rounds: int | None = Field(None, ge=0, le=32)
    top_k: int | None = Field(None, ge=1, le=100)
    decider: str | None = None
    threshold: float | None = None

    @field_validator("decider")
    @classmethod
    def _known_decider(cls, name: str | None) -> str | None:
        from rigkit.deciders import check_decider_name

        return None if name is None else _as_validation(check_decider_name, name)


def _non_empty(value: str) -> str:
    from rigkit.text import check_question

    return _as_validation(check_question, value)


def _as_validation(check, value, *args):
    """`check(value)`, its InputError raised as the plain ValueError pydantic reports as a 422."""
    from rigkit.errors import InputError

    try:
        return check(value, *args)
    except InputError as err:
        raise ValueError(str(err)) from None


def _check_query_text(query: str, what: str = "the query") -> str:
    from rigkit.text import check_question

    return check_question(query, what)


# metadata filters: {"key": value | [values] | {"gte": ..}} or ["key>=N", ...] (rigkit.retrieval.filters)
FilterSpec = dict[str, Any] | list[Any] | str | None


def _filters_given(filters: FilterSpec) -> FilterSpec:
    from rigkit.retrieval.filters import parse_filters

    _as_validation(parse_filters, filters)
    return filters


def _queries_asked(queries: list[str] | None) -> list[str] | None:
    for i, query in enumerate(queries or ()):
        _as_validation(_check_query_text, query, f"query {i}")
    return queries


class ChatRequest(_Body):
    """`POST /chat`: the RIG service's own shape."""

    question: str
    history: list[tuple[str, str]] = Field(default_factory=list)  # (question, answer) pairs
    options: Options = Field(default_factory=Options)
    stream: bool = False
    # a conversation kept on the server: "new" starts one, its id (in the reply) continues it
    conversation: str | None = Field(None, min_length=1, max_length=64)

    _check_question = field_validator("question")(_non_empty)


class TextPart(_Body):
    type: str = "text"
    text: str = ""


class FunctionCall(_Body):
    name: str
    arguments: str = ""


class ToolCall(_Body):
    id: str
    type: str = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content if part.type == "text")
        return self.content or ""


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Body):
    include_usage: bool = False


class ChatCompletionRequest(_Body):
    """`POST /v1/chat/completions`: OpenAI's shape, plus `turns` and `options`."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    turns: int | None = Field(None, ge=0, le=32)  # the cap on tool rounds
    # a conversation kept on the server: "new" starts one, its id (in the reply) continues it
    conversation: str | None = Field(None, min_length=1, max_length=64)
    stop: str | list[str] | None = None
    options: Options = Field(default_factory=Options)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(None, ge=1, le=8192)
    seed: Seed | None = None
    # OpenAI fields rigkit does not do: refused by name rather than ignored
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError(f"n={n}: rigkit answers with one choice per request; send n=1 (or several requests)")
        return n

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(f"{info.field_name} is not supported: a RIG answer's tokens come from several "
                             "rounds; the per-round decider scores are in the response's `rig.rounds`")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if choice in (None, "auto", "none"):
            return choice
        raise ValueError(f"tool_choice {choice!r} is not supported: rigkit calls `search` when its decider "
                         "finds a need; send 'auto' or 'none'")

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class RetrieveRequest(_Body):
    """`POST /retrieve`: Search-R1's retrieval-server request (`search_r1/search/retrieval_server.py`)."""

    queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
    topk: int = Field(3, ge=1, le=100)
    return_scores: bool = False  # Search-R1's flag: each hit as {"document": ..., "score": s}
    filters: FilterSpec = None  # rigkit's: only chunks whose metadata passes (docs/retrieval.md)
    source: str | None = Field(None, max_length=64)  # rigkit's: the knowledge base to search (retrieval.sources)

    _check_queries = field_validator("queries")(_queries_asked)
    _check_filters = field_validator("filters")(_filters_given)


class AskParams(_Body):
    """JSON-RPC `rig.ask` params."""

    question: str
    history: list[tuple[str, str]] = Field(default_factory=list)
    options: Options = Field(default_factory=Options)
    # a conversation kept on the server: "new" starts one, its id (in the reply) continues it
    conversation: str | None = Field(None, min_length=1, max_length=64)

    _check_question = field_validator("question")(_non_empty)


class SearchParams(_Body):
    """JSON-RPC `rig.search` params: one `query` or several `queries`."""

    query: str | None = None
    queries: list[str] | None = Field(None, min_length=1, max_length=MAX_QUERIES)
    topk: int = Field(3, ge=1, le=100)
    filters: FilterSpec = None  # only chunks whose metadata passes (docs/retrieval.md)
    source: str | None = Field(None, max_length=64)  # the knowledge base to search, as on /retrieve

    _check_queries = field_validator("queries")(_queries_asked)
    _check_filters = field_validator("filters")(_filters_given)

    @field_validator("query")
    @classmethod
    def _query_asked(cls, query: str | None) -> str | None:
        return None if query is None else _as_validation(_check_query_text, query)

