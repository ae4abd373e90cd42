"""Tools a client declares (OpenAI `tools`, the MCP `ask` tool's `tools`): checked, shown to the
model, and each call the model makes returned with structured arguments.

- `declare(defs)`: the declared tools by name; a name that is not `[A-Za-z0-9_-]{1,64}`, a
  repeated name or `parameters` that are not a JSON schema are refused, naming the field.
- rigkit's own `search` takes `query`, `top_k`, `filters` and `source` (`SEARCH_PARAMETERS`);
  a client that declares `search` runs the searches itself, one that does not leaves them to the
  served index and gets only the calls of its own tools.
- `tools_prompt`: the lines the system prompt gains so the model can call them. rigkit renders
  every backend's prompt as plain chat messages, so the tools are described in the marker
  protocol's form: a call is the tool's name and its JSON arguments inside the retrieval marker,
  `<retrieve>weather {"city": "Paris"}</retrieve>`.
- `model_calls`: what a paused round asks for: a marker phrase naming a declared tool, with
  arguments its schema accepts, is that tool's call; every other need is a `search`.
- `check_arguments`: a call's arguments against its tool's schema, as one bounded line.

Schemas and arguments are checked within the limits of `rigkit.serve.tool_schemas` (nothing
fetched, bounded size, nesting and time); callers on the event loop run these in a thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.errors import InputError
from rigkit.serve.tool_schemas import SchemaLimit, check_schema, first_error, load_arguments

__all__ = [
    "tools_refusal", "Tool", "SEARCH", "SEARCH_PARAMETERS", "declare", "check_arguments", "tools_prompt", "model_calls",
           "parse_call"]

SEARCH = "search"
SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "what to look for"},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "passages to return"},
        "filters": {"type": ["object", "array", "string"],
                    "description": 'metadata filters, e.g. {"lang": "en"} or ["year>=1990"]'},
        "source": {"type": "string", "description": "the knowledge base to search (default: the served index)"},
    },
    "required": ["query"],
}
SEARCH_DESCRIPTION = "Search the knowledge base; passages best first."
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL = re.compile(r"^\s*([A-Za-z0-9_-]{1,64})\s*(\{.*\})\s*$", re.DOTALL)
_MESSAGE_CHARS = 200  # a schema error's message is cut here: one line, bounded


@dataclass(frozen=True)
class Tool:
    """One declared tool: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})


def declare(defs: Sequence[Mapping[str, Any]], where: str = "tools") -> dict[str, Tool]:
    """The tools of a request (`{"name", "description", "parameters"}` each), by name."""
    from jsonschema.exceptions import SchemaError

    tools: dict[str, Tool] = {}
    for i, d in enumerate(defs):
        name = str(d.get("name") or "")
        if not _NAME.match(name):
            raise InputError(f"{where}.{i}.function.name: {name!r} is not a tool name (letters, digits, _ or -, "
                             "at most 64)")
        if name in tools:
            raise InputError(f"{where}.{i}.function.name: {name!r} is declared twice")
        parameters = d.get("parameters") or (SEARCH_PARAMETERS if name == SEARCH else {"type": "object"})
        try:
            check_schema(parameters)
        except SchemaError as err:
            raise InputError(f"{where}.{i}.function.parameters: not a JSON schema: {_short(err.message)}") from None
        except ValueError as err:  # a limit (size, nesting, a reference, a pattern), or NaN
            raise InputError(f"{where}.{i}.function.parameters: {_short(str(err))}") from None
        tools[name] = Tool(name, str(d.get("description") or (SEARCH_DESCRIPTION if name == SEARCH else "")),
                           parameters)
    return tools


