"""The bridge between request handlers (asyncio) and the model worker thread, and error bodies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request

from rigkit.errors import InputError, UpstreamError
from rigkit.serve.metrics import note_outcome
from rigkit.serve.schemas import RequestError, history_too_large
from rigkit.serve.service import RigService
from rigkit.serve.worker import Job

__all__ = ["Pipe", "ClientGone", "submit", "wait_job", "sse", "error_body", "error_of", "status_of", "RequestError",
           "check_history"]


def check_history(history: list[tuple[str, str]], param: str = "history") -> None:
    """Refuse (413) a history over the bounds before any model work is queued."""
    problem = history_too_large(history)
    if problem:
        raise RequestError(problem, param, status=413, code="history_too_large")


class ClientGone(Exception):
    """The client disconnected while its job waited or ran; nothing is sent."""


class Pipe:
    """Carries events from the worker thread to the request's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def submit(service: RigService, pipe: Pipe | None, fn: Callable[[Job], Any]) -> Job:
    """Queue `fn` on the worker (raises `Busy` / `Draining`); the pipe gets ("end", None) after.
    The answer it returns is stamped with the request's id and counted for its access-log line."""
    job = service.worker.submit(lambda job: note_outcome(fn(job)))
    if pipe is not None:
        job.future.add_done_callback(lambda _: pipe.put(("end", None)))
    return job


async def wait_job(request: Request, service: RigService, job: Job) -> Any:
    """The job's result; if the client disconnects meanwhile, cancel the job (slot freed)."""
    future = asyncio.wrap_future(job.future)
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=0.25)
            if done:
                return future.result()
            if await request.is_disconnected():
                service.worker.cancel(job)
                raise ClientGone()
    except asyncio.CancelledError:  # the server's drain deadline passed: nobody will read the answer
        service.worker.cancel(job)
        raise


def sse(events: AsyncIterator[dict[str, str]]) -> Any:
    from sse_starlette.sse import EventSourceResponse

    from rigkit.serve.shutdown import FINITE_STREAM_GRACE

    # an answer's stream ends by itself: on shutdown it runs on until the drain deadline
    return EventSourceResponse(events, sep="\n", shutdown_grace_period=FINITE_STREAM_GRACE)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape, so its SDK raises these with the message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_of(err: Exception) -> dict[str, Any]:
    """`err` in OpenAI's error shape; what `status_of` says it is answered with."""
    if isinstance(err, InputError):
        return error_body(str(err), param="question")
    if isinstance(err, RequestError):
        return error_body(str(err), param=err.param, code=err.code)
    if isinstance(err, UpstreamError):
        code = "upstream_timeout" if err.timed_out else "upstream_error"
        return error_body(str(err), kind="server_error", code=code)
    return error_body(f"{type(err).__name__}: {err}", kind="server_error", code="internal_error")


def status_of(err: Exception) -> int:
    """The HTTP status for a job's error: 422 bad input, 504 / 502 a server rigkit called missed
    its deadline / failed, else 500."""
    if isinstance(err, RequestError):
        return err.status
    if isinstance(err, InputError):
        return 422
    if isinstance(err, UpstreamError):
        return 504 if err.timed_out else 502
    return 500
