"""Project middleware: login everywhere by default, and the audit request context."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse

from conductor_web.request_context import RequestMeta, set_request_meta

# Paths reachable without a session: login itself, health, static, and the APIs (which answer
# 401/403 in their own formats rather than redirecting a script to an HTML login page).
PUBLIC_PREFIXES = ("/accounts/login/", "/healthz", "/static/", "/v1/", "/api/", "/favicon.ico", "/metrics")


class LoginRequiredMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_authenticated and not request.path.startswith(PUBLIC_PREFIXES):
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)


def client_ip(request: HttpRequest) -> str | None:
    # Trust X-Forwarded-For only when told a proxy sets it; otherwise a client could forge it.
    if getattr(settings, "USE_X_FORWARDED_FOR", False):
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded:
            return forwarded.split(",")[0].strip()
    return request.META.get("REMOTE_ADDR") or None


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        set_request_meta(
            RequestMeta(
                ip=client_ip(request),
                user_agent=request.META.get("HTTP_USER_AGENT", "")[:256],
                # Set by apps.api.v1.middleware on /v1 requests (it runs first).
                request_id=getattr(getattr(request, "v1_state", None), "request_id", ""),
            )
        )
        return self.get_response(request)
