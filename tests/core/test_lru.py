"""apps.core.lru: the bounded map behind the per-process version caches."""

from __future__ import annotations

from apps.core.lru import Lru


def test_a_hit_keeps_an_entry_and_a_put_evicts_the_least_recently_used() -> None:
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the newest
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)
    cache.clear()
    assert (cache.get("a"), len(cache)) == (None, 0)
