"""The FastAPI app: `/chat`, `/v1/chat/completions`, `/v1/models`, `/rpc`, `/retrieve`, `/mcp`, `/metrics`.

Every handler validates, submits one job to the service's `ModelWorker` and relays what the run
emits; the loop itself is `RIGController` (through `RigService`). Errors are one JSON shape,
`{"error": {"message", "type", "param", "code"}}` (OpenAI's, so its SDK raises them properly):
malformed JSON 400, wrong types 422 naming the field, unknown model 404, body over the limit 413,
a full queue 429 with `Retry-After`, shutting down 503; a foreign `Host` 421 and a foreign
`Origin` 403 (`rigkit.serve.exposure`); a model or retrieval server that fails 502, one that
misses its deadline 504 (`code` upstream_error / upstream_timeout), anything unforeseen 500.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rigkit.errors import InputError, UpstreamError
from rigkit.retrieval.remote import search_result
from rigkit.retrieval.sources import collect_notes
from rigkit.serve.exposure import Exposure, install_exposure, not_json
from rigkit.serve.jobs import (
    ClientGone,
    Pipe,
    RequestError,
    check_history,
    error_body,
    error_of,
    sse,
    status_of,
    submit,
    wait_job,
)
from rigkit.serve.metrics import ServeMetrics, install_metrics, note_searches
from rigkit.serve.schemas import ChatCompletionRequest, ChatRequest, RetrieveRequest
from rigkit.serve.service import AskOptions, RigService, round_summary
from rigkit.serve.worker import Busy, CancelledJob, Draining, Job

__all__ = ["create_app"]


def create_app(service: RigService, *, api_key: str | None = None, max_body_bytes: int = 1_000_000,
               mcp: bool = True, host: str = "127.0.0.1", exposure: Exposure | None = None) -> FastAPI:
    """The app over a loaded `service`; `api_key` turns on bearer auth for every route.

    `exposure` says which `Host` names and browser origins are served (default: those of the
    bind address `host`, no other origin); it guards every route, `/mcp` and `/openapi.json` too.
    """
    from rigkit.serve.options import check_serve_options

    check_serve_options(max_body_bytes=max_body_bytes)
    exposure = exposure or Exposure(bind=host)
    mcp_server = None
    if mcp:
        from rigkit.serve.mcp_server import build_mcp

        mcp_server = build_mcp(service, host=host, http=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # On SIGTERM answer streams run on until the drain deadline (`rigkit.serve.shutdown`).
        if mcp_server is not None:
            async with mcp_server.session_manager.run():
                yield
        else:
            yield
        # reached when every connection closed or the drain deadline passed: what is left has no reader
        await asyncio.to_thread(service.worker.stop)

    app = FastAPI(title="rigkit", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    _install_errors(app)
    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes, service=service)
    install_exposure(app, exposure)  # a foreign Host or Origin is refused before anything runs
    # outermost: every request, a refused one too, gets an id, an access-log line and its metrics
    install_metrics(app, ServeMetrics(depth=lambda: service.worker.depth, running=lambda: service.worker.running))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        worker = service.worker
        return {"status": "draining" if worker.draining else "ok", "queue": worker.depth,
                "running": worker.running, "workers": worker.workers, "completed": worker.completed, "cancelled": worker.cancelled, "model": service.model_name}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(service, name) for name in service.model_ids()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Any:
        if name not in service.model_ids():
            return _unknown_model(service, name)
        return _model_card(service, name)

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest) -> dict[str, Any]:
        hits, notes = await asyncio.to_thread(_search_noted, service, body)
        note_searches(len(body.queries))
        answer = search_result(hits, body.return_scores)  # Search-R1's shape, rigkit's fields beside
        return {**answer, "warnings": notes} if notes else answer  # e.g. a knowledge base that is down

    @app.post("/chat")
    async def chat(body: ChatRequest, request: Request) -> Any:
        options = _options(body.options)
        history = [tuple(pair) for pair in body.history]
        check_history(history)
        conversation, history = service.history_of(body.conversation, history)
        if not body.stream:
            job = submit(service, None, lambda job: service.remember(
                conversation, body.question, service.ask(job, body.question, history, options)))
            result = await wait_job(request, service, job)
            return Response(_with_conversation(result.to_json(), conversation), media_type="application/json")
        pipe = Pipe()
        job = submit(service, pipe, lambda job: service.remember(conversation, body.question, service.ask(
            job, body.question, history, options, on_event=lambda e: pipe.put(("event", e)),
            on_round=lambda t: pipe.put(("round", round_summary(t))))))
        return sse(_chat_events(service, job, pipe, conversation))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        if body.model and body.model not in service.model_ids():
            return _unknown_model(service, body.model)
        from rigkit.serve.completions import complete

        return await complete(service, body, request)

    from rigkit.serve.rpc import add_rpc

    add_rpc(app, service)
    if mcp_server is not None:
        for route in mcp_server.streamable_http_app().routes:
            app.router.routes.append(route)
    return app


# -- streams ----------------------------------------------------------------------------------
async def _chat_events(service: RigService, job: Job, pipe: Pipe,
                       conversation: str | None = None) -> AsyncIterator[dict[str, str]]:
    """`token` / `retract` / `note` events as the model writes, a `round` per round, then `result`."""
    try:
        while True:
            kind, payload = await pipe.queue.get()
            if kind == "end":
                break
            if kind == "round":
                yield {"event": "round", "data": json.dumps(payload, ensure_ascii=False)}
            elif payload.kind in ("token", "note"):
                yield {"event": payload.kind, "data": json.dumps({"text": payload.text}, ensure_ascii=False)}
            else:
                data = {"text": payload.text, "chars": len(payload.text)}
                yield {"event": "retract", "data": json.dumps(data, ensure_ascii=False)}
        try:
            result = job.future.result()
        except Exception as err:  # noqa: BLE001 - the stream's one outcome is this error event
            yield {"event": "error", "data": json.dumps(error_of(err)["error"], ensure_ascii=False)}
            return
        yield {"event": "result", "data": _with_conversation(result.to_json(), conversation)}
    finally:
        if not job.future.done():
            service.worker.cancel(job)  # the client went away: stop its generation


def _with_conversation(result_json: str, conversation: str | None) -> str:
    """The result's JSON, with the conversation's id when the request named one."""
    if conversation is None:
        return result_json
    return json.dumps({**json.loads(result_json), "conversation": conversation}, ensure_ascii=False)


def _search_noted(service: RigService, body: RetrieveRequest) -> tuple[list[list[Any]], list[str]]:
    """The hits of `/retrieve`, and a line for each knowledge base that did not answer."""
    with collect_notes() as notes:
        hits = service.search(body.queries, body.topk, body.filters, body.source)
    return hits, notes


def _options(o: Any) -> AskOptions:
    return AskOptions(**o.model_dump())


# -- helpers -----------------------------------------------------------------------------------
def _model_card(service: RigService, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": service.started, "owned_by": "rigkit",
            "source": service.generator.source}


def _unknown_model(service: RigService, name: str) -> JSONResponse:
    served = ", ".join(service.model_ids())
    return JSONResponse(error_body(f"unknown model {name!r}; this server serves {served}",
                                   param="model", code="model_not_found"), status_code=404)


def _field(loc: tuple[Any, ...]) -> str:
    """`messages.0.content` from pydantic's location (without "body" and union member tags)."""
    parts = [str(p) for p in loc if p != "body" and not _TYPE_TAG.match(str(p))]
    return ".".join(parts) or "body"


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_body"}
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|tuple|.*\[.*\])$")


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                return JSONResponse(error_body(f"malformed JSON: {e.get('msg')}"), status_code=400)
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        media_type = not_json(request.headers.get("content-type"))
        if media_type and tuple(first.get("loc", ())) == ("body",):  # a body that is not JSON at all
            return JSONResponse(error_body(f"{request.url.path} takes Content-Type: application/json, not "
                                           f"{media_type!r}", param="content-type", code="unsupported_media_type"),
                                status_code=415)
        if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
            return JSONResponse(error_body("the request needs a JSON body"), status_code=400)
        name = _field(tuple(first.get("loc", ())))
        parts = dict.fromkeys(f"{_field(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors[:6])
        message = "; ".join(parts)
        return JSONResponse(error_body(message, param=name), status_code=422)

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse(error_body(str(exc), kind="rate_limit_error", code="queue_full"), status_code=429,
                            headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(Draining)
    async def draining(request: Request, exc: Draining) -> JSONResponse:
        return JSONResponse(error_body(str(exc), kind="server_error", code="shutting_down"), status_code=503)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse(error_of(exc), status_code=422)

    @app.exception_handler(RequestError)
    async def bad_request(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_of(exc), status_code=exc.status)

    @app.exception_handler(UpstreamError)
    async def upstream(request: Request, exc: UpstreamError) -> JSONResponse:
        return JSONResponse(error_of(exc), status_code=status_of(exc))  # 502, or 504 past its deadline

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's own refusals (an unknown route, a body it cannot parse) in rigkit's shape
        if exc.status_code < 400:
            return Response(status_code=exc.status_code, headers=exc.headers)
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = "the body is not JSON rigkit can read (not UTF-8, or nested too deeply)"
        return JSONResponse(error_body(message, code=_HTTP_CODES.get(exc.status_code)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unforeseen(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this reply; the client gets the error shape, no traceback
        return JSONResponse(error_of(exc), status_code=500)

    @app.exception_handler(ClientGone)
    async def gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; the job was cancelled

    @app.exception_handler(CancelledJob)
    async def cancelled(request: Request, exc: CancelledJob) -> Response:
        return Response(status_code=499)


class _Guard:
    """ASGI middleware: bearer auth, the body-size limit, and no new requests while draining."""

    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int, service: RigService):
        self.app, self.api_key, self.limit, self.service = app, api_key, max_body_bytes, service

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and not self._authorised(headers.get("authorization", "")):
            return await _reply(send, 401, error_body("missing or wrong bearer token", kind="authentication_error",
                                                      code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})
        if self.service.worker.draining and scope.get("path") != "/health":
            return await _reply(send, 503, error_body("the server is shutting down", kind="server_error",
                                                      code="shutting_down"))
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limit:
            return await _reply(send, 413, self._too_large())
        received, too_large, replied = 0, False, False

        async def limited_receive() -> dict:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded_send(message: dict) -> None:
            nonlocal replied
            if too_large:  # a chunked body over the limit: whatever the app said, it is a 413
                if not replied:
                    replied = True
                    await _reply(send, 413, self._too_large())
                return
            await send(message)

        await self.app(scope, limited_receive, guarded_send)

    def _authorised(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        # bytes, not str: compare_digest raises on non-ASCII text (headers arrive latin-1 decoded)
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1"), (self.api_key or "").encode("utf-8"))

    def _too_large(self) -> dict[str, Any]:
        return error_body(f"the request body is over the limit of {self.limit} bytes", code="body_too_large")


async def _reply(send: Callable, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
