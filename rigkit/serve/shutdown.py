"""Stopping `rigkit serve`: drain in-flight requests up to a deadline, then close what is left.

On the first SIGTERM or SIGINT the server stops listening and answers 503 to new requests on
connections already open, while the requests it holds run on: model jobs, and rigkit's own
streams (`/chat`, `/v1/chat/completions`), which end when their answer does. Streams that never
end by themselves, an MCP client's GET stream for server notifications, are closed at once. When
the deadline passes, whatever still runs (a long generation, a client sending its body a byte at
a time) is cut: a request not yet answered gets a 503, a stream ends with an error event
(`code: shutting_down`; on `/v1/chat/completions` an error chunk and `[DONE]`, which OpenAI's SDK
raises), the connection is closed, and the process exits. A second signal exits at once.

uvicorn's own `timeout_graceful_shutdown` is the backstop a little after the deadline; the cut
happens here first so that every response ends well-formed and nothing is logged as a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable
from typing import Any

__all__ = ["DRAIN_SECONDS", "FINITE_STREAM_GRACE", "Shutdown", "draining_server"]

DRAIN_SECONDS = 30.0  # default deadline: a CPU answer of the default length fits well inside it
BACKSTOP_SECONDS = 2.0  # after the cut, uvicorn's own deadline cancels anything still left

# How long rigkit's own SSE streams may run on after a shutdown signal: until they end, or until
# the drain deadline cuts them (sse-starlette closes streams that have no grace at once).
FINITE_STREAM_GRACE = math.inf

log = logging.getLogger("rigkit.serve")


class Shutdown:
    """The drain deadline: `begin()` from the signal handler, `cut` set when the deadline passes."""

    def __init__(self, drain_seconds: float = DRAIN_SECONDS):
        self.drain_seconds = drain_seconds
        self.cut = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        """Start the deadline; safe from a signal handler (it only schedules work on the loop)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.drain_seconds, self.cut.set)


class CutAtDeadline:
    """ASGI wrapper: runs each request until it ends or the drain deadline cuts it, and ends every
    response properly (a stream whose handler stopped mid-way gets its closing chunk)."""

    def __init__(self, app: Any, shutdown: Shutdown):
        self.app, self.shutdown = app, shutdown

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.shutdown.loop is None:
            self.shutdown.loop = asyncio.get_running_loop()
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = {"started": False, "complete": False, "stream": False}

        async def tracked_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                kind = dict(message.get("headers") or []).get(b"content-type", b"")
                state["stream"] = kind.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        request = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        deadline = asyncio.ensure_future(self.shutdown.cut.wait())
        try:
            await asyncio.wait({request, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
            if not request.done():
                request.cancel()
                log.warning("rigkit serve: cut %s %s at the %g s shutdown deadline", scope.get("method"),
                            scope.get("path"), self.shutdown.drain_seconds)
            with contextlib.suppress(asyncio.CancelledError):
                await request
        if not state["started"]:
            await _shutting_down(send)
        elif not state["complete"]:
            last = _cut_event(scope.get("path", ""), self.shutdown.drain_seconds) if state["stream"] else b""
            await send({"type": "http.response.body", "body": last, "more_body": False})


def _cut_event(path: str, seconds: float) -> bytes:
    """The last event of a stream cut at the deadline, so that no client takes it for a finished
    answer: an OpenAI stream's error chunk and `[DONE]` (its SDK raises the error), else rigkit's
    `error` event."""
    error = json.dumps({"message": f"the server shut down before this answer finished (cut at the "
                                   f"{seconds:g} s shutdown deadline); the answer is incomplete",
                        "type": "server_error", "param": None, "code": "shutting_down"})
    if path.startswith("/v1/"):
        return f'\ndata: {{"error": {error}}}\n\ndata: [DONE]\n\n'.encode()
    return f"\nevent: error\ndata: {error}\n\n".encode()


async def _shutting_down(send: Callable) -> None:
    body = json.dumps({"error": {"message": "the server shut down before this request finished",
                                 "type": "server_error", "param": None, "code": "shutting_down"}}).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def draining_server(app: Any, service: Any, *, host: str, port: int, drain_seconds: float = DRAIN_SECONDS) -> Any:
    """A uvicorn server over `app` that drains `service` for at most `drain_seconds` on a signal."""
    import uvicorn
    from sse_starlette.sse import AppStatus

    shutdown = Shutdown(drain_seconds)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:  # uvicorn forces only on a second SIGINT; any second signal does
                self.force_exit = True
            service.worker.drain()
            AppStatus.should_exit = True  # streams without a grace period (MCP's GET) end now
            shutdown.begin()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(CutAtDeadline(app, shutdown), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=drain_seconds + BACKSTOP_SECONDS)
    return DrainingServer(config)
