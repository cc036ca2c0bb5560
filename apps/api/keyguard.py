"""Failed-API-key throttling: a client IP that presents too many invalid keys is slowed and audited.

After ``APIKEY_FAILURE_LIMIT`` invalid keys within ``APIKEY_FAILURE_WINDOW_S`` seconds, every key
presented from that IP (valid or not, so a lucky guess cannot be told apart) is refused for
``APIKEY_COOLOFF_S`` seconds with a 429 and ``Retry-After``. Counters live in this process's memory
on purpose: the guard must keep working when Redis is down, and a guessing burst arrives over one
connection to one process. Each rejected key is audited (``apikey.rejected``) until the limit, then
the block once (``apikey.throttled``); keys refused during the cool-off are not audited again, so a
blocked client cannot grow the audit chain at line rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest

from apps.api.models import ApiKey
from apps.api.services import ApiKeyInvalid, apikey_authenticate
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.middleware import client_ip
from apps.core.request_context import set_api_key_id

# Bounds memory under a spray from many addresses: the oldest idle entries go first.
MAX_TRACKED_CLIENTS = 10_000


class KeyThrottled(Exception):
    """This client presented too many invalid keys; ``message`` names the limit and its settings."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass
class _Client:
    failures: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0


_lock = threading.Lock()
_clients: dict[str, _Client] = {}


def _limits() -> tuple[int, int, int]:
    return (
        int(settings.APIKEY_FAILURE_LIMIT),
        int(settings.APIKEY_FAILURE_WINDOW_S),
        int(settings.APIKEY_COOLOFF_S),
    )


def _message(limit: int, window: int, cooloff: int, retry_after: int) -> str:
    return (
        f"Too many invalid API keys from your address: the limit is {limit} per {window}s "
        f"(APIKEY_FAILURE_LIMIT, APIKEY_FAILURE_WINDOW_S); key authentication from this address is "
        f"paused for {cooloff}s (APIKEY_COOLOFF_S). Try again in {retry_after}s."
    )


def _client(ip: str) -> _Client:
    entry = _clients.get(ip)
    if entry is None:
        if len(_clients) >= MAX_TRACKED_CLIENTS:
            _clients.pop(next(iter(_clients)))
        entry = _clients[ip] = _Client()
    return entry


def _blocked(ip: str, now: float) -> int:
    """Seconds left in this IP's cool-off, 0 when it is not blocked."""
    entry = _clients.get(ip)
    if entry is None or entry.blocked_until <= now:
        return 0
    return max(1, int(entry.blocked_until - now + 0.999))


def _record_failure(ip: str, now: float) -> tuple[int, bool]:
    """Count one failure; returns (failures in the window, whether this one started a block)."""
    limit, window, cooloff = _limits()
    entry = _client(ip)
    while entry.failures and entry.failures[0] <= now - window:
        entry.failures.popleft()
    entry.failures.append(now)
    if len(entry.failures) >= limit:
        entry.failures.clear()
        entry.blocked_until = now + cooloff
        return limit, True
    return len(entry.failures), False


def authenticate(request: HttpRequest, raw: str) -> ApiKey:
    """Authenticate ``raw`` behind the per-IP guard. Raises ``KeyThrottled`` or ``ApiKeyInvalid``.

    Like ``apps.api.authentication.authenticate_key``, puts the key id into the audit context.
    """
    limit, window, cooloff = _limits()
    ip = client_ip(request) or "unknown"
    with _lock:
        retry_after = _blocked(ip, time.monotonic())
    if retry_after:
        raise KeyThrottled(_message(limit, window, cooloff, retry_after), retry_after)
    try:
        key = apikey_authenticate(raw)
    except ApiKeyInvalid as exc:
        with _lock:
            count, started_block = _record_failure(ip, time.monotonic())
        # The presented key is a secret (or a guess at one): only the reason goes on record.
        with transaction.atomic():
            audit_record(
                event_type=AuditEventType.APIKEY_REJECTED,
                object_type="api.apikey",
                object_id=exc.api_key.pk if exc.api_key is not None else None,
                payload={"reason": exc.code, "path": request.path[:200], "failures": count, "limit": limit},
            )
            if started_block:
                audit_record(
                    event_type=AuditEventType.APIKEY_THROTTLED,
                    object_type="api.apikey",
                    payload={
                        "limit": limit,
                        "window_s": window,
                        "cooloff_s": cooloff,
                        "setting": "APIKEY_FAILURE_LIMIT",
                    },
                )
        if started_block:
            raise KeyThrottled(_message(limit, window, cooloff, cooloff), cooloff) from None
        raise
    set_api_key_id(key.pk)
    return key


def reset() -> None:
    """Forget every counter (tests, and an operator unblocking after a false alarm)."""
    with _lock:
        _clients.clear()
