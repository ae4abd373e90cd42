"""An MCP server (the official `mcp` SDK's FastMCP) with two read-only tools: `search`, `ask`.

Over stdio (`rigkit mcp`) or streamable HTTP, mounted in the app under `/mcp`. Mounted, `Host` and
`Origin` are checked by the app's exposure guard like every other route (one rule for the whole
server, `rigkit.serve.exposure`), so the SDK's own check is off; run alone over HTTP, the SDK
checks them against the bind address and localhost. Both tools go through the same `RigService`:
`ask` waits its turn on the model worker like any other request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rigkit.errors import InputError
from rigkit.retrieval.filters import parse_filters
from rigkit.serve.jobs import submit
from rigkit.serve.schemas import history_too_large
from rigkit.serve.service import RigService, ToolRound, grounding_summary
from rigkit.serve.tools import declare
from rigkit.text import check_question

__all__ = ["build_mcp"]


def _answer(result: Any) -> dict[str, Any]:
    return {"answer": result.answer, "used_retrieval_times": result.used_retrieval_times,
            "citations": result.citations, "low_confidence": result.low_confidence, **grounding_summary(result)}


def check_history(history: list[list[str]]) -> list[tuple[str, str]]:
    """[question, answer] pairs, or an error naming the first turn that is not one."""
    for i, turn in enumerate(history):
        if len(turn) != 2 or not all(isinstance(t, str) for t in turn):
            raise InputError(f"history.{i}: a turn is [question, answer]")
    turns = [(q, a) for q, a in history]
    problem = history_too_large(turns)
    if problem:
        raise InputError(problem)
    return turns


def _answered(results: list[dict[str, str]], tools: dict[str, Any]) -> list[ToolRound]:
    """The client's results as the one tool round they finish (none: a new question)."""
    if not results:
        return []
    for i, r in enumerate(results):
        if not r.get("id") or r.get("name") not in tools:
            raise InputError(f"tool_results.{i}: needs the call's id and the name of a declared tool "
                             f"({', '.join(tools)}); got {r.get('name')!r}")
    return [ToolRound([r["id"] for r in results], [""] * len(results), [str(r.get("content", "")) for r in results],
                      [r["name"] for r in results])]

_LOCAL = ("127.0.0.1", "localhost", "::1")


def build_mcp(service: RigService, host: str = "127.0.0.1", http: bool = False) -> Any:
    """A FastMCP server over `service`; `http` readies it to be mounted (path `/mcp`)."""
    from mcp.server.fastmcp import FastMCP
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if host not in _LOCAL:
        hosts.append(f"{host}:*")
        origins.append(f"http://{host}:*")
    security = TransportSecuritySettings(enable_dns_rebinding_protection=not http, allowed_hosts=hosts,
                                         allowed_origins=origins)
    mcp = FastMCP("rigkit", instructions="Search a rigkit index, or answer with retrieval-interleaved generation.",
                  host=host, streamable_http_path="/mcp", transport_security=security, stateless_http=http,
                  json_response=http, log_level="WARNING")

    @mcp.tool()
    async def search(query: str, top_k: int = 3, filters: dict[str, Any] | list[str] | None = None,
                     source: str | None = None) -> list[dict[str, Any]]:
        """Search the index; passages best first, each capped with a visible truncation note.
        `filters` keeps chunks whose metadata passes, e.g. {"lang": "en", "year": {"gte": 1990}}
        or ["lang=en", "year>=1990"]; `source` names one knowledge base of several."""
        check_question(query, "the query")
        filters = parse_filters(filters)  # a malformed filter is the tool's error, before any search
        top_k = max(1, min(int(top_k), 20))
        hits = (await asyncio.to_thread(service.search, [query], top_k, filters, source))[0]
        return [{"id": h.chunk_id, "title": h.title, "text": service.cap_text(h.text), "score": round(h.score, 4)}
                for h in hits]

    @mcp.tool()
    async def ask(question: str, history: list[list[str]] | None = None, tools: list[dict[str, Any]] | None = None,
                  tool_results: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """Answer with the RIG loop: the cited answer, how many retrievals it used, the citations,
        and what the grounding checks flagged (suspicious sentences, warnings). `history` holds
        earlier [question, answer] turns. With `tools` (each {"name", "description",
        "parameters"}: a JSON schema) the answer may stop at a call of one of them: the reply is
        {"tool_calls": [{"id", "name", "arguments"}], "draft"}; run them and ask again with the
        same question and `tool_results` ([{"id", "name", "content"}]) to go on."""
        check_question(question)
        turns = check_history(history or [])
        if tools is None:
            job = submit(service, None, lambda job: service.ask(job, question, turns))
            return _answer(await asyncio.wrap_future(job.future))
        declared = await asyncio.to_thread(declare, tools)  # the client's schemas: off the event loop
        answered = _answered(tool_results or [], declared)
        job = submit(service, None, lambda job: service.tool_step(job, question, turns, answered, tools=declared))
        step = await asyncio.wrap_future(job.future)
        if step.result is not None:
            return _answer(step.result)
        return {"tool_calls": [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in step.calls],
                "draft": step.draft}

    return mcp
