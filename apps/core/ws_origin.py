"""The websocket Origin check: scheme, host AND port (issue 39).

Channels' ``AllowedHostsOriginValidator`` compares only the Origin's host with ``ALLOWED_HOSTS``,
so a page of any other service on the same host (``http://localhost:9``, or ``https://127.0.0.1``
for a server on ``http://127.0.0.1:8000``) could open a run socket with the viewer's cookies
(cross-site websocket hijacking). Here an Origin is allowed when it is, exactly:

* the handshake's own origin: the scheme the server serves (``wss``/``https`` when the server says so
  in the scope, or when ``SECURE_PROXY_SSL_HEADER`` names a header the proxy set), the ``Host``
  header's host (which must be in ``ALLOWED_HOSTS``) and its port (the scheme's default when
  absent), as Django's CSRF check compares an Origin with the request's own origin; or
* one of ``WEBSOCKET_ALLOWED_ORIGINS`` (default: ``SITE_URL`` and ``CSRF_TRUSTED_ORIGINS``):
  ``scheme://host[:port]``, ``*.`` before a host for its subdomains, as in ``CSRF_TRUSTED_ORIGINS``.

A handshake without an Origin, or with any other, is refused before the session, the user or the
consumer is touched: accepted only to be closed at once with ``CLOSE_ORIGIN_REFUSED`` and a reason
naming the setting (nothing is sent before the close), and logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http.request import split_domain_port, validate_host

logger = logging.getLogger(__name__)

CLOSE_ORIGIN_REFUSED = 4400
REFUSED_REASON = "origin not allowed (WEBSOCKET_ALLOWED_ORIGINS)"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str  # http | https
    host: str  # lower case, IPv6 without brackets; "*.example.com" in a pattern
    port: int

    def matches(self, origin: Origin) -> bool:
        if self.scheme != origin.scheme or self.port != origin.port:
            return False
        if self.host.startswith("*."):
            return origin.host.endswith(self.host[1:])  # a subdomain, never the bare domain
        return self.host == origin.host


def parse_origin(value: str, *, pattern: bool = False) -> Origin | None:
    """``scheme://host[:port]`` and nothing else (no path, user, query); None otherwise."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if "*" in host and not (pattern and host.startswith("*.") and "*" not in host[2:]):
        return None
    return Origin(scheme, host, port or _DEFAULT_PORTS[scheme])


@lru_cache(maxsize=8)
def _configured(entries: tuple[str, ...]) -> tuple[Origin, ...]:
    origins = []
    for entry in entries:
        origin = parse_origin(entry, pattern=True)
        if origin is None:
            raise ImproperlyConfigured(
                f"WEBSOCKET_ALLOWED_ORIGINS: {entry!r} is not an origin (scheme://host[:port], "
                "http or https, '*.' before a host for its subdomains)."
            )
        origins.append(origin)
    return tuple(origins)


def allowed_origins() -> tuple[Origin, ...]:
    """The configured origins (raises ImproperlyConfigured on a malformed entry)."""
    return _configured(tuple(getattr(settings, "WEBSOCKET_ALLOWED_ORIGINS", ()) or ()))


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin1")
    return None


def _secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") in ("wss", "https"):
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, expected = proxy  # e.g. ("HTTP_X_FORWARDED_PROTO", "https"), as request.is_secure()
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin1")
        got = _header(scope, header)
        return got is not None and got.split(",", 1)[0].strip() == expected
    return False


def own_origin(scope: dict[str, Any]) -> Origin | None:
    """The origin this handshake was made to, if its Host is one this server serves."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if _secure(scope) else "http"
    try:
        number = int(port) if port else _DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    return Origin(scheme, domain.strip("[]"), number)


def origin_refusal(scope: dict[str, Any]) -> str | None:
    """Why this handshake's Origin is refused (for the log), or None when it is allowed."""
    raw = _header(scope, b"origin")
    if raw is None:
        return "no Origin header"
    origin = parse_origin(raw)
    if origin is None:
        return f"malformed Origin {raw[:200]!r}"
    own = own_origin(scope)
    if own is not None and own.matches(origin):
        return None
    if any(allowed.matches(origin) for allowed in allowed_origins()):
        return None
    return f"Origin {raw[:200]!r} is neither this server's own origin nor in WEBSOCKET_ALLOWED_ORIGINS"


class OriginCheck:
    """ASGI middleware for websocket routes (in place of ``AllowedHostsOriginValidator``)."""

    def __init__(self, application: Any) -> None:
        self.application = application
        allowed_origins()  # a malformed setting stops the server at start, not at the first socket

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("OriginCheck guards websocket connections only")
        refusal = origin_refusal(scope)
        if refusal is None:
            return await self.application(scope, receive, send)
        client = scope.get("client") or ("?", 0)
        logger.warning("websocket %s from %s refused: %s", scope.get("path", "")[:200], client[0], refusal)
        message = await receive()
        if message.get("type") != "websocket.connect":
            return None  # the client left before its handshake finished
        # Accepted only to say why in a close frame (a rejected handshake is a bare HTTP 403).
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_ORIGIN_REFUSED, "reason": REFUSED_REASON})
        return None
