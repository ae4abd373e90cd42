"""One HTTP client for the servers rigkit talks to: a model server (`generator.backend: openai`)
and a retrieval server (`RemoteRetriever`, `rigkit serve`'s `POST /retrieve`).

Retries come from `httpx-retries`' transport, not from a loop of our own: connection errors,
timeouts before an answer, and 429 / 502 / 503 / 504 are retried with jittered exponential
backoff, and a server's `Retry-After` is honoured up to `MAX_WAIT` seconds (`rigkit serve` answers
a full queue that way). POST is retried too: a completion or a search changes nothing on the
server. Every failure is one `UpstreamError` line naming the server and the URL.

`timeout` is the whole call's deadline, not a per-read limit: connecting, every try, and reading
the full answer (a streamed one included) end within it, however slowly a server drips its bytes.
httpx has only per-operation timeouts, so each try is read by a worker thread and the caller waits
on it against the deadline. No try starts after the deadline; a wait between tries (at most
`MAX_WAIT`) that would end past the deadline, or a `Retry-After` that asks for one, is not
waited: the call fails at once, saying the status (429 ...), the wait asked for (`Retry-After`)
and the tries so far, so a call ends within `timeout` seconds. A server that keeps answering 429 is told about in the log before each wait,
and the final error says how many tries over how many seconds.

Environment proxies (`HTTPS_PROXY`, `NO_PROXY` ...) are read once per client, with the standard
library's rules, since a client talks to one server.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_retries import Retry, RetryTransport

from rigkit.errors import UpstreamError

__all__ = ["ServerClient", "RETRY_STATUS", "MAX_WAIT"]

log = logging.getLogger(__name__)

RETRY_STATUS = (429, 502, 503, 504)
MAX_WAIT = 30.0  # seconds: the longest single wait, whatever a server's Retry-After asks for
_CALL = "rigkit.call"  # the request extension carrying the call's deadline and its tries


@dataclass
class _Call:
    """One call as the transports see it: its deadline and what each try got."""

    name: str
    url: str
    timeout: float
    started: float = field(default_factory=time.monotonic)
    tries: list[str] = field(default_factory=list)  # "429", "ConnectError", ...

    @property
    def deadline(self) -> float:
        return self.started + self.timeout

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class _DeadlinePassed(httpx.TransportError):
    """The call's deadline passed (not retried: the deadline covers the retries too)."""


class _WaitPastDeadline(httpx.TransportError):
    """A busy answer whose wait (Retry-After or backoff) would end past the call's deadline."""

    def __init__(self, status: int, wait: float, retry_after: str | None, request: httpx.Request):
        super().__init__(f"{status}: retry in {wait:g} s", request=request)
        self.status, self.wait, self.retry_after = status, wait, retry_after


