"""`POST /v1/chat/completions`: server-side RIG, or the client-side `search` tool loop.

Without `tools` rigkit retrieves itself; the message carries the cited answer and `rig` holds the
retrievals, citations and rounds. With a `search` function in `tools`, a round where the decider
fires ends the response with `finish_reason: "tool_calls"`; the next request, carrying the
`role: "tool"` results, continues the same answer (see `rigkit.serve.service`). Intermediate
assistant messages carry the draft written so far; the final one carries the whole answer.

Streams use the held `TokenStream` mode: text reaches the client only once its segment is
accepted, because OpenAI's chunk format cannot take text back. Streamed content has no citation
tags; the last content chunk's `rig` field carries the cited answer and the citations.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from rigkit.build import uses_markers
from rigkit.serve import openai_compat as oa
from rigkit.serve.jobs import Pipe, check_history, error_of, sse, submit, wait_job
from rigkit.serve.schemas import ChatCompletionRequest, RequestError
from rigkit.serve.service import RigService, ToolStep, grounding_summary, round_summary
from rigkit.serve.tools import tools_refusal
from rigkit.trace import RIGResult

__all__ = ["complete"]


async def complete(service: RigService, body: ChatCompletionRequest, request: Request) -> Any:
    # the client's schemas are its program: checked in a thread, so /health and the rest stay live
    tools, conversation = await asyncio.to_thread(_read_request, body)
    check_history(conversation.history, "messages")
    kept, conversation.history = service.history_of(body.conversation, conversation.history)
    options = oa.ask_options(body, tools)
    if tools:  # a tool the run could never call is refused now, not left unanswered
        config = service.config.with_decider(options.decider)
        refusal = tools_refusal(tools, uses_markers(config), config.decider.name)
        if refusal:
            raise RequestError(refusal, "tools")
    completion = oa.Completion(body.model or service.model_name)
    stops = body.stop_strings()
    limit = options.max_tokens or service.config.generator.max_answer_tokens
    pipe = Pipe() if body.stream else None

    def work(job: Any) -> Any:
        on_event = (lambda e: pipe.put(("event", e))) if pipe else None
        if tools:
            outcome = service.tool_step(job, conversation.question, conversation.history, conversation.rounds,
                                        options, on_event=on_event, hold=True, tools=tools)
        else:
            outcome = service.ask(job, conversation.question, conversation.history, options, on_event=on_event,
                                  hold=True)
        return service.remember(kept, conversation.question, outcome)

    job = submit(service, pipe, work)
    if pipe is None:
        outcome = await wait_job(request, service, job)
        return JSONResponse(_response(completion, outcome, stops, limit, kept))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return sse(_stream(service, job, pipe, completion, stops, limit, include_usage, kept))


def _read_request(body: ChatCompletionRequest) -> tuple[dict[str, Any] | None, oa.Conversation]:
    tools = oa.check_tools(body)
    return tools, oa.parse_messages(body.messages, tools)


def _response(completion: oa.Completion, outcome: RIGResult | ToolStep, stops: list[str], limit: int,
              conversation: str | None = None) -> dict:
    named = {"conversation": conversation} if conversation else {}
    if isinstance(outcome, ToolStep) and outcome.result is None:
        message = oa.tool_call_message(outcome.calls, outcome.draft)
        usage = oa.usage_of(outcome.tokens)
        return completion.response(message, "tool_calls", usage,
                                   {"draft": outcome.draft, "queries": outcome.queries, **named})
    result = outcome.result if isinstance(outcome, ToolStep) else outcome
    assert result is not None
    answer, stopped = oa.cut_at_stop(result.answer, stops)
    finish = "stop" if stopped else _finish_reason(result, limit)
    return completion.response({"role": "assistant", "content": answer}, finish, oa.usage_of(result.tokens),
                               {**_rig(result), **named})


def _finish_reason(result: RIGResult, limit: int) -> str:
    last = result.rounds[-1].segment if result.rounds else None
    ended = last is not None and last.finished
    return "length" if not ended and result.tokens.get("generated", 0) >= limit else "stop"


def _rig(result: RIGResult) -> dict[str, Any]:
    return {
        "answer": result.answer,
        "used_retrieval_times": result.used_retrieval_times,
        "citations": result.citations,
        "low_confidence": result.low_confidence,
        **grounding_summary(result),
        "rounds": [round_summary(r) for r in result.rounds],
        "timings": result.timings,
        "tokens": result.tokens,
    }


async def _stream(service: RigService, job: Any, pipe: Any, completion: oa.Completion, stops: list[str],
                  limit: int, include_usage: bool, conversation: str | None = None) -> AsyncIterator[dict[str, str]]:
    def frame(data: dict) -> dict[str, str]:
        return {"data": json.dumps(data, ensure_ascii=False)}

    answer = _StopCut(stops)
    try:
        yield frame(completion.chunk({"role": "assistant", "content": ""}))
        async for piece in _answer_pieces(pipe):
            if text := answer.add(piece):
                yield frame(completion.chunk({"content": text}))
            if answer.stopped:
                break
        if answer.stopped:
            yield frame(completion.chunk({}, "stop"))
            if not include_usage:
                service.worker.cancel(job)  # a stop string: the rest would not be sent anyway
                yield {"data": "[DONE]"}
                return
            async for _ in _answer_pieces(pipe):
                pass  # the usage counts the whole run, as the non-streamed response's does
        elif text := answer.flush():  # the answer ended on what only looked like a stop string's start
            yield frame(completion.chunk({"content": text}))
        try:
            outcome = job.future.result()
        except Exception as err:  # noqa: BLE001 - the stream's one outcome is this error frame
            yield frame(error_of(err))
            yield {"data": "[DONE]"}
            return
        tool_turn = isinstance(outcome, ToolStep) and outcome.result is None
        if tool_turn:
            usage = oa.usage_of(outcome.tokens)
        else:
            result = outcome.result if isinstance(outcome, ToolStep) else outcome
            usage = oa.usage_of(result.tokens)
        if tool_turn and not answer.stopped:
            for chunk in completion.tool_call_chunks(outcome.calls):
                yield frame(chunk)
            yield frame(completion.chunk({}, "tool_calls"))
        elif not answer.stopped:
            named = {"conversation": conversation} if conversation else {}
            yield frame(completion.chunk({}, _finish_reason(result, limit), rig={**_rig(result), **named}))
        if include_usage:
            yield frame(completion.usage_chunk(usage))
        yield {"data": "[DONE]"}
    finally:
        if not job.future.done():
            service.worker.cancel(job)


async def _answer_pieces(pipe: Any) -> AsyncIterator[str]:
    """The answer text the run streams, piece by piece, until the run ends."""
    while True:
        kind, payload = await pipe.queue.get()
        if kind == "end":
            return
        if kind == "event" and payload.kind == "token":  # held mode never retracts; rounds go in `rig`
            yield payload.text


class _StopCut:
    """The streamed answer cut at the first stop string: text that could be a stop string's start
    is held back until the next piece shows it is not, so no part of a stop string is ever sent."""

    def __init__(self, stops: list[str]):
        self.stops, self.text, self.sent, self.stopped = stops, "", 0, False

    def add(self, piece: str) -> str:
        """What may be sent now that `piece` came."""
        self.text, self.stopped = oa.cut_at_stop(self.text + piece, self.stops)
        ready = len(self.text) if self.stopped else len(self.text) - oa.stop_prefix_length(self.text, self.stops)
        return self._send(ready)

    def flush(self) -> str:
        """The held-back end, once the answer is over."""
        return self._send(len(self.text))

    def _send(self, upto: int) -> str:
        out = self.text[self.sent:upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out
