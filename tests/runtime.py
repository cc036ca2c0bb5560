"""Which runtime the suite is testing, and the services the distributed mode needs."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import pytest

MODE = "distributed" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "embedded"
IN_CI = os.environ.get("CI", "").lower() == "true"

SERVICES = {
    "PostgreSQL": "DATABASE_URL",
    "Redis": "REDIS_URL",
    "Celery broker": "CELERY_BROKER_URL",
}


def describe_mode() -> str:
    if MODE == "embedded":
        return "embedded (SQLite, in-memory channel layer, in-process thread execution)"
    broker = urlparse(os.environ.get("CELERY_BROKER_URL", "")).scheme or "none"
    return f"distributed (PostgreSQL, channels-redis, Celery via {broker})"


def _reachable(url: str) -> str | None:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port
    if port is None:
        port = {"postgres": 5432, "postgresql": 5432, "redis": 6379, "amqp": 5672}.get(parsed.scheme, 0)
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"


def require_services() -> None:
    problems = []
    for name, var in SERVICES.items():
        url = os.environ.get(var, "")
        if not url:
            problems.append(f"{name}: {var} is not set")
            continue
        err = _reachable(url)
        if err:
            problems.append(f"{name}: {err}")
    if problems:
        pytest.exit("distributed mode needs its services: " + "; ".join(problems), returncode=3)
