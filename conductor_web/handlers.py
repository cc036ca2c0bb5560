"""HTTP under daphne: ``/v1`` through a handler whose middleware never leaves the event loop.

Django's chain (``settings.MIDDLEWARE``) is built for the browser pages: sessions, CSRF, login,
messages and the login throttle are synchronous, so an async view behind them costs a request a
thread made for it and a crossing to it and back per synchronous section, and Django's own header
middleware adds two thread hops each in an async chain. The ``/v1`` API reads none of that state
(an API key authenticates it, its views are CSRF-exempt and never touch a session), so
`ApiASGIHandler` builds the same chain without the browser-only middleware, with the header
middleware swapped for the inline variants of ``apps.core.middleware``. Every response still
carries the security, CSP and framing headers and goes through the input limits, and a middleware an
operator adds to MIDDLEWARE applies to ``/v1`` too unless it is named in `BROWSER_ONLY`.

The request gets no per-request thread either (Django opens a ``ThreadSensitiveContext`` per
request): its database work runs on ``apps.core.executor_db.off_loop``'s kept threads, and the
two small synchronous calls Django itself makes (the ``request_started`` / ``request_finished``
receivers) go to asgiref's one shared thread (issue #15).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponse
from django.utils.module_loading import import_string

from apps.api.v1.auth import new_request_id
from apps.api.v1.middleware import PREFIX as V1_PREFIX
from apps.core.executor_db import served_on_loop
from apps.core.request_context import current_request_meta, set_request_meta

logger = logging.getLogger(__name__)

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

API_PREFIXES = (V1_PREFIX,)
MCP_PATH = "/mcp"

# Middleware for browser sessions: the /v1 chain leaves these out.
BROWSER_ONLY = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "apps.core.middleware.LoginRequiredMiddleware",
        "axes.middleware.AxesMiddleware",
    }
)
# Header middleware whose hooks do no I/O, and their inline variants.
INLINE = {
    "django.middleware.security.SecurityMiddleware": "apps.core.middleware.SecurityMiddleware",
    "csp.middleware.CSPMiddleware": "apps.core.middleware.CSPMiddleware",
    "django.middleware.common.CommonMiddleware": "apps.core.middleware.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "apps.core.middleware.XFrameOptionsMiddleware",
}


# The header middleware of the /v1 chain that /mcp answers get too (security, CSP, framing).
HEADER_ONLY = frozenset(
    {
        "django.middleware.security.SecurityMiddleware",
        "csp.middleware.CSPMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    }
)


def api_middleware(middleware: list[str]) -> list[str]:
    return [INLINE.get(path, path) for path in middleware if path not in BROWSER_ONLY]


@contextmanager
def _middleware_setting(middleware: list[str]) -> Iterator[None]:
    # BaseHandler.load_middleware reads settings.MIDDLEWARE and nothing else; this runs once, while
    # the ASGI application is imported, before any request is served.
    full = settings.MIDDLEWARE
    settings.MIDDLEWARE = middleware
    try:
        yield
    finally:
        settings.MIDDLEWARE = full


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler with the ``/v1`` chain (`api_middleware`), no per-request thread."""

    def load_middleware(self, is_async: bool = False) -> None:
        with _middleware_setting(api_middleware(list(settings.MIDDLEWARE))):
            super().load_middleware(is_async)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        with served_on_loop():
            await self.handle(scope, receive, send)


def http_application(pages: ASGIApp, api: ASGIApp, mcp: ASGIApp | None = None) -> ASGIApp:
    """``api`` for paths under `API_PREFIXES` (below the mount point), ``mcp`` for ``/mcp`` (the
    governed tool endpoint, issue 43: the SDK's own transport, key-authenticated), ``pages`` for
    the rest."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if mcp is not None and path in (MCP_PATH, MCP_PATH + "/"):
            await mcp(scope, receive, send)
            return
        target = api if path.startswith(API_PREFIXES) else pages
        await target(scope, receive, send)

    return app


def _header_chain() -> list[Any]:
    """The /v1 chain's header middleware (inline variants), in MIDDLEWARE order."""
    return [import_string(INLINE[p])(lambda r: None) for p in settings.MIDDLEWARE if p in HEADER_ONLY]


def _secure_headers(
    scope: dict[str, Any], chain: list[Any], status: int, headers: list[tuple[bytes, bytes]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """``headers`` as the /v1 chain's header middleware would leave them, plus x-request-id."""
    request = ASGIRequest(scope, io.BytesIO())
    response = HttpResponse(status=status)
    del response["Content-Type"]  # only what the transport set
    for name, value in headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    for middleware in reversed(chain):  # process_response runs bottom-up
        response = middleware.process_response(request, response)
    response["x-request-id"] = request_id
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]


def with_api_headers(inner: ASGIApp) -> ASGIApp:
    """Wrap an ASGI app that answers outside Django (``/mcp``, the SDK's own transport): every
    answer carries the security, CSP and framing headers of ``/v1`` and an ``x-request-id`` (also
    on the audit rows the request writes), and an unexpected error is a JSON-RPC error naming the
    request id, never a traceback or an exception's text."""
    chain: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not chain:
            chain.extend(_header_chain())
        request_id = new_request_id()
        set_request_meta(replace(current_request_meta(), request_id=request_id))
        started = False

        async def secured(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {
                    **message,
                    "headers": _secure_headers(
                        scope, chain, int(message["status"]), list(message.get("headers") or []), request_id
                    ),
                }
            await send(message)

        try:
            await inner(scope, receive, secured)
        except Exception:
            logger.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise  # the answer's headers are out: the server closes the connection
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {
                        "code": -32603,
                        "message": f"Internal error; the server log has the details (request {request_id}).",
                        "data": {"rule": "internal_error", "request_id": request_id},
                    },
                }
            ).encode()
            await secured(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})

    return app