class ServerClient:
    """Requests to the server at `base_url`; one instance may serve several threads at once.

    `name` says what the server is in error messages ("model server"); failures raise `error`.
    `timeout` is each call's deadline in seconds, everything included. `retries` is the number
    of tries after the first; `backoff` scales the waits between them (0 retries at once).
    `transport` replaces the network (tests pass `httpx.MockTransport`); the deadline and the
    retries wrap it all the same.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        error: type[UpstreamError] = UpstreamError,
        api_key: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url, self.name, self.error, self.timeout = base_url.rstrip("/"), name, error, timeout
        self.retries = retries
        retry = _NoticedRetry(total=retries, backoff_factor=backoff, max_backoff_wait=MAX_WAIT,
                              status_forcelist=RETRY_STATUS, allowed_methods=("GET", "POST"))
        network = transport if transport is not None else httpx.HTTPTransport(proxy=_proxy_for(self.base_url))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout),
                                    transport=RetryTransport(_DeadlineTransport(network), retry))

    @property
    def headers(self) -> httpx.Headers:
        return self._client.headers

    def request(self, method: str, path: str = "", json: Any = None, stream: bool = False) -> httpx.Response:
        """The response to `method base_url+path` once it succeeds; any failure raises `error`.

        A streamed response (`stream=True`) is the caller's to close; reading it raises httpx
        errors (`stream_lines` turns them into `error`)."""
        url = f"{self.base_url}{path}"
        call = _Call(self.name, url, self.timeout)
        request = self._client.build_request(method, url, json=json, extensions={_CALL: call})
        try:
            response = self._client.send(request, stream=stream)
        except httpx.HTTPError as err:
            raise self._failure(err, call) from None
        if 300 <= response.status_code < 400:
            response.close()
            where = response.headers.get("location", "?")
            raise self.error(f"the {self.name} at {url} redirected ({response.status_code}) to {where}: "
                             "give the API root itself as the URL")
        if response.status_code >= 400:
            raise self._refusal(response, call)
        if response.status_code in (204, 205):
            response.close()
            raise self.error(f"the {self.name} at {url} answered {response.status_code} with no content")
        return response

    def stream_lines(self, method: str, path: str = "", json: Any = None) -> Iterator[str]:
        """The lines of a streamed answer as they arrive, within the call's deadline.

        Closing the iterator early closes the connection (a server stops generating)."""
        url = f"{self.base_url}{path}"
        response = self.request(method, path, json, stream=True)
        try:
            yield from response.iter_lines()
        except httpx.HTTPError as err:
            raise self._failure(err, response.request.extensions.get(_CALL) or _Call(self.name, url, self.timeout),
                                while_reading=True) from None
        except UnicodeDecodeError as err:
            raise self.error(f"the {self.name} at {url} sent a stream that is not UTF-8 ({err.reason})") from None
        finally:
            response.close()

    def close(self) -> None:
        self._client.close()

    def _failure(self, err: httpx.HTTPError, call: _Call, while_reading: bool = False) -> UpstreamError:
        name, url = self.name, call.url
        if isinstance(err, _WaitPastDeadline):
            asked = f"Retry-After: {err.retry_after}" if err.retry_after else f"a {err.wait:.1f} s backoff"
            left = max(0.0, call.deadline - time.monotonic())
            return self.error(f"the {name} at {url} answered {err.status} and asked for a wait ({asked}) past "
                              f"the call's deadline, {left:.1f} s away: no answer within {self.timeout:g} s "
                              f"({_tries(call)})", timed_out=True, status=err.status)
        if isinstance(err, _DeadlinePassed):
            tries = f" ({_tries(call)})" if len(call.tries) > 1 else ""
            doing = "finish its answer" if while_reading else "answer"
            return self.error(f"the {name} at {url} did not {doing} within {self.timeout:g} s, "
                              f"the deadline of one call{tries}", timed_out=True)
        if isinstance(err, httpx.TimeoutException):
            return self.error(f"the {name} at {url} did not answer within {self.timeout:g} s", timed_out=True)
        if while_reading:
            return self.error(f"the {name} at {url} broke off its answer ({type(err).__name__}: {err})")
        return self.error(f"cannot reach the {name} at {url} ({type(err).__name__}: {err}); is it running?")

    def _refusal(self, response: httpx.Response, call: _Call) -> UpstreamError:
        try:
            response.read()
            detail = response.text.strip().replace("\n", " ")[:300]
        except httpx.HTTPError:
            detail = "(its body could not be read)"
        finally:
            response.close()
        status, url = response.status_code, call.url
        if status in (401, 403):
            return self.error(f"the {self.name} at {url} refused the request ({status}): check the API key")
        if status in RETRY_STATUS and len(call.tries) > 1:
            return self.error(f"the {self.name} at {url} answered {status} ({_tries(call)}): {detail}", status=status)
        return self.error(f"the {self.name} at {url} answered {status}: {detail}", status=status)


def _tries(call: _Call) -> str:
    return f"{len(call.tries)} tries over {call.elapsed():.1f} s: {', '.join(call.tries)}"


class _NoticedRetry(Retry):
    """httpx-retries' policy, saying in the log what it waits for and how long it may keep trying."""

    def sleep(self, response: httpx.Response | Exception) -> None:
        call = response.request.extensions.get(_CALL) if isinstance(response, httpx.Response) else None
        if call is not None:
            wait = self._calculate_sleep(response.headers)
            # the deadline is total: no wait past it, and none at all where the server asks for
            # one past it (`Retry-After: 3600`): a capped wait would only ask again too early
            if time.monotonic() + max(wait, self._asked_wait(response.headers)) >= call.deadline:
                raise _WaitPastDeadline(response.status_code, wait, response.headers.get("retry-after"),
                                        request=response.request)
            log.warning("the %s at %s answered %s (try %d of %d): retrying in %.1f s, until the "
                        "call's %g s deadline", call.name, call.url, response.status_code, self.attempts_made, self.total + 1,
                        wait, call.timeout)
        super().sleep(response)

    def _asked_wait(self, headers: httpx.Headers) -> float:
        """The wait a `Retry-After` asks for, uncapped (0 without one, or one that is no time)."""
        asked = headers.get("retry-after", "").strip()
        try:
            return max(0.0, self.parse_retry_after(asked)) if asked else 0.0
        except ValueError:
            return 0.0


