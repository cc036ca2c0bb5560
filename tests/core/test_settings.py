"""Production refuses unsafe configuration; booleans are strict; SQLite runs in WAL mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "DJANGO_SECRET_KEY": "x" * 50,
    "AUDIT_HMAC_KEY": "k" * 32,
    "AUDIT_SIGNING_KEY": "c2lnbmluZy1rZXktb2YtdGhpcy10ZXN0LTMyLWJ5dGU=",
    "SECRETS_ENCRYPTION_KEY": "dGVzdC1mZXJuZXQta2V5LTMyLWJ5dGVzLWxvbmchISE=",
    "ALLOWED_HOSTS": "conductor.example.com",
}


def _load(settings_module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {*GOOD, "DEBUG"}}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": settings_module, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_starts_with_its_secrets() -> None:
    out = _load("conductor_web.settings.production", GOOD)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "missing", ["DJANGO_SECRET_KEY", "AUDIT_HMAC_KEY", "AUDIT_SIGNING_KEY", "SECRETS_ENCRYPTION_KEY"]
)
def test_production_refuses_missing_secret(missing: str) -> None:
    env = {k: v for k, v in GOOD.items() if k != missing}
    out = _load("conductor_web.settings.production", env)
    assert out.returncode != 0
    assert f"{missing} is required in production" in out.stderr


def test_production_refuses_a_signing_key_that_is_not_32_bytes() -> None:
    out = _load("conductor_web.settings.production", {**GOOD, "AUDIT_SIGNING_KEY": "c2hvcnQ="})
    assert out.returncode != 0
    assert "AUDIT_SIGNING_KEY must be the base64 of a 32-byte Ed25519 private key" in out.stderr


def test_production_refuses_debug() -> None:
    out = _load("conductor_web.settings.production", {**GOOD, "DEBUG": "true"})
    assert out.returncode != 0
    assert "DEBUG must be off in production" in out.stderr


def test_booleans_are_strict() -> None:
    out = _load("conductor_web.settings.local", {"DEBUG": "ture"})
    assert out.returncode != 0
    assert "DEBUG must be a boolean" in out.stderr


def test_upstream_streaming_setting_names_its_choices() -> None:
    out = _load("conductor_web.settings.local", {"V1_UPSTREAM_STREAM": "sometimes"})
    assert out.returncode != 0
    assert "V1_UPSTREAM_STREAM must be client or always" in out.stderr


@pytest.mark.runtime
@pytest.mark.django_db
def test_sqlite_uses_wal() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-specific: the distributed phase runs on PostgreSQL")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0].lower() == "wal"


def test_plotly_served_from_package(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/static/vendor/plotly.min.js")
    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"plotly" in body[:2000].lower()
    assert len(body) > 1_000_000


def test_env_example_values_start_the_embedded_defaults(tmp_path: Path) -> None:
    # Copying .env.example verbatim must give the embedded defaults: its empty switches mean "unset".
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
    assert {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY"} <= values.keys()
    assert values["PROMETHEUS_MULTIPROC_DIR"] == ""
    values["CONDUCTOR_VAR_DIR"] = str(tmp_path)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s;"
            "from apps.insights import metrics; metrics.WEBSOCKET_VIEWERS.inc();"
            "print(s.DATABASES['default']['ENGINE'], s.EXECUTION_BACKEND, s.CHANNEL_LAYERS['default']['BACKEND'])",
        ],
        cwd=workdir,
        env={
            **os.environ,
            **values,
            "DJANGO_SETTINGS_MODULE": "conductor_web.settings.local",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == [
        "apps.core.backends.sqlite3",
        "thread",
        "channels.layers.InMemoryChannelLayer",
    ]
    # The empty PROMETHEUS_MULTIPROC_DIR is unset too: prometheus_client's multiprocess mode (on
    # whenever the variable exists) once left a gauge_livesum_<pid>.db in the working directory.
    assert list(workdir.iterdir()) == []
