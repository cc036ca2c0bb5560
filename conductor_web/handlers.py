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

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from apps.api.v1.middleware import PREFIX as V1_PREFIX
from apps.core.executor_db import served_on_loop

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
