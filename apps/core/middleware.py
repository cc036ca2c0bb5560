"""Project middleware: login everywhere by default, the audit request context, and hooks that run
inline on whichever side of Django's chain they are placed.

Django runs a ``MiddlewareMixin`` in an async chain by sending each of its hooks to a thread
(``sync_to_async``): two thread hops per middleware per request. `InlineHooks` is for middleware
whose hooks do no I/O (headers, a contextvar, checks on bytes already read): they run on the event
loop as they are, and the chain stays async down to the view. ``conductor_web.handlers`` builds
the ``/v1`` chain from these (issue #15).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from csp.middleware import CSPMiddleware as _CSPMiddleware
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware as _CommonMiddleware
from django.middleware.security import SecurityMiddleware as _SecurityMiddleware
from django.utils.deprecation import MiddlewareMixin

from apps.core.request_context import RequestMeta, set_request_meta


class InlineHooks:
    """Mixed in before ``MiddlewareMixin``: ``process_request`` / ``process_response`` called
    directly in an async chain instead of each in a thread. Only for hooks that neither block nor
    touch the database (they would run on the event loop). The sync chain is MiddlewareMixin's."""

    get_response: Callable[[HttpRequest], Any]

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response  # type: ignore[no-any-return]


# Django's and django-csp's header middleware, inline. MIDDLEWARE keeps naming the originals (the
# deploy checks look for those names); conductor_web.handlers swaps these in for the /v1 chain.
class SecurityMiddleware(InlineHooks, _SecurityMiddleware):
    pass


class CSPMiddleware(InlineHooks, _CSPMiddleware):
    pass


class CommonMiddleware(InlineHooks, _CommonMiddleware):
    pass


class XFrameOptionsMiddleware(InlineHooks, _XFrameOptionsMiddleware):
    pass


# Paths reachable without a session: login itself, health, static, and the APIs (which answer
# 401/403 in their own formats rather than redirecting a script to an HTML login page).
# /audit/log/ is the audit log's own: public keys, and a checkpoint that API keys read.
PUBLIC_PREFIXES = (
    "/accounts/login/",
    "/healthz",
    "/static/",
    "/v1/",
    "/api/",
    "/audit/log/",
    "/favicon.ico",
    "/metrics",
)


class LoginRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The path first: a public path's answer does not depend on a session, so none is read.
        if not request.path.startswith(PUBLIC_PREFIXES) and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)


def client_ip(request: HttpRequest) -> str | None:
    # Trust X-Forwarded-For only when told a proxy sets it; otherwise a client could forge it.
    if getattr(settings, "USE_X_FORWARDED_FOR", False):
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded:
            return forwarded.split(",")[0].strip()
    return request.META.get("REMOTE_ADDR") or None


class RequestContextMiddleware(InlineHooks, MiddlewareMixin):
    def process_request(self, request: HttpRequest) -> None:
        set_request_meta(
            RequestMeta(
                ip=client_ip(request),
                user_agent=request.META.get("HTTP_USER_AGENT", "")[:256],
                # Set by apps.api.v1.middleware on /v1 requests (it runs first).
                request_id=getattr(getattr(request, "v1_state", None), "request_id", ""),
            )
        )