def check_arguments(tool: Tool, arguments: Any, where: str) -> dict[str, Any]:
    """`arguments` (a JSON text or a dict) when `tool`'s schema accepts them; else one line."""
    try:
        arguments = load_arguments(arguments)
    except ValueError as err:  # not (strict) JSON, or over a limit
        raise InputError(f"{where}: the arguments of {tool.name!r} are {_short(str(err))}") from None
    if not isinstance(arguments, dict):
        raise InputError(f"{where}: the arguments of {tool.name!r} must be a JSON object")
    try:
        error = first_error(tool.parameters, arguments)
    except SchemaLimit as err:
        raise InputError(f"{where}: checking the arguments of {tool.name!r} stopped: {_short(str(err))}") from None
    if error is not None:
        at = "/".join(str(p) for p in error.absolute_path)
        raise InputError(f"{where}: arguments fail the schema of {tool.name!r}{f' at {at}' if at else ''}: "
                         f"{_short(error.message)}")
    return arguments


def tools_prompt(tools: Mapping[str, Tool], open_tag: str, close_tag: str, language: str = "en") -> str:
    """What the system prompt adds so the model knows the tools and how to call one."""
    others = [t for t in tools.values() if t.name != SEARCH]
    if not others:
        return ""
    lines = [f"- {t.name}({', '.join(t.parameters.get('properties', {}))}): {t.description}".rstrip(": ")
             for t in others]
    example = f'{open_tag}{others[0].name} {{...}}{close_tag}'
    head = (f"你还可以调用以下工具。调用时在检索标记里写工具名和 JSON 参数，例如 {example}：" if language == "zh"
            else f"You can also call these tools. To call one, write its name and JSON arguments inside the "
                 f"retrieval tag, e.g. {example}:")
    return "\n".join([head, *lines])


def parse_call(phrase: str, tools: Mapping[str, Tool]) -> tuple[str, dict[str, Any]] | None:
    """`name {json}` naming a declared tool other than `search`, with arguments its schema
    accepts; None for anything else (a search phrase, an unknown name, arguments that fail)."""
    match = _CALL.match(phrase)
    if not match or match.group(1) not in tools or match.group(1) == SEARCH:
        return None
    try:
        return match.group(1), check_arguments(tools[match.group(1)], match.group(2), "the model's call")
    except InputError:
        return None  # the model's malformed call: the phrase is searched instead


def model_calls(phrases: Sequence[str], queries: Sequence[str], tools: Mapping[str, Tool],
                top_k: int, source: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) for each need of a paused round: `phrases` are the marker phrases
    the model wrote, `queries` the searches built for the round (one per need when they align),
    `source` the knowledge base the round's query names ("": none)."""
    named = [parse_call(p, tools) for p in phrases]
    if len(phrases) == 1 and named[0] is not None:
        return [named[0]]  # one call, whatever sub-queries its phrase was split into
    if len(phrases) != len(queries):  # one need searched as several sub-queries
        named = [None] * len(queries)
    return [call or (SEARCH, _search_arguments(q, tools, top_k, source)) for call, q in zip(named, queries)]


def _search_arguments(query: str, tools: Mapping[str, Tool], top_k: int, source: str) -> dict[str, Any]:
    """`{"query", "top_k", "source"}`, keeping only what a client's own `search` schema names."""
    arguments: dict[str, Any] = {"query": query, "top_k": top_k, **({"source": source} if source else {})}
    declared = tools.get(SEARCH)
    known = declared.parameters.get("properties") if declared is not None else None
    return {k: v for k, v in arguments.items() if k == "query" or known is None or k in known}


def tools_refusal(tools: Mapping[str, Tool], reads_markers: bool, decider: str) -> str | None:
    """One line refusing client tools the run cannot call, else None. A `search` tool works with
    every decider (each round's search goes to the client); any other tool is called by the model
    writing it inside a marker, which only a decider that reads markers acts on."""
    named = [name for name in tools if name != SEARCH]
    if not named or reads_markers:
        return None
    return (f"tools {', '.join(named)} are called through retrieval markers, which decider {decider!r} "
            "does not read: use options.decider \"marker\" (or a composite with a marker member); "
            "a `search` tool alone works with every decider")


def _short(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"
