"""The Worker protocol, the typed provider errors and the retry helper.

Every provider maps its SDK's exceptions onto `ProviderError` subclasses whose message is plain
words safe to show a user. Messages never contain an API key: providers build them from status
codes and redacted provider text (see `redact`), and raise them `from None` so the SDK exception
(which may echo request details) is not chained into logged tracebacks.
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar, runtime_checkable

from apps.engine.generation import GenerationOptions
from apps.engine.types import Message, WorkerInfo, WorkerResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

DeltaCallback = Callable[[str], None]


@runtime_checkable
class Worker(Protocol):
    """Chat messages in, text + usage + latency out. Implementations must be thread-safe:
    the executor calls `complete` from several threads at once."""

    info: WorkerInfo

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta: DeltaCallback | None = None,
        json_schema: dict | None = None,
        options: GenerationOptions | None = None,
    ) -> WorkerResult:
        """``options`` (only for the step that writes a run's answer) carry the API client's
        generation options; a worker applies what its provider supports natively."""
        ...


class ProviderError(Exception):
    """Base of all provider failures. `str(err)` is safe to show users."""

    code = "provider_error"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.provider = provider

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status!r})"


class ProviderAuthError(ProviderError):
    code = "auth"


class ProviderModelNotFound(ProviderError):
    code = "model_not_found"


class ProviderContextTooLong(ProviderError):
    code = "context_too_long"


class ProviderRateLimited(ProviderError):
    code = "rate_limited"
    retryable = True


class ProviderUnavailable(ProviderError):
    code = "unavailable"
    retryable = True


class ProviderTimeout(ProviderError):
    code = "timeout"
    retryable = True


class ProviderCancelled(ProviderError):
    """The caller abandoned the call and cancelled it (``apps.engine.calls``): the generation was
    stopped or the request closed. Never retried; the caller already moved on."""

    code = "cancelled"


class ProviderBadRequest(ProviderError):
    code = "bad_request"


class ProviderStreamCut(ProviderError):
    """The connection closed before the response was complete (retried only before any text)."""

    code = "stream_cut"
    retryable = True


class ProviderBadResponse(ProviderError):
    """The provider answered 2xx with something that is not the API's format (a proxy's HTML page,
    truncated or garbled JSON). Usually a transient fault between us and the provider."""

    code = "bad_response"
    retryable = True


class ProviderEgressDenied(ProviderError):
    """The egress policy refused the destination (``apps.engine.egress``); no byte was sent."""

    code = "egress_denied"


class ProviderRedirect(ProviderError):
    """The provider answered 3xx. Redirects are never followed: the key would travel with them."""

    code = "redirect"


_KEYLIKE = re.compile(r"\b(sk|sk-ant|sk-proj|key|pk|rk)[-_][A-Za-z0-9_\-*]{6,}")


def redact(text: str, secrets: Iterable[str | None] = (), *, limit: int = 300) -> str:
    """Remove secrets (and anything shaped like an API key) from provider text, and bound it."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _KEYLIKE.sub("[redacted]", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Transport failures by exception class name (anywhere in the MRO), so the engine needs no
# import of the HTTP library the SDKs happen to use (httpx, httpx2, anyio, stdlib sockets).
_TIMEOUT_NAMES = frozenset({"TimeoutException", "ReadTimeout", "WriteTimeout", "PoolTimeout", "TimeoutError"})
_CUT_NAMES = frozenset(
    {
        "RemoteProtocolError",
        "ReadError",
        "IncompleteRead",
        "EndOfStream",
        "BrokenResourceError",
        "ClosedResourceError",
        "ConnectionResetError",
        "ChunkedEncodingError",
    }
)
_CONNECT_NAMES = frozenset({"ConnectError", "ConnectTimeout", "ConnectionRefusedError"})
_RECEIVED = re.compile(r"received (\d+) bytes")


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 8:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def transport_failure(exc: BaseException) -> tuple[str | None, int | None]:
    """``(kind, bytes_received)`` for a transport failure anywhere in ``exc``'s cause chain:
    kind ``"connect"`` (no connection), ``"timeout"`` or ``"cut"`` (closed mid-response), else None.
    ``bytes_received`` is what the HTTP library reported, when it did."""
    kind: str | None = None
    received: int | None = None
    for err in _chain(exc):
        names = {cls.__name__ for cls in type(err).__mro__}
        if names & _CONNECT_NAMES:
            kind = "connect"
        elif names & _TIMEOUT_NAMES and kind is None:
            kind = "timeout"
        elif names & _CUT_NAMES and kind is None:
            kind = "cut"
        match = _RECEIVED.search(str(err))
        if match and received is None:
            received = int(match.group(1))
    if kind == "cut" and any("without sending a response" in str(err) for err in _chain(exc)):
        received = 0
    return kind, received


def stream_cut_error(provider: str, host: str, received: int | None) -> ProviderStreamCut:
    amount = f"after {received} bytes" if received is not None else "mid-response"
    return ProviderStreamCut(
        f"Stream cut {amount}: the {provider} provider at {host} closed the connection before "
        "the response was complete.",
        provider=provider,
    )


def timeout_error(
    provider: str, host: str, timeout: float | None, received: int | None = None
) -> ProviderTimeout:
    after = f" after {timeout:.1f} s" if timeout is not None else ""
    stalled = f" (the response stalled after {received} bytes)" if received else ""
    return ProviderTimeout(f"The {provider} provider at {host} timed out{after}{stalled}.", provider=provider)


def invalid_json_error(
    provider: str,
    host: str,
    raw: str | bytes | None,
    secrets: Iterable[str | None] = (),
    *,
    what: str = "JSON",
) -> ProviderBadResponse:
    """A 2xx answer we cannot read. Shows its first bytes (secrets redacted) so an operator can
    tell a proxy's error page from a truncated body."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    first = redact(raw or "", secrets, limit=80)
    return ProviderBadResponse(
        f"Invalid {what} from the {provider} provider at {host} (first bytes: {first!r}, secrets redacted).",
        provider=provider,
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def call_with_retries(
    fn: Callable[[], T],
    *,
    max_retries: int = 2,
    base_delay: float = 0.5,
    max_delay: float = 20.0,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[ProviderError, int, float], None] | None = None,
) -> T:
    """Call `fn`, retrying retryable `ProviderError`s (429, 5xx, timeouts) with exponential
    backoff and full jitter. A server's Retry-After wins over our own backoff because it knows
    when capacity returns; we never sleep past `deadline` (a `time.monotonic()` instant) — we
    re-raise instead, so a step timeout is not eaten by backoff."""
    attempt = 0
    while True:
        try:
            return fn()
        except ProviderError as err:
            if not err.retryable or attempt >= max_retries:
                raise
            if err.retry_after is not None:
                delay = min(err.retry_after, max_delay)
            else:
                delay = random.uniform(0, min(max_delay, base_delay * (2**attempt)))
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise
            attempt += 1
            logger.info("provider call failed (%s); retry %d in %.2fs", err.code, attempt, delay)
            if on_retry is not None:
                on_retry(err, attempt, delay)
            sleep(delay)