class _DeadlineTransport(httpx.BaseTransport):
    """Runs each try on a worker thread so that the caller stops at the call's deadline, whether
    the server is silent, drips its headers or drips its body (`SyncByteStream` below)."""

    def __init__(self, network: httpx.BaseTransport):
        self.network = network

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call: _Call | None = request.extensions.get(_CALL)
        if call is None:
            return self.network.handle_request(request)
        if time.monotonic() >= call.deadline:
            raise _DeadlinePassed("the call's deadline passed before this try", request=request)
        channel = _Channel(call.deadline, request)
        threading.Thread(target=channel.fill, args=(self.network,), daemon=True, name="rigkit-http").start()
        try:
            _, response = channel.next()
        except httpx.TransportError as err:
            call.tries.append(type(err).__name__)
            raise
        call.tries.append(str(response.status_code))
        return httpx.Response(response.status_code, headers=response.headers, stream=channel,
                              extensions=response.extensions, request=request)

    def close(self) -> None:
        self.network.close()


class _Channel(httpx.SyncByteStream):
    """What the worker read (the response, then its body's chunks), handed over under a deadline.

    The worker reads a chunk only when the caller asks for one, so a caller that stops reading
    (the stop rule's cut) leaves the rest unread, as without the worker."""

    def __init__(self, deadline: float, request: httpx.Request):
        self.deadline, self.request = deadline, request
        self._items: queue.Queue = queue.Queue()
        self._wanted = threading.Semaphore(0)
        self._closed = threading.Event()

    def fill(self, network: httpx.BaseTransport) -> None:
        """Worker thread: send the request, then read the body until it ends or the reader leaves."""
        try:
            response = network.handle_request(self.request)
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            self._items.put(("error", err))
            return
        try:
            self._items.put(("response", response))
            if self._closed.is_set():  # the caller gave up while the server was still silent
                return
            chunks = iter(response.stream)
            while self._wanted.acquire() and not self._closed.is_set():
                chunk = next(chunks, None)
                self._items.put(("end", None) if chunk is None else ("chunk", chunk))
                if chunk is None:
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            self._items.put(("error", err))
        finally:
            response.close()

    def next(self) -> tuple[str, Any]:
        """The worker's next item ("response", "chunk" or "end"); its error is raised here."""
        remaining = self.deadline - time.monotonic()
        try:
            kind, value = self._items.get(timeout=remaining) if remaining > 0 else self._items.get_nowait()
        except queue.Empty:
            self.close()
            raise _DeadlinePassed("the call's deadline passed", request=self.request) from None
        if kind == "error":
            raise value
        return kind, value

    def __iter__(self) -> Iterator[bytes]:
        while True:
            self._wanted.release()
            kind, chunk = self.next()
            if kind == "end":
                return
            yield chunk

    def close(self) -> None:
        self._closed.set()
        self._wanted.release()  # a worker waiting to be asked for more sees the close


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url`, or None (also when `NO_PROXY` covers its host)."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")
