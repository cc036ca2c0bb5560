"""Redis down is a degradation, not an outage: `/v1` keys still authenticate (per-process rate
limits instead of shared ones, never no limits), runs are submitted and followed on the database
alone, and `/healthz` says which parts fell back while answering 200.

Our own daphne reaches Redis only through a `TcpProxy` that is closed from the start and opened
again at the end (the shared Redis is never stopped).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.factories.api import make_api_key
from tests.faults.test_endings import (
    FreezableProxy,
    ProxiedServer,
    redis_target,
    require_redis,
    start_proxied_daphne,
)
from tests.fixtures.api import CONDUCTOR_ANSWER
from tests.fixtures.core import _stop

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [{"role": "user", "content": "What is six times seven?"}]
TIMEOUT_S = 120


@pytest.fixture
def redis_down_server(
    django_db_setup: Any, django_db_blocker: Any, tmp_path: Path, runtime_workers: Any
) -> Iterator[ProxiedServer]:
    host, port, _ = redis_target()
    proxy = FreezableProxy(0, host, port)
    proxy.stop_accepting()  # nothing answers on the Redis URL the server is given
    log = tmp_path / "daphne.log"
    url, proc = start_proxied_daphne(log, proxy)
    try:
        yield ProxiedServer(url, proc, log, proxy)
    finally:
        _stop(proc)
        proxy.close()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_v1_keeps_answering_and_healthz_names_the_fallback_while_redis_is_down(
    redis_down_server: ProxiedServer, conductor_fake: Any, api_key: tuple[Any, str]
) -> None:
    server = redis_down_server
    _key, plaintext = api_key

    health = httpx.get(f"{server.url}/healthz", timeout=TIMEOUT_S)
    body = health.json()
    assert health.status_code == 200, body  # the database and execution are fine
    assert body["status"] == "degraded"
    assert set(body["degraded"]) == {"channel_layer", "rate_limiter"}
    assert body["failing"] == ["channel_layer"]
    assert body["rate_limiter"]["backend"] == "memory (fallback)"
    assert "Redis unreachable" in body["rate_limiter"]["degraded"]
    assert "polling the database" in body["channel_layer"]["degraded"]
    assert body["database"]["ok"] and body["execution"]["ok"]

    plain = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": PROMPT},
        headers=_auth(plaintext),
        timeout=TIMEOUT_S,
    )
    assert plain.status_code == 200, plain.text
    assert plain.json()["choices"][0]["message"]["content"] == CONDUCTOR_ANSWER
    assert plain.json()["conductor"]["run_id"] == plain.headers["x-conductor-run"]

    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": PROMPT, "stream": True},
        headers=_auth(plaintext),
        timeout=TIMEOUT_S,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text == CONDUCTOR_ANSWER

    log = server.log_text()
    assert log.count("rate limiter: Redis unreachable") == 1  # per transition, not per request


def test_rate_limits_still_hold_while_redis_is_down(
    redis_down_server: ProxiedServer, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    # Fail-open to *local* limits: a key over its per-minute limit is still refused.
    created = make_api_key(alpha, principal=team_admin, requests_per_minute=3)
    statuses = []
    refused: httpx.Response | None = None
    # A minute boundary may reset the count once; 3 + 3 allowed calls at most, then a refusal.
    for _ in range(7):
        response = httpx.get(
            f"{redis_down_server.url}/v1/models", headers=_auth(created.plaintext), timeout=TIMEOUT_S
        )
        statuses.append(response.status_code)
        if response.status_code == 429:
            refused = response
            break
    assert refused is not None, statuses
    assert set(statuses[:-1]) == {200}
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "3 requests per minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_redis_coming_back_restores_shared_limits_and_healthz(
    redis_down_server: ProxiedServer, fake_pool: Any, api_key: tuple[Any, str]
) -> None:
    require_redis()
    server = redis_down_server
    _key, plaintext = api_key
    assert (
        httpx.get(f"{server.url}/v1/models", headers=_auth(plaintext), timeout=TIMEOUT_S).status_code == 200
    )
    assert httpx.get(f"{server.url}/healthz", timeout=TIMEOUT_S).json()["status"] == "degraded"

    server.proxy.resume()  # Redis answers again on the same address
    health = httpx.get(f"{server.url}/healthz", timeout=TIMEOUT_S)
    body = health.json()
    assert health.status_code == 200, body
    assert body["status"] == "ok", body
    assert body["rate_limiter"] == {"backend": "redis", "ok": True}
    assert body["channel_layer"]["ok"] is True
    assert "degraded" not in body
    assert (
        httpx.get(f"{server.url}/v1/models", headers=_auth(plaintext), timeout=TIMEOUT_S).status_code == 200
    )
    log = server.log_text()
    assert log.count("rate limiter: Redis unreachable") == 1
    assert log.count("rate limiter: Redis answers again") == 1
