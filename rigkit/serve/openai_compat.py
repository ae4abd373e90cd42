"""Translation between OpenAI chat completions and the RIG loop (no model work here).

- `parse_messages`: the question is the last user message, earlier user/assistant turns are
  history, and the assistant `tool_calls` after the question with their `role: "tool"` replies
  are the finished client-side tool rounds. System messages are not passed on: the RIG system
  prompt (passage use, markers) is the served config's.
- Responses and `chat.completion.chunk` frames follow OpenAI's format: tool-call deltas carry
  `index` in every frame, `id` / `type` / `function.name` in the first, `function.arguments` as
  string fragments after; usage comes on a last chunk with empty `choices` when
  `stream_options.include_usage`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rigkit.errors import InputError
from rigkit.serve.jobs import RequestError
from rigkit.serve.schemas import ChatCompletionRequest, Message, Options
from rigkit.serve.service import AskOptions, ToolCall, ToolRound
from rigkit.serve.tools import Tool, check_arguments, declare
from rigkit.text import check_question

__all__ = [
    "RequestError", "Conversation", "parse_messages", "check_tools", "ask_options", "cut_at_stop",
    "stop_prefix_length", "Completion", "tool_call_message", "usage_of",
]


@dataclass
class Conversation:
    question: str
    history: list[tuple[str, str]] = field(default_factory=list)
    rounds: list[ToolRound] = field(default_factory=list)


def parse_messages(messages: list[Message], tools: Mapping[str, Tool] | None) -> Conversation:
    """Question, history and finished tool rounds from an OpenAI message list."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise RequestError("messages: no user message holds a question", "messages")
    last = users[-1]
    question = messages[last].text()
    try:
        check_question(question)
    except InputError as err:
        raise RequestError(f"messages.{last}.content: {err}", f"messages.{last}.content") from None
    history: list[tuple[str, str]] = []
    for i in users[:-1]:
        nxt = next((j for j in users if j > i), last)
        replies = [m.text() for m in messages[i + 1 : nxt] if m.role == "assistant" and m.text()]
        history.append((messages[i].text(), replies[-1] if replies else ""))
    rounds = _tool_rounds(messages, last, tools) if tools else []
    return Conversation(question, history, rounds)


def _tool_rounds(messages: list[Message], start: int, tools: Mapping[str, Tool]) -> list[ToolRound]:
    """The tool rounds of the question at `start`; rounds before it belong to answered turns."""
    replies = {m.tool_call_id: (i, m) for i, m in enumerate(messages) if m.role == "tool" and i > start}
    rounds, answered = [], set()
    for i, m in enumerate(messages[start + 1 :], start + 1):
        if m.role != "assistant" or not m.tool_calls:
            continue
        ids, queries, results, names = [], [], [], []
        for j, call in enumerate(m.tool_calls):
            if call.id not in replies:
                raise RequestError(f"messages.{i}.tool_calls: no tool message answers {call.id!r}",
                                   f"messages.{i}.tool_calls")
            where = f"messages.{i}.tool_calls.{j}.function"
            tool = tools.get(call.function.name)
            if tool is None:
                raise RequestError(f"{where}.name: unknown tool {call.function.name!r}; the request declares "
                                   f"{', '.join(tools)}", f"{where}.name")
            try:
                arguments = check_arguments(tool, call.function.arguments, f"{where}.arguments")
            except InputError as err:
                raise RequestError(str(err), f"{where}.arguments") from None
            ids.append(call.id)
            names.append(tool.name)
            queries.append(str(arguments.get("query", "")))
            results.append(replies[call.id][1].text())
            answered.add(call.id)
        rounds.append(ToolRound(ids, queries, results, names))
    for call_id, (i, _) in replies.items():
        if call_id not in answered:
            raise RequestError(f"messages.{i}.tool_call_id: {call_id!r} matches no assistant tool call",
                               f"messages.{i}.tool_call_id")
    return rounds


def check_tools(request: ChatCompletionRequest) -> dict[str, Tool] | None:
    """The request's declared tools, by name (None: no client-side tool loop). Any function may be
    declared; a `search` among them is run by the client, otherwise by the served index."""
    if not request.tools or request.tool_choice == "none":
        return None
    defs = [t.function.model_dump() for t in request.tools]
    try:
        return declare(defs)
    except InputError as err:
        raise RequestError(str(err), str(err).split(":", 1)[0]) from None


def ask_options(request: ChatCompletionRequest, tools: object) -> AskOptions:
    """`options` first, then OpenAI's own top-level fields; `turns` caps the tool rounds."""
    o: Options = request.options
    return AskOptions(
        temperature=o.temperature if o.temperature is not None else request.temperature,
        top_p=o.top_p if o.top_p is not None else request.top_p,
        seed=o.seed if o.seed is not None else request.seed,
        max_tokens=o.max_tokens or request.max_completion_tokens or request.max_tokens,
        max_rounds=request.turns if request.turns is not None else o.max_rounds,
        top_k=o.top_k,
        decider=o.decider,
        threshold=o.threshold,
    )


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the first stop string (which is not included), and whether one was found."""
    cuts = [text.index(s) for s in stops if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def stop_prefix_length(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that could be the start of a stop string: a stream
    holds those characters back until the next token shows whether the stop string follows."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class Completion:
    """Builds one completion's response or chunks (shared id, created time and model name)."""

    def __init__(self, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def response(self, message: dict[str, Any], finish: str, usage: dict[str, int], rig: dict[str, Any]) -> dict:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage, "rig": rig,
        }

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict:
        return {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra,
        }

    def usage_chunk(self, usage: dict[str, int]) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage}

    def tool_call_chunks(self, calls: list[ToolCall]) -> list[dict]:
        """The OpenAI tool-call delta sequence, call after call, each under its own `index`:
        id and name first, then argument fragments."""
        frames = []
        for index, call in enumerate(calls):
            arguments = _arguments(call)
            first = {"index": index, "id": call.call_id, "type": "function",
                     "function": {"name": call.name, "arguments": ""}}
            frames.append(self.chunk({"role": "assistant", "tool_calls": [first]} if index == 0
                                     else {"tool_calls": [first]}))
            for start in range(0, len(arguments), 16):
                piece = {"index": index, "function": {"arguments": arguments[start : start + 16]}}
                frames.append(self.chunk({"tool_calls": [piece]}))
        return frames


def tool_call_message(calls: list[ToolCall], draft: str) -> dict[str, Any]:
    """The assistant message asking for `calls` (several when the round has several needs)."""
    return {
        "role": "assistant",
        "content": draft or None,
        "tool_calls": [{"id": c.call_id, "type": "function",
                        "function": {"name": c.name, "arguments": _arguments(c)}} for c in calls],
    }


def _arguments(call: ToolCall) -> str:
    return json.dumps(call.arguments, ensure_ascii=False)


def usage_of(tokens: dict[str, int]) -> dict[str, int]:
    prompt, completion = int(tokens.get("prompt", 0)), int(tokens.get("generated", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
