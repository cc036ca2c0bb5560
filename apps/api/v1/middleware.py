"""Headers on every ``/v1`` response, and CORS for the origins an operator allows.

- ``x-request-id``: made per request (``req_<hex>``), put into the audit request context (so
  every audit row written by the request carries it), onto the run (``Run.request_id``, and from
  there into its execution's audit rows and log lines) and into log lines (``apps.core.logging``).
- ``openai-processing-ms``: time spent before the response (a stream's headers) left.
- ``x-conductor-overhead-ms``: that time less what the run waited on model providers (union of
  its provider calls' wall time, ``provider_ms`` on ``run.finished``): this gateway's own cost,
  as LiteLLM's ``x-litellm-overhead-duration-ms``. A stream's headers leave before its run calls
  a provider, so there it is the time to the headers.
- ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``: from the decisions
  ``auth.authenticate`` took for the key (``apps.api.ratelimit``); absent when no key was read.
- CORS: for an ``Origin`` listed in ``V1_CORS_ALLOWED_ORIGINS`` (exact ``scheme://host[:port]``
  or ``*``), ``Access-Control-Allow-Origin`` and the exposed headers the SDKs read; a preflight
  ``OPTIONS`` is answered here (204). Other origins get no CORS headers (and a 403 preflight), so
  browsers keep refusing them.
"""

from __future__ import annotations

import time
from dataclasses import replace

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

from apps.api.v1.auth import RequestState, bind_state, new_request_id, rate_limit_headers
from apps.api.v1.errors import ApiError, error_response
from apps.core.middleware import InlineHooks
from apps.core.request_context import current_request_meta, set_request_meta

PREFIX = "/v1/"
EXPOSED_HEADERS = (
    "x-request-id, openai-processing-ms, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, "
    "x-ratelimit-reset-requests, x-conductor-budget-warning, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
    "x-ratelimit-reset-tokens, retry-after, x-should-retry, x-conductor-run, x-conductor-run-url, "
    "x-conductor-overhead-ms"
)
ALLOWED_METHODS = "GET, POST, OPTIONS"
DEFAULT_ALLOWED_HEADERS = "authorization, content-type, x-api-key, openai-beta, anthropic-version"
PREFLIGHT_MAX_AGE_S = "600"


def allowed_origin(origin: str | None) -> bool:
    if not origin:
        return False
    allowed = list(getattr(settings, "V1_CORS_ALLOWED_ORIGINS", []) or [])
    return "*" in allowed or origin.rstrip("/") in {o.rstrip("/") for o in allowed}


class V1Middleware(InlineHooks, MiddlewareMixin):
    """Request id, timing, rate-limit and CORS headers for ``/v1`` (inline in an async chain)."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not request.path.startswith(PREFIX):
            return None
        return self._before(request)

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not request.path.startswith(PREFIX):
            return response
        return self._after(request, response)

    def _before(self, request: HttpRequest) -> HttpResponse | None:
        state = RequestState(new_request_id())
        request.v1_state = state  # type: ignore[attr-defined]
        bind_state(state)
        set_request_meta(replace(current_request_meta(), request_id=state.request_id))
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and request.headers.get("Access-Control-Request-Method"):
            if not allowed_origin(origin):
                return error_response(
                    ApiError(
                        403,
                        f"The origin {origin or '(none)'} may not call this API from a browser; "
                        "an operator allows origins in V1_CORS_ALLOWED_ORIGINS.",
                        code="cors_origin_not_allowed",
                    )
                )
            response = HttpResponse(status=204)
            response["Access-Control-Allow-Methods"] = ALLOWED_METHODS
            response["Access-Control-Allow-Headers"] = (
                request.headers.get("Access-Control-Request-Headers") or DEFAULT_ALLOWED_HEADERS
            )
            response["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE_S
            return response
        return None

    def _after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        state: RequestState = request.v1_state  # type: ignore[attr-defined]
        response["x-request-id"] = state.request_id
        elapsed_ms = (time.monotonic() - state.started) * 1000
        response["openai-processing-ms"] = str(int(elapsed_ms))
        response["x-conductor-overhead-ms"] = f"{max(0.0, elapsed_ms - (state.provider_ms or 0.0)):.1f}"
        for name, value in rate_limit_headers(state).items():
            response[name] = value
        if state.budget_warning:
            response["x-conductor-budget-warning"] = state.budget_warning
        if response.status_code == 429 and not response.has_header("Retry-After"):
            decision = state.requests
            response["Retry-After"] = str(decision.retry_after_s if decision is not None else 60)
        origin = request.headers.get("Origin")
        if allowed_origin(origin):
            response["Access-Control-Allow-Origin"] = origin or ""
            response["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        if origin:
            vary = response.get("Vary")
            response["Vary"] = f"{vary}, Origin" if vary else "Origin"
        return response
