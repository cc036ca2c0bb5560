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
    ) -> WorkerResult: ...


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


class ProviderBadRequest(ProviderError):
    code = "bad_request"


_KEYLIKE = re.compile(r"\b(sk|sk-ant|sk-proj|key|pk|rk)[-_][A-Za-z0-9_\-*]{6,}")


def redact(text: str, secrets: Iterable[str | None] = (), *, limit: int = 300) -> str:
    """Remove secrets (and anything shaped like an API key) from provider text, and bound it."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _KEYLIKE.sub("[redacted]", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
