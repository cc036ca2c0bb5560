"""``/v1`` request state and key authentication.

``request_state(request)`` is the per-request record the middleware (``apps.api.v1.middleware``)
and ``authenticate`` share (request id, rate-limit decisions); ``rate_limit_headers`` and
``run_headers`` turn it into response headers. ``authenticate`` reads the presented key (401/429
before any parsing); ``deny`` is a refusal recorded as ``apikey.denied``; ``count_tokens`` charges
a finished run's tokens to the key's per-minute window.
"""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest

from apps.api import keyguard, ratelimit
from apps.api.authentication import presented_key
from apps.api.models import ApiKey
from apps.api.services import ApiKeyInvalid, apikey_record_denied
from apps.api.v1.errors import ApiError, no_retry
from apps.core.executor_db import off_loop
from apps.runs.models import Run

logger = logging.getLogger(__name__)


@dataclass
class RequestState:
    """What one ``/v1`` request learned that its response headers report."""

    request_id: str
    started: float = field(default_factory=time.monotonic)
    requests: ratelimit.Decision | None = None  # the request-count decision for the key
    tokens: ratelimit.Decision | None = None  # the key's token window (peeked)
    # Time the request's run spent waiting on model providers (``run.finished``'s ``provider_ms``),
    # known once a plain response's run ended: x-conductor-overhead-ms is the rest.
    provider_ms: float | None = None
    # The key's soft dollar budget is reached (apps.api.budgets): x-conductor-budget-warning.
    budget_warning: str | None = None


# The state of the /v1 request being served (set by the middleware), so the bridge can note the
# provider wait whichever adapter waits for the run.
_current_state: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar(
    "v1_request_state", default=None
)


def bind_state(state: RequestState) -> None:
    _current_state.set(state)


def current_state() -> RequestState | None:
    """The state of the /v1 request being served, if the middleware bound one."""
    return _current_state.get()


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_state(request: HttpRequest) -> RequestState:
    """The request's state (made on first use when no middleware made it, e.g. in unit tests)."""
    state = getattr(request, "v1_state", None)
    if state is None:
        state = RequestState(new_request_id())
        request.v1_state = state  # type: ignore[attr-defined]
    return state


def rate_limit_headers(state: RequestState) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers from the decisions taken for this request."""
    headers: dict[str, str] = {}
    for name, decision in (("requests", state.requests), ("tokens", state.tokens)):
        if decision is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(decision.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(max(0, decision.limit - decision.count))
        headers[f"x-ratelimit-reset-{name}"] = f"{decision.retry_after_s}s"
    return headers


def run_headers(run: Run, url: str) -> dict[str, str]:
    """The headers naming the run a response belongs to (also sent before a stream's body)."""
    return {"X-Conductor-Run": str(run.id), "X-Conductor-Run-Url": url}


def authenticate(request: HttpRequest) -> ApiKey:
    """The key the request presents (``Authorization: Bearer`` or ``x-api-key``), counted against
    its request rate limit. Raises ``ApiError`` 401 / 429 (with ``Retry-After``)."""
    state = request_state(request)
    raw = presented_key(request)
    if raw is None:
        raise ApiError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer cw_…'.",
            code="missing_api_key",
        )
    try:
        key = keyguard.authenticate(request, raw)
    except keyguard.KeyThrottled as exc:
        raise ApiError(
            429,
            exc.message,
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None
    except ApiKeyInvalid as exc:
        raise ApiError(401, exc.reason, code=exc.code) from None
    decision = ratelimit.hit_requests(key_prefix=key.prefix, limit=key.requests_per_minute)
    state.requests = decision
    try:
        state.tokens = ratelimit.check_tokens(key_prefix=key.prefix, limit=key.tokens_per_minute)
    except Exception:  # headers are informative; never fail a request over them
        logger.debug("could not read the token window", exc_info=True)
    if not decision.allowed:
        raise ApiError(
            429,
            f"Rate limit reached: {decision.limit} requests per minute for this key. "
            f"Try again in {decision.retry_after_s}s.",
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(decision.retry_after_s)},
        )
    return key


def deny(key: ApiKey, status: int, reason: str, message: str, detail: str = "", **kw: Any) -> ApiError:
    """A refusal recorded in the audit trail as ``apikey.denied`` (not retried by SDKs)."""
    apikey_record_denied(api_key=key, reason=reason, detail=detail)
    return ApiError(status, message, code=reason, headers=no_retry(), **kw)


def count_tokens_sync(key: ApiKey, run: Run) -> None:
    """Charge the run's tokens to the key's per-minute token window."""
    # Accounting must never turn a finished run into an error for its client.
    try:
        ratelimit.add_tokens(key_prefix=key.prefix, tokens=run.input_tokens + run.output_tokens)
    except Exception:
        logger.warning("could not count the tokens of run %s", run.id, exc_info=True)


async def count_tokens(key: ApiKey, run: Run) -> None:
    await off_loop(count_tokens_sync, key, run)
