"""Provider health from traffic (issue 44): the engine's side of the per-worker circuit breaker.

The engine does not keep the breaker itself: it is shared by every process that calls the
providers, so it lives behind a port the Django side fills (``apps.workers.health``, the
database). The engine asks the port which workers are down (the planner's worker list leaves them
out), whether a call may go out now (an open worker's step is skipped with ``circuit_open``
without waiting on it; after the cool-down one half-open probe is let through), and tells it how
each call ended. Only failures that say the provider is down count; a policy block or a 4xx
caused by our own request says nothing about the provider.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from apps.engine.providers.base import (
    ProviderBadResponse,
    ProviderError,
    ProviderRateLimited,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
)

logger = logging.getLogger(__name__)

CIRCUIT_OPEN = "circuit_open"


class CircuitOpen(ProviderError):
    """The worker's breaker is open: the call was not made."""

    code = CIRCUIT_OPEN


class HealthPort(Protocol):
    def unavailable(self, keys: Iterable[str]) -> set[str]:
        """The keys whose breaker is open and not yet due a probe (read-only)."""
        ...

    def admit(self, key: str) -> bool:
        """May a call to ``key`` go out now? Claims the half-open probe when one is due."""
        ...

    def record(self, key: str, *, ok: bool, latency_ms: float | None) -> None:
        """One call to ``key`` ended: answered (``ok``) or failed in a way that says it is down."""
        ...


def says_down(error: BaseException) -> bool:
    """Timeouts, connection errors, cut streams, garbage from a proxy, 5xx and 429."""
    if isinstance(error, CircuitOpen):
        return False
    if isinstance(
        error,
        ProviderTimeout | ProviderUnavailable | ProviderRateLimited | ProviderStreamCut | ProviderBadResponse,
    ):
        return True
    status = getattr(error, "status", None)
    return isinstance(status, int) and (status >= 500 or status == 429)


def unavailable(health: HealthPort | None, keys: Iterable[str]) -> set[str]:
    if health is None:
        return set()
    try:
        return set(health.unavailable(list(keys)))
    except Exception:  # the breaker is advice: a broken store must not stop a run
        logger.exception("worker health: reading the breakers failed")
        return set()


def admit(health: HealthPort | None, key: str) -> bool:
    if health is None:
        return True
    try:
        return health.admit(key)
    except Exception:
        logger.exception("worker health: checking %s failed", key)
        return True


def record(
    health: HealthPort | None, key: str, *, error: BaseException | None, latency_ms: float | None
) -> None:
    """Record one call's end; errors that say nothing about the provider are not counted."""
    if health is None or (error is not None and not says_down(error)):
        return
    try:
        health.record(key, ok=error is None, latency_ms=latency_ms if error is None else None)
    except Exception:
        logger.exception("worker health: recording a call to %s failed", key)
