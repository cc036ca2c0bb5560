"""``GET /healthz``: each runtime part names its backend and proves it answers.

503 only when a run can neither be recorded nor executed: the database or the execution backend
(thread pool / Celery broker) fails. Parts the service degrades around answer 200 with
``"status": "degraded"`` and a ``degraded`` list naming them: the channel layer (``/v1`` clients
fall back to polling the database; browsers lose live updates until it is back) and the rate
limiter (falls back to per-process memory limits while Redis is unreachable).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from apps.api import ratelimit
from apps.audit.sequencer import sequencer_lag, sequencer_role
from apps.runs.end_listener import CHANNEL, run_end_listener
from apps.runs.execution import thread_executor_alive
from conductor_web.celery import app

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 3.0
# Without these no run can be recorded or executed: they make /healthz answer 503.
CRITICAL = ("database", "execution")


def _database_check() -> dict[str, Any]:
    vendor = connection.vendor
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"backend": "postgresql" if vendor == "postgresql" else vendor, "ok": True}


async def _channel_layer_check() -> dict[str, Any]:
    layer = get_channel_layer()
    backend = "redis" if "redis" in type(layer).__module__ else "in-memory"
    channel = await layer.new_channel("healthz.")
    await layer.send(channel, {"type": "healthz.ping"})
    message = await layer.receive(channel)
    if message.get("type") != "healthz.ping":
        raise RuntimeError("channel layer returned an unexpected message")
    return {"backend": backend, "ok": True}


def _execution_check() -> dict[str, Any]:
    if settings.EXECUTION_BACKEND != "celery":
        if not thread_executor_alive():
            raise RuntimeError("the in-process run executor is shut down")
        return {"backend": "thread", "ok": True}

    broker = app.conf.broker_url.split("://", 1)[0]
    with app.connection_for_write() as conn:
        # kombu takes float seconds here; its stubs say int.
        conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_S)  # type: ignore[arg-type]
    return {"backend": f"celery ({broker})", "ok": True}


def _audit_sequencer_check() -> dict[str, Any]:
    """Sequencer lag: pending (unnumbered) audit events and the oldest one's age.

    Lag is reported, never a failure by itself: a crashed sequencer loses nothing (the next one
    numbers the pending rows), but the growing age shows the gap.
    """
    from django.db import DatabaseError

    # This process's part: "active", "standby" (a distributed web process: it sequences only
    # when rows wait AUDIT_SEQUENCER_STANDBY_S, i.e. no worker sequences), "standing in", "none".
    role = {"this_process": sequencer_role()}
    try:
        return {"ok": True, **sequencer_lag().as_dict(), **role}
    except DatabaseError as exc:  # the database check names an outage; this only says lag is unknown
        return {"ok": True, "degraded": f"audit sequencer lag unknown: {type(exc).__name__}", **role}


async def _guard(name: str, coro: Any) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout=CHECK_TIMEOUT_S)
    except Exception as exc:  # every failure is reported, none escapes as a 500
        logger.warning("healthz: %s check failed: %s", name, type(exc).__name__)
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"[:200]
        return {"ok": False, "error": reason}


def _rate_limiter_check() -> dict[str, Any]:
    return ratelimit.status(probe=True)


async def healthz(request: HttpRequest) -> JsonResponse:
    db, layer, execution, limiter = await asyncio.gather(
        _guard("database", sync_to_async(_database_check)()),
        _guard("channel_layer", _channel_layer_check()),
        _guard("execution", sync_to_async(_execution_check, thread_sensitive=False)()),
        _guard("rate_limiter", sync_to_async(_rate_limiter_check, thread_sensitive=False)()),
    )
    parts = {"database": db, "channel_layer": layer, "execution": execution, "rate_limiter": limiter}
    parts["audit_sequencer"] = await _guard("audit_sequencer", sync_to_async(_audit_sequencer_check)())
    listener = run_end_listener()  # started here too, so a probe warms a fresh process's listener
    if listener is not None:
        # Informational: while it is not listening, plain /v1 waiters are woken by the channel
        # layer (or their database poll) instead; nothing is lost (apps.runs.end_listener).
        parts["run_ends"] = {
            "ok": True,
            "backend": f"postgresql (LISTEN {CHANNEL})",
            "listening": listener.live,
        }
    failing = [name for name, part in parts.items() if not part["ok"]]
    critical = [name for name in failing if name in CRITICAL]
    degraded = [name for name, part in parts.items() if not part["ok"] or part.get("degraded")]
    if layer["ok"] is False:
        layer["degraded"] = "run progress is followed by polling the database; no live browser updates"
    status = "error" if critical else "degraded" if degraded else "ok"
    body: dict[str, Any] = {"status": status, **parts}
    if failing:
        body["failing"] = failing
    if degraded:
        body["degraded"] = degraded
    return JsonResponse(body, status=503 if critical else 200)
