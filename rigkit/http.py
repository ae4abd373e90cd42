"""One HTTP client for the servers rigkit talks to: a model server (`generator.backend: openai`)
and a retrieval server (`RemoteRetriever`, `rigkit serve`'s `POST /retrieve`).

Retries come from `httpx-retries`' transport, not from a loop of our own: connection errors,
timeouts before an answer, and 429 / 502 / 503 / 504 are retried with jittered exponential
backoff, and a server's `Retry-After` is honoured up to `MAX_WAIT` seconds (`rigkit serve` answers
a full queue that way). POST is retried too: a completion or a search changes nothing on the
server. Every failure is one `RigkitError` line naming the server and the URL.

Environment proxies (`HTTPS_PROXY`, `NO_PROXY` ...) are read once per client, with the standard
library's rules, since a client talks to one server.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from typing import Any

import httpx
from httpx_retries import Retry, RetryTransport

from rigkit.errors import RigkitError

__all__ = ["ServerClient", "RETRY_STATUS", "MAX_WAIT"]

RETRY_STATUS = (429, 502, 503, 504)
MAX_WAIT = 30.0  # seconds: the longest single wait, whatever a server's Retry-After asks for


class ServerClient:
    """Requests to the server at `base_url`; one instance may serve several threads at once.

    `name` says what the server is in error messages ("model server"); failures raise `error`.
    `retries` is the number of tries after the first; `backoff` scales the waits between them
    (0 retries at once). `transport` replaces the network (tests pass `httpx.MockTransport`);
    the retries wrap it all the same.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        error: type[RigkitError] = RigkitError,
        api_key: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url, self.name, self.error, self.timeout = base_url.rstrip("/"), name, error, timeout
        retry = Retry(total=retries, backoff_factor=backoff, max_backoff_wait=MAX_WAIT,
                      status_forcelist=RETRY_STATUS, allowed_methods=("GET", "POST"))
        network = transport if transport is not None else httpx.HTTPTransport(proxy=_proxy_for(self.base_url))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout),
                                    transport=RetryTransport(network, retry))

    @property
    def headers(self) -> httpx.Headers:
        return self._client.headers

    def request(self, method: str, path: str = "", json: Any = None, stream: bool = False) -> httpx.Response:
        """The response to `method base_url+path` once it succeeds; any failure raises `error`.

        A streamed response (`stream=True`) is the caller's to close."""
        url = f"{self.base_url}{path}"
        try:
            response = self._client.send(self._client.build_request(method, url, json=json), stream=stream)
        except httpx.TimeoutException:
            raise self.error(f"the {self.name} at {url} did not answer within {self.timeout:g} s") from None
        except httpx.TransportError as err:
            raise self.error(
                f"cannot reach the {self.name} at {url} ({type(err).__name__}: {err}); is it running?"
            ) from None
        if response.status_code >= 400:
            raise self._refusal(response, url)
        return response

    def close(self) -> None:
        self._client.close()

    def _refusal(self, response: httpx.Response, url: str) -> RigkitError:
        try:
            response.read()
            detail = response.text.strip().replace("\n", " ")[:300]
        finally:
            response.close()
        status = response.status_code
        if status in (401, 403):
            return self.error(f"the {self.name} at {url} refused the request ({status}): check the API key")
        return self.error(f"the {self.name} at {url} answered {status}: {detail}")


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url`, or None (also when `NO_PROXY` covers its host)."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")
