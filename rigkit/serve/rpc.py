"""`POST /rpc`: JSON-RPC 2.0 over the same service (`rig.ask`, `rig.search`, `rig.models`).

Batches run their calls in order; notifications (no `id`) get no reply. A batch holds at most 64
calls and 256 `rig.search` queries in all (one `/retrieve` call's cap), else one -32600 error
and no call runs. Standard codes: -32700
parse error, -32600 invalid request, -32601 unknown method, -32602 invalid params, -32603
internal; -32000 is a full queue (HTTP 429 with `Retry-After` when the request was a single call).
A body sent as anything but `application/json` is refused with HTTP 415.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from rigkit.errors import InputError, UpstreamError
from rigkit.serve.exposure import not_json
from rigkit.serve.jobs import error_body, error_of, status_of, submit, wait_job
from rigkit.serve.metrics import note_searches
from rigkit.serve.schemas import (
    MAX_QUERIES,
    AskParams,
    RequestError,
    SearchParams,
    history_too_large,
    lone_surrogate_at,
)
from rigkit.serve.service import AskOptions, RigService
from rigkit.serve.worker import Busy, Draining

__all__ = ["add_rpc", "MAX_BATCH", "PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS"]

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
SERVER_BUSY = -32000
MAX_BATCH = 64  # calls in one batch: they run in order, so one request holds the server for all of them


class _RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def add_rpc(app: FastAPI, service: RigService) -> None:
    @app.post("/rpc")
    async def rpc(request: Request) -> Response:
        media_type = not_json(request.headers.get("content-type"))
        if media_type:
            return JSONResponse(error_body(f"/rpc takes Content-Type: application/json, not {media_type!r}",
                                           param="content-type", code="unsupported_media_type"), status_code=415)
        try:
            payload = json.loads(await request.body(), parse_constant=_no_constant)
            broken = lone_surrogate_at(payload)
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, NaN, bytes that are not UTF-8
            return JSONResponse(_error(None, PARSE_ERROR, f"parse error: {err}"))
        except RecursionError:
            return JSONResponse(_error(None, PARSE_ERROR, "parse error: the JSON is nested too deeply"))
        if broken:  # it could not even be echoed back (an `id`, a method name)
            return JSONResponse(_error(None, INVALID_REQUEST, f"invalid request: a lone surrogate in {broken}: "
                                       "text must be valid Unicode (UTF-8)"))
        if isinstance(payload, list):
            if not payload:
                return JSONResponse(_error(None, INVALID_REQUEST, "an empty batch"))
            if (problem := _batch_too_large(payload)) is not None:
                return JSONResponse(problem)
            replies = [r for r in [await _call(service, request, item) for item in payload] if r is not None]
            return JSONResponse(replies) if replies else Response(status_code=204)
        reply = await _call(service, request, payload)
        if reply is None:
            return Response(status_code=204)
        busy = reply.get("error", {}).get("code") == SERVER_BUSY
        headers = {"Retry-After": str(reply["error"]["data"]["retry_after"])} if busy else None
        return JSONResponse(reply, status_code=429 if busy else 200, headers=headers)


def _batch_too_large(batch: list[Any]) -> dict[str, Any] | None:
    """The error for a batch over `MAX_BATCH` calls or `MAX_QUERIES` rig.search queries in all
    (what one /retrieve call may ask), checked before any call runs; None when within both."""
    if len(batch) > MAX_BATCH:
        return _error(None, INVALID_REQUEST, f"invalid request: a batch of {len(batch)} calls, over the limit of "
                      f"{MAX_BATCH}; send at most {MAX_BATCH} per batch", {"limit": MAX_BATCH, "calls": len(batch)})
    queries = sum(_queries_in(item) for item in batch)
    if queries > MAX_QUERIES:
        return _error(None, INVALID_REQUEST, f"invalid request: the batch's rig.search calls ask {queries} queries, "
                      f"over the limit of {MAX_QUERIES} per request", {"limit": MAX_QUERIES, "queries": queries})
    return None


def _queries_in(item: Any) -> int:
    params = item.get("params") if isinstance(item, dict) and item.get("method") == "rig.search" else None
    if not isinstance(params, dict):
        return 0
    queries = params.get("queries")
    return len(queries) if isinstance(queries, list) else 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def _call(service: RigService, request: Request, item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0" or not isinstance(item.get("method"), str):
        return _error(item.get("id") if isinstance(item, dict) else None, INVALID_REQUEST,
                      "invalid request: needs jsonrpc '2.0' and a string method")
    call_id, notification = item.get("id"), "id" not in item
    params = item.get("params", {})
    try:
        if not isinstance(params, dict):
            raise _RpcError(INVALID_PARAMS, "params must be an object (named parameters)")
        result = await _dispatch(service, request, item["method"], params)
    except RecursionError:
        return None if notification else _error(call_id, INVALID_PARAMS, "invalid params: nested too deeply")
    except _RpcError as err:
        return None if notification else _error(call_id, err.code, err.message, err.data)
    return None if notification else {"jsonrpc": "2.0", "id": call_id, "result": result}


async def _dispatch(service: RigService, request: Request, method: str, params: dict[str, Any]) -> Any:
    import asyncio

    if method == "rig.models":
        return service.model_ids()
    if method == "rig.search":
        p = _params(SearchParams, params)
        queries = p.queries if p.queries is not None else ([p.query] if p.query is not None else None)
        if not queries:  # each one given was checked by SearchParams
            raise _RpcError(INVALID_PARAMS, "invalid params: give a non-empty query or queries")
        try:
            hits = await asyncio.to_thread(service.search, queries, p.topk, p.filters, p.source)
            note_searches(len(queries))
        except InputError as err:  # an unknown source, a filter the index cannot answer (unknown key, no match)
            field = "source" if p.source and "source" in str(err) else "filters"
            raise _RpcError(INVALID_PARAMS, f"invalid params: {err}", {"field": field}) from err
        except UpstreamError as err:  # the source asked for (or every source) is down: as /retrieve's 502
            raise _RpcError(INTERNAL, str(err), {"status": status_of(err), "code": error_of(err)["error"]["code"]}) from err
        result = [[{"id": h.chunk_id, "title": h.title, "text": h.text, "score": h.score} for h in q] for q in hits]
        return result[0] if p.queries is None else result
    if method == "rig.ask":
        p = _params(AskParams, params)
        history = [tuple(pair) for pair in p.history]
        problem = history_too_large(history)
        if problem:
            raise _RpcError(INVALID_PARAMS, f"invalid params: {problem}", {"field": "history"})
        options = AskOptions(**p.options.model_dump())
        try:
            conversation, history = service.history_of(p.conversation, history)
            job = submit(service, None, lambda job: service.remember(
                conversation, p.question, service.ask(job, p.question, history, options)))
            result = await wait_job(request, service, job)
        except Busy as err:
            raise _RpcError(SERVER_BUSY, str(err), {"retry_after": err.retry_after}) from err
        except Draining as err:
            raise _RpcError(SERVER_BUSY, str(err), {"retry_after": 0}) from err
        except InputError as err:
            raise _RpcError(INVALID_PARAMS, f"invalid params: {err}") from err
        except RequestError as err:  # e.g. a conversation that is unknown or has expired
            raise _RpcError(INVALID_PARAMS, f"invalid params: {err}", {"field": err.param, "code": err.code}) from err
        except UpstreamError as err:  # the model server failed (502) or missed its deadline (504)
            raise _RpcError(INTERNAL, str(err), {"status": status_of(err), "code": error_of(err)["error"]["code"]}) from err
        except Exception as err:  # noqa: BLE001 - reported to the caller as an internal error
            raise _RpcError(INTERNAL, f"{type(err).__name__}: {err}") from err
        return {**json.loads(result.to_json()), **({"conversation": conversation} if conversation else {})}
    raise _RpcError(METHOD_NOT_FOUND, f"method not found: {method!r}; methods: rig.ask, rig.search, rig.models")


def _params(model: Any, params: dict[str, Any]) -> Any:
    try:
        return model.model_validate(params)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise _RpcError(INVALID_PARAMS, f"invalid params: {where}: {first.get('msg')}", {"field": where}) from err


def _error(call_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": call_id, "error": error}
