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

from rigkit.retrieval.filters import parse_filters
from rigkit.serve.metrics import note_outcome
from rigkit.serve.service import RigService, grounding_summary
from rigkit.text import check_question

__all__ = ["build_mcp"]

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
    async def search(query: str, top_k: int = 3,
                     filters: dict[str, Any] | list[str] | None = None) -> list[dict[str, Any]]:
        """Search the index; passages best first, each capped with a visible truncation note.
        `filters` keeps chunks whose metadata passes, e.g. {"lang": "en", "year": {"gte": 1990}}
        or ["lang=en", "year>=1990"]."""
        check_question(query, "the query")
        filters = parse_filters(filters)  # a malformed filter is the tool's error, before any search
        hits = (await asyncio.to_thread(service.search, [query], max(1, min(int(top_k), 20)), filters))[0]
        return [{"id": h.chunk_id, "title": h.title, "text": service.cap_text(h.text), "score": round(h.score, 4)}
                for h in hits]

    @mcp.tool()
    async def ask(question: str) -> dict[str, Any]:
        """Answer with the RIG loop: the cited answer, how many retrievals it used, the citations,
        and what the grounding checks flagged (suspicious sentences, warnings)."""
        check_question(question)
        job = service.worker.submit(lambda job: note_outcome(service.ask(job, question)))
        result = await asyncio.wrap_future(job.future)
        return {"answer": result.answer, "used_retrieval_times": result.used_retrieval_times,
                "citations": result.citations, "low_confidence": result.low_confidence,
                **grounding_summary(result)}

    return mcp
