"""Per-key rate limits: fixed one-minute windows, in Redis (distributed) or process memory (embedded).

Redis: one Lua script increments and sets the expiry atomically, so N web processes share one
count. Memory: a dict under a lock — correct for the embedded mode's single daphne process.
Counters are keyed by the key's *prefix* (random, never reused), not its database id.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from django.conf import settings

WINDOW_S = 60

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
    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._incr = self._redis.register_script(_INCR_LUA)
        self._prefix = prefix

    def _key(self, name: str, window_s: int) -> str:
        index, _ = _window(window_s)
        return f"{self._prefix}{name}@{index}"

    def incr(self, name: str, amount: int, window_s: int) -> int:
        return int(self._incr(keys=[self._key(name, window_s)], args=[amount, window_s + 5]))

    def peek(self, name: str, window_s: int) -> int:
        value = self._redis.get(self._key(name, window_s))
        return int(value or 0)

    def first_in_window(self, name: str, window_s: int) -> bool:
        return bool(self._redis.set(self._key(f"once:{name}", window_s), 1, nx=True, ex=window_s + 5))


@lru_cache(maxsize=1)
def limiter() -> Limiter:
    if settings.REDIS_URL:
        test_id = getattr(settings, "TEST_ID", "")
        return RedisLimiter(settings.REDIS_URL, prefix=f"cw:rl:{test_id}:" if test_id else "cw:rl:")
    return MemoryLimiter()


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
