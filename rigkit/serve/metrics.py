"""A server you can watch: one access-log line per request and Prometheus metrics at `/metrics`.

Every request gets an id: the client's `X-Request-ID` when it is a short token, else a new one.
It comes back in the `X-Request-ID` header, is the `request_id` of the answer's `RIGResult`, and
starts the request's access-log line (logger `rigkit.serve.access`, logfmt):

    request_id=5c0f… method=POST route=/chat status=200 ms=812.4 retrievals=2 prompt_tokens=391 generated_tokens=42

The id, and the counts of the answer, travel to the model thread in the job's context
(`contextvars`, copied when the job is queued), so nothing else passes them along.

`/metrics` is a route like the others: the Host, Origin and key rules hold for it too. Metrics:
`rigkit_requests_total{method,route,status}`, `rigkit_request_duration_seconds{method,route}`
(a histogram), `rigkit_retrievals_total` (searches the answers made, and queries `/retrieve`
searched), `rigkit_retrieved_passages_total{source}`, `rigkit_tokens_total{kind=prompt|generated}`,
`rigkit_cache_tokens_total{kind=reused|prefilled}` (prompt tokens served from the KV cache, and
run through the model), `rigkit_queue_depth` and `rigkit_requests_running`. `route` is the route's
pattern (`/v1/models/{name:path}`), or `unmatched`, and `method` one of the standard methods or
`other`, so a scan of odd paths or made-up methods adds no series. Requests refused before any
route (a wrong or missing key 401, a foreign Host 421 or Origin 403) count only in
`rigkit_refused_requests_total{reason=key|host|origin}`, whose series exist from the start: a
client without the key cannot grow `/metrics`.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from rigkit.trace import RIGResult

__all__ = ["ServeMetrics", "RequestRecord", "current_request", "note_outcome", "note_searches", "install_metrics",
           "ACCESS_LOG"]

ACCESS_LOG = logging.getLogger("rigkit.serve.access")
_GIVEN_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)  # answers take seconds
_CURRENT: ContextVar[RequestRecord | None] = ContextVar("rigkit_request", default=None)
# any other method is labelled "other": a client choosing the method must not choose the series
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
# answered only by the guards in front of the routes: a wrong or missing key, a foreign Host or Origin
_REFUSALS = {401: "key", 421: "host", 403: "origin"}


@dataclass
class RequestRecord:
    """One request's id and what its answers cost, filled as they finish."""

    id: str
    retrievals: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "generated": 0, "prefilled": 0,
                                                             "reused": 0})
    passages: dict[str, int] = field(default_factory=dict)  # source -> passages retrieved


def current_request() -> RequestRecord | None:
    """The request being served in this context (a handler, or its job on the model thread)."""
    return _CURRENT.get()


def note_outcome(value: Any) -> Any:
    """`value` (a job's outcome) passed on; a `RIGResult` in it gets the request's id and adds
    its retrievals and tokens to the request's record."""
    record = _CURRENT.get()
    result = value if isinstance(value, RIGResult) else getattr(value, "result", None)
    if record is None or not isinstance(result, RIGResult):
        return value
    result.request_id = record.id
    record.retrievals += result.used_retrieval_times
    for kind in record.tokens:
        record.tokens[kind] += result.tokens.get(kind) or 0  # reused: None when a server does not say
    for hit in (h for r in result.rounds for h in r.hits):
        source = hit.source or "default"
        record.passages[source] = record.passages.get(source, 0) + 1
    return value


def note_searches(count: int) -> None:
    """Searches a request made itself (`/retrieve`, `rig.search`)."""
    record = _CURRENT.get()
    if record is not None:
        record.retrievals += count


class ServeMetrics:
    """The server's metrics, in a registry of their own (two apps in one process do not mix)."""

    def __init__(self, depth: Callable[[], int], running: Callable[[], int]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rigkit_requests", "HTTP requests answered", ["method", "route", "status"], registry=r)
        self.seconds = Histogram("rigkit_request_duration_seconds", "time to the end of the response",
                                 ["method", "route"], buckets=_SECONDS, registry=r)
        self.retrievals = Counter("rigkit_retrievals", "searches made (answer rounds, /retrieve queries)", registry=r)
        self.passages = Counter("rigkit_retrieved_passages", "passages retrieved by answers, per source",
                                ["source"], registry=r)
        self.tokens = Counter("rigkit_tokens", "prompt and generated tokens of answers", ["kind"], registry=r)
        self.cache = Counter("rigkit_cache_tokens", "prompt tokens reused from the KV cache or prefilled",
                             ["kind"], registry=r)
        # counted, but under no label a client picks: a refused request adds no series
        self.refused = Counter("rigkit_refused_requests", "requests refused before any route (key, Host, Origin)",
                               ["reason"], registry=r)
        for reason in _REFUSALS.values():
            self.refused.labels(reason)
        Gauge("rigkit_queue_depth", "jobs waiting or running", registry=r).set_function(depth)
        Gauge("rigkit_requests_running", "jobs running on the model threads", registry=r).set_function(running)

    def observe(self, method: str, route: str, status: int, seconds: float, record: RequestRecord) -> None:
        if status in _REFUSALS:
            self.refused.labels(_REFUSALS[status]).inc()
            return
        method = method if method in _METHODS else "other"
        self.requests.labels(method, route, str(status)).inc()
        self.seconds.labels(method, route).observe(seconds)
        self.retrievals.inc(record.retrievals)
        for source, count in record.passages.items():
            self.passages.labels(source).inc(count)
        for kind in ("prompt", "generated"):
            self.tokens.labels(kind).inc(record.tokens[kind])
        for kind in ("reused", "prefilled"):
            self.cache.labels(kind).inc(record.tokens[kind])

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def install_metrics(app: Any, metrics: ServeMetrics) -> None:
    """`GET /metrics`, and the access log around every request (add it last: outermost)."""
    from fastapi.responses import Response

    @app.get("/metrics", include_in_schema=False)
    async def scrape() -> Response:
        body, media_type = metrics.exposition()
        return Response(body, media_type=media_type)

    app.add_middleware(_Watch, metrics=metrics, routes=app.router.routes)


class _Watch:
    """ASGI middleware: the request id, one access-log line and the metrics of every request."""

    def __init__(self, app: Any, metrics: ServeMetrics, routes: list[Any]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        record = RequestRecord(given if _GIVEN_ID.fullmatch(given) else uuid.uuid4().hex[:16])
        token = _CURRENT.set(record)
        started, status = time.perf_counter(), 500  # no response started: the app failed

        async def send_with_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", record.id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _CURRENT.reset(token)
            seconds = time.perf_counter() - started
            route = self._route(scope)
            self.metrics.observe(scope["method"], route, status, seconds, record)
            ACCESS_LOG.info("request_id=%s method=%s route=%s status=%d ms=%.1f retrievals=%d prompt_tokens=%d "
                            "generated_tokens=%d", record.id, _shown_path(scope["method"][:16]),
                            _shown_path(scope.get("path", "")),
                            status, seconds * 1000, record.retrievals, record.tokens["prompt"],
                            record.tokens["generated"])


    def _route(self, scope: dict) -> str:
        """The pattern of the route `scope` reached, or would have (a request refused before routing)."""
        from starlette.routing import Match

        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] is Match.FULL), None)
        return getattr(route, "path", None) or "unmatched"


def _shown_path(path: str) -> str:
    """The path for a log line: printable, no spaces (one line, one field), at most 200 characters."""
    shown = "".join(c if c.isprintable() and not c.isspace() else f"%{ord(c):02X}" for c in path[:200])
    return shown or "/"
