"""/healthz names each backend and proves it answers; 503 names the broken part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.runtime import MODE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.runtime
@pytest.mark.django_db
def test_healthz_reports_each_backend_in_use(client) -> None:  # type: ignore[no-untyped-def]
    # The sync client drives the async view on this thread, so the DB check shares its connection.
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    if MODE == "distributed":
        assert body["database"]["backend"] == "postgresql"
        assert body["channel_layer"]["backend"] == "redis"
        assert body["execution"]["backend"].startswith("celery (amqp")
    else:
        assert body["database"]["backend"] == "sqlite"
        assert body["channel_layer"]["backend"] == "in-memory"
        assert body["execution"]["backend"] == "thread"
    assert all(body[part]["ok"] for part in ("database", "channel_layer", "execution"))


@pytest.mark.runtime
@pytest.mark.django_db
def test_healthz_needs_no_login(client) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/healthz").status_code in (200, 503)
    assert client.get("/runs/").status_code == 302


def _healthz_in_subprocess(**env: str) -> tuple[int, dict]:
    """Run the real view in a fresh process configured through the environment, like daphne is."""
    code = (
        "import django, json, asyncio; django.setup();"
        "from django.test import AsyncClient;"
        "r = asyncio.run(AsyncClient().get('/healthz'));"
        "print(r.status_code); print(json.dumps(r.json()))"
    )
    full_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "conductor_web.settings.test", **env}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    status, body = out.stdout.strip().splitlines()[-2:]
    import json

    return int(status), json.loads(body)


@pytest.mark.runtime
def test_healthz_names_unreachable_redis_as_degraded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Port 1 on loopback: nothing listens, so the Redis channel layer cannot answer. The service
    # degrades around it (polling, local rate limits), so /healthz still answers 200.
    status, body = _healthz_in_subprocess(
        REDIS_URL="redis://127.0.0.1:1/0",
        DATABASE_URL=f"sqlite:///{tmp_path / 'h.sqlite3'}",
        CELERY_BROKER_URL="",
    )
    assert status == 200
    assert body["status"] == "degraded"
    assert "channel_layer" in body["failing"]
    assert {"channel_layer", "rate_limiter"} <= set(body["degraded"])
    assert body["rate_limiter"]["backend"] == "memory (fallback)"
    assert body["channel_layer"]["ok"] is False
    assert body["database"]["ok"] is True


@pytest.mark.runtime
def test_healthz_503_names_unreachable_broker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    status, body = _healthz_in_subprocess(
        CELERY_BROKER_URL="amqp://guest:guest@127.0.0.1:1//",
        REDIS_URL="",
        DATABASE_URL=f"sqlite:///{tmp_path / 'h.sqlite3'}",
    )
    assert status == 503
    assert body["failing"] == ["execution"]
    assert body["execution"]["ok"] is False


def test_settings_follow_mode() -> None:
    if MODE == "distributed":
        assert settings.DATABASES["default"]["ENGINE"] == "apps.core.backends.postgresql"
        assert settings.EXECUTION_BACKEND == "celery"
        assert settings.CELERY_TASK_SERIALIZER == "json" and settings.CELERY_ACCEPT_CONTENT == ["json"]
    else:
        assert settings.DATABASES["default"]["ENGINE"] == "apps.core.backends.sqlite3"
        assert settings.EXECUTION_BACKEND == "thread"
