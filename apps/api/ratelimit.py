"""Per-key rate limits: fixed one-minute windows, in Redis (distributed) or process memory (embedded).

Redis: one Lua script increments and sets the expiry atomically, so N web processes share one
count. Memory: a dict under a lock — correct for the embedded mode's single daphne process.
Counters are keyed by the key's *prefix* (random, never reused), not its database id.

Redis down: the Redis limiter fails over to a per-process memory limiter (fail-open to *local*
limits, never to no limits), so API-key authentication keeps working on the database alone. It
logs one warning when it falls back and one when Redis answers again, retries Redis at most every
``REDIS_RETRY_S`` seconds (a dead Redis must not cost every request a connect timeout), and
``/healthz`` reports the fallback (``status()``). With N web processes the effective limit while
degraded is up to N times the configured one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from django.conf import settings

logger = logging.getLogger(__name__)

WINDOW_S = 60
# While Redis is unreachable, try it again at most this often (seconds).
REDIS_RETRY_S = 5.0

# INCRBY then set the expiry only on the first write of the window; returns the new count.
_INCR_LUA = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return n
"""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    count: int
    limit: int
    retry_after_s: int


def _window(window_s: int) -> tuple[int, int]:
    now = time.time()
    index = int(now // window_s)
    retry_after = max(1, int((index + 1) * window_s - now + 0.999))
    return index, retry_after


class Limiter(Protocol):
    def incr(self, name: str, amount: int, window_s: int) -> int: ...
    def peek(self, name: str, window_s: int) -> int: ...
    def first_in_window(self, name: str, window_s: int) -> bool: ...


class MemoryLimiter:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._last_gc = 0

    def _gc(self, index: int) -> None:
        # Drop finished windows now and then so the dict stays as small as the active keys.
        if index == self._last_gc:
            return
        self._last_gc = index
        suffix_ok = {f"@{index}", f"@{index - 1}"}
        for k in [k for k in self._counts if not any(k.endswith(s) for s in suffix_ok)]:
            del self._counts[k]

    def incr(self, name: str, amount: int, window_s: int) -> int:
        index, _ = _window(window_s)
        key = f"{name}@{index}"
        with self._lock:
            self._gc(index)
            self._counts[key] = self._counts.get(key, 0) + amount
            return self._counts[key]

    def peek(self, name: str, window_s: int) -> int:
        index, _ = _window(window_s)
        with self._lock:
            return self._counts.get(f"{name}@{index}", 0)

    def first_in_window(self, name: str, window_s: int) -> bool:
        return self.incr(f"once:{name}", 1, window_s) == 1


class RedisLimiter:
    """Counts in Redis; falls back to a local ``MemoryLimiter`` while Redis is unreachable."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        # Short timeouts: this runs inside request authentication.
        self._redis: Any = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        self._incr = self._redis.register_script(_INCR_LUA)
        self._prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._fallback = MemoryLimiter()
        self._state_lock = threading.Lock()
        self._degraded_since: float | None = None  # time.time() of the fall-back
        self._degraded_reason = ""
        self._retry_at = 0.0  # time.monotonic() after which Redis is tried again

    def _key(self, name: str, window_s: int) -> str:
        index, _ = _window(window_s)
        return f"{self._prefix}{name}@{index}"

    def _use_redis(self) -> bool:
        return self._degraded_since is None or time.monotonic() >= self._retry_at

    def _failed(self, exc: BaseException) -> None:
        with self._state_lock:
            self._retry_at = time.monotonic() + REDIS_RETRY_S
            if self._degraded_since is None:
                self._degraded_since = time.time()
                self._degraded_reason = type(exc).__name__
                logger.warning(
                    "rate limiter: Redis unreachable (%s); using per-process memory limits until it answers",
                    type(exc).__name__,
                )

    def _ok(self) -> None:
        if self._degraded_since is None:
            return
        with self._state_lock:
            if self._degraded_since is not None:
                down_s = time.time() - self._degraded_since
                self._degraded_since = None
                logger.warning(
                    "rate limiter: Redis answers again after %.0f s; shared limits restored", down_s
                )

    def probe(self) -> None:
        """Ping Redis now (for /healthz), switching to or from the fallback as the answer says."""
        try:
            self._redis.ping()
        except self._errors as exc:
            self._failed(exc)
        else:
            self._ok()

    def status(self) -> dict[str, Any]:
        """For /healthz: which store the limits live in right now."""
        since = self._degraded_since
        if since is None:
            return {"backend": "redis", "ok": True}
        return {
            "backend": "memory (fallback)",
            "ok": True,
            "degraded": (
                f"Redis unreachable ({self._degraded_reason}) since "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))}: "
                "per-process rate limits in use"
            ),
        }

    def incr(self, name: str, amount: int, window_s: int) -> int:
        if self._use_redis():
            try:
                value = int(self._incr(keys=[self._key(name, window_s)], args=[amount, window_s + 5]))
            except self._errors as exc:
                self._failed(exc)
            else:
                self._ok()
                return value
        return self._fallback.incr(name, amount, window_s)

    def peek(self, name: str, window_s: int) -> int:
        if self._use_redis():
            try:
                value = self._redis.get(self._key(name, window_s))
            except self._errors as exc:
                self._failed(exc)
            else:
                self._ok()
                return int(value or 0)
        return self._fallback.peek(name, window_s)

    def first_in_window(self, name: str, window_s: int) -> bool:
        if self._use_redis():
            try:
                first = self._redis.set(self._key(f"once:{name}", window_s), 1, nx=True, ex=window_s + 5)
            except self._errors as exc:
                self._failed(exc)
            else:
                self._ok()
                return bool(first)
        return self._fallback.first_in_window(name, window_s)


@lru_cache(maxsize=1)
def limiter() -> Limiter:
    if settings.REDIS_URL:
        test_id = getattr(settings, "TEST_ID", "")
        return RedisLimiter(settings.REDIS_URL, prefix=f"cw:rl:{test_id}:" if test_id else "cw:rl:")
    return MemoryLimiter()


def status(*, probe: bool = False) -> dict[str, Any]:
    """Where this process keeps its rate limits, and whether it had to fall back."""
    current = limiter()
    if isinstance(current, RedisLimiter):
        if probe:
            current.probe()
        return current.status()
    return {"backend": "memory", "ok": True}


def hit_requests(*, key_prefix: str, limit: int) -> Decision:
    """Count one request against the key's per-minute request limit."""
    count = limiter().incr(f"req:{key_prefix}", 1, WINDOW_S)
    _, retry_after = _window(WINDOW_S)
    return Decision(allowed=count <= limit, count=count, limit=limit, retry_after_s=retry_after)


def check_tokens(*, key_prefix: str, limit: int) -> Decision:
    """Whether the key still has tokens left this minute (tokens are counted after each run)."""
    used = limiter().peek(f"tok:{key_prefix}", WINDOW_S)
    _, retry_after = _window(WINDOW_S)
    return Decision(allowed=used < limit, count=used, limit=limit, retry_after_s=retry_after)


def add_tokens(*, key_prefix: str, tokens: int) -> None:
    if tokens > 0:
        limiter().incr(f"tok:{key_prefix}", tokens, WINDOW_S)
