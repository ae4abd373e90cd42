"""`rigkit serve`'s own settings, checked before anything loads: each bad value is one line naming
the setting, never an error after the model has loaded or a traceback from the socket layer.

Also refused at start: a server whose retriever is itself (a `/retrieve` URL naming this server's
own port), since each of its searches would wait for a worker the search itself holds.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from rigkit.errors import InputError

__all__ = ["check_serve_options", "check_host_name", "check_not_own_retriever"]


def check_serve_options(*, port: int | None = None, max_body_bytes: int | None = None,
                        max_queue: int | None = None, workers: int | None = None,
                        tool_result_tokens: int | None = None) -> None:
    """Refuse values with no useful effect: each given one is checked."""
    if port is not None and not 0 <= port <= 65535:
        raise InputError(f"--port {port}: a TCP port is 0-65535 (0: any free one)")
    if max_body_bytes is not None and max_body_bytes < 1:
        raise InputError(f"--max-body-bytes {max_body_bytes}: at least 1 byte (every request would get 413)")
    if max_queue is not None and max_queue < 0:
        raise InputError(f"--max-queue {max_queue}: requests waiting for a worker, 0 or more")
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: at least 1")
    if tool_result_tokens is not None and tool_result_tokens < 1:
        raise InputError(f"--tool-result-tokens {tool_result_tokens}: at least 1 token per tool result")


def check_host_name(name: str) -> str:
    """A `Host` name this server may answer to (`--allow-host`): a name or address, not a URL."""
    text = name.strip()
    if not text or "/" in text or "@" in text or any(ch.isspace() for ch in text):
        raise ValueError(f"--allow-host {name!r}: give a host name such as rig.example.com (an address, "
                         "optionally :port), not a URL")
    return text


def check_not_own_retriever(urls: Iterable[str | None], host: str, port: int) -> None:
    """Refuse a retriever URL that is this very server (`host`:`port`)."""
    own = _addresses(host)
    for url in urls:
        if not url or not url.lower().startswith(("http://", "https://")):
            continue
        parts = urlsplit(url)
        try:
            their_port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue  # a malformed port: the retriever's own check names it
        if their_port == port and parts.hostname and _addresses(parts.hostname) & own:
            raise InputError(f"retriever {url} is this server itself (port {port}): each search would wait "
                             "for the worker that asked for it; give another retrieval server's URL, or "
                             "serve an index with --index / --corpus")


_WILDCARD = {"0.0.0.0", "::", ""}


def _addresses(host: str) -> set[str]:
    """The addresses `host` names; a wildcard bind stands for every local address."""
    name = host.strip("[]").lower()
    if name in _WILDCARD:
        return {"*"} | _addresses("localhost") | _addresses(socket.gethostname())
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return {name}
    if any(a.startswith("127.") or a == "::1" for a in found):
        found |= {"127.0.0.1", "::1"}  # any loopback address reaches a server bound to loopback
    return found | {name}
