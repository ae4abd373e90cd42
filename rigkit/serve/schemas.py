"""Request bodies as pydantic models: wrong types become a 422 that names the field.

Unknown fields are ignored, as OpenAI's API does, so clients sending newer fields still work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Options",
    "ChatRequest",
    "ChatCompletionRequest",
    "Message",
    "RetrieveRequest",
    "AskParams",
    "SearchParams",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Body):
    """Sampling and loop settings for one request (`options` in every endpoint)."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_rounds: int | None = Field(None, ge=0, le=32)
    top_k: int | None = Field(None, ge=1, le=100)
    decider: str | None = None
    threshold: float | None = None

    @field_validator("decider")
    @classmethod
    def _known_decider(cls, name: str | None) -> str | None:
        from rigkit.deciders import DECIDERS

        if name is not None and name not in DECIDERS:
            raise ValueError(f"unknown decider {name!r}; choose from {', '.join(sorted(DECIDERS))}")
        return name


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("the question is empty")
    return value


class ChatRequest(_Body):
    """`POST /chat`: the RIG service's own shape."""

    question: str
    history: list[tuple[str, str]] = Field(default_factory=list)  # (question, answer) pairs
    options: Options = Field(default_factory=Options)
    stream: bool = False

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
    stop: str | list[str] | None = None
    options: Options = Field(default_factory=Options)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(None, ge=1, le=8192)
    seed: int | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class RetrieveRequest(_Body):
    """`POST /retrieve`: the retrieval-server shape of Search-R1-style stacks."""

    queries: list[str] = Field(min_length=1, max_length=256)
    topk: int = Field(3, ge=1, le=100)


class AskParams(_Body):
    """JSON-RPC `rig.ask` params."""

    question: str
    history: list[tuple[str, str]] = Field(default_factory=list)
    options: Options = Field(default_factory=Options)

    _check_question = field_validator("question")(_non_empty)


class SearchParams(_Body):
    """JSON-RPC `rig.search` params: one `query` or several `queries`."""

    query: str | None = None
    queries: list[str] | None = None
    topk: int = Field(3, ge=1, le=100)
