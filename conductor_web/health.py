"""``GET /healthz``: each runtime part names its backend and proves it answers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 3.0


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
        from apps.runs.execution import thread_executor_alive

        if not thread_executor_alive():
            raise RuntimeError("the in-process run executor is shut down")
        return {"backend": "thread", "ok": True}
    from conductor_web.celery import app

    broker = app.conf.broker_url.split("://", 1)[0]
    with app.connection_for_write() as conn:
        # kombu takes float seconds here; its stubs say int.
        conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_S)  # type: ignore[arg-type]
    return {"backend": f"celery ({broker})", "ok": True}


async def _guard(name: str, coro: Any) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout=CHECK_TIMEOUT_S)
    except Exception as exc:  # every failure is reported, none escapes as a 500
        logger.warning("healthz: %s check failed: %s", name, type(exc).__name__)
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"[:200]
        return {"ok": False, "error": reason}


async def healthz(request: HttpRequest) -> JsonResponse:
    db, layer, execution = await asyncio.gather(
        _guard("database", sync_to_async(_database_check)()),
        _guard("channel_layer", _channel_layer_check()),
        _guard("execution", sync_to_async(_execution_check, thread_sensitive=False)()),
    )
    parts = {"database": db, "channel_layer": layer, "execution": execution}
    failing = [name for name, part in parts.items() if not part["ok"]]
    body: dict[str, Any] = {"status": "ok" if not failing else "error", **parts}
    if failing:
        body["failing"] = failing
    return JsonResponse(body, status=200 if not failing else 503)
