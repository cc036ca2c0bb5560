"""Shared mapping from an HTTP API error (status, body, headers) to our typed errors.

Both official SDKs expose `status_code`, `body` and `response.headers` on their status errors;
we never use the SDK's own message (it embeds the raw body, and OpenAI's 401 body echoes part
of the key).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from apps.engine import calls, egress
from apps.engine.egress import EgressPolicy
from apps.engine.providers.base import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderCancelled,
    ProviderContextTooLong,
    ProviderEgressDenied,
    ProviderError,
    ProviderModelNotFound,
    ProviderRateLimited,
    ProviderRedirect,
    ProviderTimeout,
    ProviderUnavailable,
    call_with_retries,
    parse_retry_after,
    redact,
)
from apps.engine.providers.gate import Admitted, OutboundGate
from apps.engine.providers.pricing import price_call
from apps.engine.types import Usage, WorkerInfo, WorkerResult

_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
    "input is too long",
)


def error_detail(body: object) -> tuple[str, str]:
    """(code-or-type, message) from an OpenAI- or Anthropic-shaped error body."""
    if isinstance(body, Mapping):
        inner = body.get("error") if isinstance(body.get("error"), Mapping) else body
        assert isinstance(inner, Mapping)
        code = inner.get("code") or inner.get("type") or ""
        message = inner.get("message") or ""
        return str(code), str(message)
    if isinstance(body, str):
        return "", body
    return "", ""


def retry_after_from(headers: Mapping[str, str] | Any) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


def map_status_error(
    *,
    provider: str,
    status: int,
    body: object,
    headers: Mapping[str, str] | Any,
    model: str,
    secrets: Iterable[str | None],
) -> ProviderError:
    code, raw_message = error_detail(body)
    detail = redact(raw_message, secrets)
    suffix = f": {detail}" if detail else "."
    lowered = f"{code} {raw_message}".lower()
    kw: dict[str, Any] = {"status": status, "provider": provider}
    if status in (401, 403):
        # Deliberately no provider text: OpenAI's 401 body quotes (part of) the key.
        word = "rejected the API key" if status == 401 else "refused access with this API key"
        return ProviderAuthError(
            f"The {provider} provider {word} (HTTP {status}). Check the configured key.", **kw
        )
    if 300 <= status < 400:
        # Never followed (the key would travel with it); nothing of the body is worth showing.
        return ProviderRedirect(
            f"The {provider} provider answered with a redirect (HTTP {status}); redirects are not "
            "followed. Set the base URL to the final address.",
            **kw,
        )
    if status == 404:
        return ProviderModelNotFound(
            f"The model {model!r} was not found at the {provider} provider (HTTP 404){suffix}", **kw
        )
    if any(marker in lowered for marker in _CONTEXT_MARKERS):
        return ProviderContextTooLong(
            f"The conversation is too long for the model {model!r} (HTTP {status}){suffix}", **kw
        )
    if status == 429:
        if "insufficient_quota" in lowered or "exceeded your current quota" in lowered:
            err: ProviderError = ProviderRateLimited(
                f"The {provider} account has no quota left (HTTP 429){suffix}", **kw
            )
            err.retryable = False  # waiting will not refill a billing quota
            return err
        return ProviderRateLimited(
            f"The {provider} provider is rate limiting requests (HTTP 429){suffix}",
            retry_after=retry_after_from(headers),
            **kw,
        )
    if status == 408:
        return ProviderTimeout(f"The {provider} provider timed out (HTTP 408).", **kw)
    if status >= 500 or status == 409:
        return ProviderUnavailable(
            f"The {provider} provider is unavailable (HTTP {status}){suffix}",
            retry_after=retry_after_from(headers),
            **kw,
        )
    return ProviderBadRequest(f"The {provider} provider rejected the request (HTTP {status}){suffix}", **kw)


_shared_clients: dict[tuple[int, EgressPolicy], Any] = {}
_shared_lock = threading.Lock()


def shared_http_client(policy: EgressPolicy | str | None = None) -> Any:
    """One egress-checked HTTP client per process and egress policy, shared by every worker of
    both SDKs (see ``_egress_http``: connections are checked at the socket, redirects refused).

    Sharing matters: each SDK client would otherwise build its own SSL context (loading the CA
    bundle: ~60 ms of CPU under the GIL) for every worker of every run, and keep no connections
    between runs. httpx clients are thread-safe and the SDKs pass each request's timeout
    themselves. Keyed by pid so a forked process never reuses its parent's sockets.
    """
    # Lazy: httpx2/httpcore2 load with the first SDK worker, so importing the engine stays cheap.
    from apps.engine.providers._egress_http import build_client

    if not isinstance(policy, EgressPolicy):
        policy = egress.default_policy()  # also the old per-SDK call: one client serves both SDKs
    key = (os.getpid(), policy)
    with _shared_lock:
        client = _shared_clients.get(key)
        if client is None or client.is_closed:
            client = build_client(policy)
            _shared_clients[key] = client
        return client


# SDK clients (openai.OpenAI, anthropic.Anthropic) by everything that shapes their requests. A
# worker is built for every run (a key set or rotated since the last run is picked up); the SDK's
# constructor parses and copies its base URL and headers, 2% of a pass-through run's CPU, for a
# client that is immutable once built and thread-safe, so equal configurations share one.
_SDK_CLIENTS_MAX = 256
_sdk_clients: dict[tuple[Any, ...], Any] = {}


def shared_sdk_client(
    sdk: Callable[..., Any],
    *,
    api_key: str | None,
    base_url: str | None,
    timeout: float,
    default_headers: Mapping[str, str] | None,
    egress_policy: EgressPolicy | None,
) -> Any:
    """The client of ``sdk`` (``openai.OpenAI``, ``anthropic.Anthropic``) for this configuration,
    built on first use with no retries of its own (``call_with_retries`` retries) and the shared
    egress-checked HTTP client.

    The key enters the cache key only as a digest (a rotated key is another entry; the old one
    ages out of the LRU bound). Without a key the SDK would read its own environment variable at
    construction, so such a client is built every time. A constructor that raises caches nothing."""
    http_client = shared_http_client(egress_policy)

    def build() -> Any:
        return sdk(
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            default_headers=default_headers,
            http_client=http_client,
        )

    if not api_key:
        return build()
    key_digest = hashlib.sha256(api_key.encode()).hexdigest()
    headers = tuple(sorted((default_headers or {}).items()))
    key = (os.getpid(), sdk, key_digest, base_url, float(timeout), headers, id(http_client))
    with _shared_lock:
        client = _sdk_clients.pop(key, None)
        if client is not None and client._client is http_client and not http_client.is_closed:
            _sdk_clients[key] = client  # most recently used last
            return client
    client = build()
    with _shared_lock:
        _sdk_clients[key] = client
        while len(_sdk_clients) > _SDK_CLIENTS_MAX:
            _sdk_clients.pop(next(iter(_sdk_clients)))
    return client


def connection_error(exc: BaseException, *, provider: str, host: str) -> ProviderError:
    """A connection failure in plain words; an egress refusal names the address and the rule."""
    # Lazy: an egress refusal can only come from a client build_client made (httpx2 loaded).
    from apps.engine.providers._egress_http import egress_denial

    denied = egress_denial(exc)
    if denied is not None:
        return ProviderEgressDenied(
            f"The {provider} provider at {host} was not contacted: {denied}", provider=provider
        )
    return ProviderUnavailable(f"Could not connect to the {provider} provider at {host}.", provider=provider)


# What a provider call returns: text, usage, model, and optionally how it ended
# ({"finish_reason": ..., "tool_calls": [...]}).
CallOutput = tuple[str, Usage, str] | tuple[str, Usage, str, dict[str, Any]]


class SdkWorker:
    """What the OpenAI and Anthropic workers share: one call, retried within the deadline, timed
    and priced. Subclasses provide ``_plain`` and ``_stream`` (each returning text, usage, model
    and optionally the ending: finish reason and tool calls)."""

    info: WorkerInfo
    max_retries: int
    base_url: str | None
    gate: OutboundGate  # every request passes it (apps.engine.providers.gate)
    timeout_message = "The provider did not answer in time."

    def _plain(self, params: dict[str, Any], timeout: float) -> CallOutput:
        raise NotImplementedError

    def _stream(self, params: dict[str, Any], timeout: float, on_delta: Callable[[str], None]) -> CallOutput:
        raise NotImplementedError

    def _call(
        self,
        params: dict[str, Any],
        *,
        admitted: Admitted,
        t0: float,
        deadline: float,
        on_delta: Callable[[str], None] | None,
    ) -> WorkerResult:
        """Send ``params`` (built from ``admitted`` only): the HTTP client refuses any request
        sent outside ``admitted.on_wire()`` (see ``apps.engine.providers.gate``)."""

        def once() -> CallOutput:
            if calls.cancelled():
                raise ProviderCancelled(
                    "The call was cancelled before it was sent.", provider=self.info.provider
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProviderTimeout(self.timeout_message)
            with admitted.on_wire():
                if on_delta is None:
                    return self._plain(params, left)
                return self._stream(params, left, on_delta)

        try:
            text, usage, model, *rest = call_with_retries(
                once, max_retries=self.max_retries, deadline=deadline
            )
        except ProviderError as err:
            if calls.cancelled() and not isinstance(err, ProviderCancelled):
                # The socket was shut down under the SDK on purpose: not a provider fault.
                raise ProviderCancelled(
                    "The request was closed: the caller abandoned the call.", provider=self.info.provider
                ) from None
            raise
        ending: dict[str, Any] = rest[0] if rest else {}
        cost, priced = price_call(self.info, usage, model=self.info.model, base_url=self.base_url)
        return WorkerResult(
            text,
            usage,
            (time.perf_counter() - t0) * 1000,
            model,
            cost,
            priced,
            finish_reason=str(ending.get("finish_reason") or "stop"),
            tool_calls=tuple(ending.get("tool_calls") or ()),
            outbound=admitted.checks,
        )
