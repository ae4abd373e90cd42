"""Who may reach the server: the `Host` rule (DNS rebinding) and the `Origin` rule (other sites).

A page on any web site can make the visitor's browser send requests to a server on their machine.
Two attacks follow, and one guard in front of every route (the API, `/mcp`, `/openapi.json`)
stops both:

- *DNS rebinding*: the page's own name (`evil.example`) is re-pointed at 127.0.0.1, so the browser
  treats the server as the page's own origin and reads every answer; its requests still carry
  `Host: evil.example`. Only the bind address (loopback names when bound to loopback; any IP
  address and this machine's names when bound to all interfaces) and names the operator lists
  are served; an IP address in `Host` cannot come from a rebinding, a name can.
- *Cross-origin requests*: a page's `fetch` carries `Origin`. CORS alone only hides the answer
  from the page; the request would still run (and spend the model), so an `Origin` that is not
  the server's own and not in the allow-list is refused outright with 403. Allowed origins get
  CORS headers (Starlette's `CORSMiddleware`), so a listed web app can read the answers.

Starlette's `TrustedHostMiddleware` is not used for the `Host` rule: it splits the header on the
first ":" (so `[::1]:8100` is always refused) and answers a bare "Invalid host header" that does
not say how to allow a name.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Exposure", "is_loopback", "install_exposure", "not_json"]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARD = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (`127.0.0.1`, `::1`, `localhost`)."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def not_json(content_type: str | None) -> str | None:
    """The media type of a body that is not `application/json`, else None. Text and form bodies
    are what a page may post cross-site without a CORS preflight: the API refuses them (415)."""
    media = (content_type or "").partition(";")[0].strip().lower()
    return None if media == "application/json" else media or "none"


def _ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _hostname(authority: str) -> str:
    """`[::1]` -> `::1`, `localhost:8100` -> `localhost`: the host part of a `Host` header."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


@dataclass(frozen=True)
class Exposure:
    """The bind address plus the allow-lists: extra `Host` names and browser origins.

    `origins` entries are `scheme://host[:port]` (as browsers send `Origin`), or `*` for any.
    """

    bind: str = "127.0.0.1"
    hosts: tuple[str, ...] = ()  # names this server also answers to (e.g. behind a proxy)
    origins: tuple[str, ...] = ()  # browser origins allowed to call the API

    def __post_init__(self) -> None:
        # browsers send origins lower-case and without a trailing slash
        object.__setattr__(self, "origins", tuple(o.strip().rstrip("/").lower() for o in self.origins))
        from rigkit.serve.options import check_host_name

        object.__setattr__(self, "hosts", tuple(check_host_name(h) for h in self.hosts))
        for origin in self.origins:
            parts = urlsplit(origin)
            if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                                  or parts.path not in ("", "/")):
                raise ValueError(f"--allow-origin {origin!r}: give scheme://host[:port], "
                                 "e.g. http://localhost:3000 (or * for any)")

    @property
    def wildcard(self) -> bool:
        return self.bind in _WILDCARD

    @cached_property
    def served_names(self) -> frozenset[str]:
        """The hosts a request's `Host` may name (besides IP addresses we listen on); computed once,
        since the machine's fully qualified name can take a DNS lookup."""
        names = {_hostname(h) if not _ip(h) else h.lower() for h in self.hosts}
        if self.wildcard:
            names |= {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
        elif is_loopback(self.bind):
            names.add("localhost")
        else:
            names.add(self.bind.strip("[]").lower())
        return frozenset(names)

    def host_allowed(self, authority: str) -> bool:
        host = _hostname(authority)
        if host in self.served_names:
            return True
        if not _ip(host):
            return False
        # an address cannot come from a rebinding; it only has to be one this server listens on
        return self.wildcard or (is_loopback(host) and is_loopback(self.bind))

    def origin_allowed(self, origin: str, authority: str) -> bool:
        """The page's own origin is this server (same host and port) or it is in the allow-list."""
        origin = origin.strip().lower()
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc.lower() == authority.strip().lower()


def install_exposure(app: Any, exposure: Exposure) -> None:
    """Add the guard (outermost) and CORS headers for the allowed origins; call after other middleware."""
    from starlette.middleware.cors import CORSMiddleware

    if exposure.origins:
        # preflights from an allowed origin are answered here, before bearer auth (browsers send none)
        app.add_middleware(CORSMiddleware, allow_origins=list(exposure.origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["authorization", "content-type", "mcp-session-id", "mcp-protocol-version"],
                           expose_headers=["retry-after", "mcp-session-id"])
    app.add_middleware(_ExposureGuard, exposure=exposure)


class _ExposureGuard:
    """ASGI middleware: 421 for a `Host` this server does not answer to, 403 for a foreign `Origin`."""

    def __init__(self, app: Any, exposure: Exposure):
        self.app, self.exposure = app, exposure

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        authority = headers.get("host", "")
        if not self.exposure.host_allowed(authority):
            return await _refuse(send, 421, f"this server does not answer to Host {authority!r} (a DNS-rebinding "
                                 "guard); serve that name with --allow-host NAME", "host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self.exposure.origin_allowed(origin, authority):
            return await _refuse(send, 403, f"cross-origin request from {origin!r} refused; allow that web "
                                 "app with --allow-origin ORIGIN", "origin_not_allowed")
        await self.app(scope, receive, send)


async def _refuse(send: Callable, status: int, message: str, code: str) -> None:
    from rigkit.serve.jobs import error_body

    body = json.dumps(error_body(message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
