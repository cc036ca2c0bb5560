"""Per-key rate limits: memory in the embedded mode, Redis (shared, atomic) in the distributed mode."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.conf import settings

from apps.api import ratelimit


def test_memory_limiter_counts_requests_and_tokens_per_window() -> None:
    limiter = ratelimit.MemoryLimiter()
    name = f"t-{uuid.uuid4().hex}"
    assert [limiter.incr(name, 1, 60) for _ in range(3)] == [1, 2, 3]
    assert limiter.incr(f"{name}-tok", 500, 60) == 500
    assert limiter.peek(f"{name}-tok", 60) == 500
    assert limiter.first_in_window(name, 60) is True
    assert limiter.first_in_window(name, 60) is False


def test_hit_requests_refuses_over_the_limit_with_retry_after() -> None:
    prefix = uuid.uuid4().hex[:10]
    decisions = [ratelimit.hit_requests(key_prefix=prefix, limit=2) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert 1 <= decisions[-1].retry_after_s <= 60


def test_tokens_per_minute() -> None:
    prefix = uuid.uuid4().hex[:10]
    assert ratelimit.check_tokens(key_prefix=prefix, limit=100).allowed
    ratelimit.add_tokens(key_prefix=prefix, tokens=100)
    decision = ratelimit.check_tokens(key_prefix=prefix, limit=100)
    assert not decision.allowed and decision.count == 100


def test_memory_limiter_is_exact_under_threads() -> None:
    limiter = ratelimit.MemoryLimiter()
    name = uuid.uuid4().hex

    def worker() -> None:
        for _ in range(200):
            limiter.incr(name, 1, 60)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limiter.peek(name, 60) == 1600


@pytest.mark.distributed
def test_redis_limiter_is_shared_and_atomic() -> None:
    assert isinstance(ratelimit.limiter(), ratelimit.RedisLimiter)
    prefix = f"cw:rl:test-{uuid.uuid4().hex}:"
    a = ratelimit.RedisLimiter(settings.REDIS_URL, prefix=prefix)
    b = ratelimit.RedisLimiter(settings.REDIS_URL, prefix=prefix)  # another "web process"
    name = "req:shared"

    def worker(limiter: ratelimit.RedisLimiter) -> None:
        for _ in range(100):
            limiter.incr(name, 1, 60)

    threads = [threading.Thread(target=worker, args=(lim,)) for lim in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.peek(name, 60) == b.peek(name, 60) == 400
    ttl = a._redis.ttl(a._key(name, 60))
    assert 0 < ttl <= 65
    assert a.first_in_window("deny", 60) is True and b.first_in_window("deny", 60) is False
