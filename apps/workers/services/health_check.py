"""The per-worker health check: a tiny real request through the outbound gate, stored and audited."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.engine.providers import ProviderError
from apps.workers import ports, selectors
from apps.workers.engine_adapter import PoolUnavailable, build_engine_worker, worker_unavailable_reason
from apps.workers.models import (
    HealthStatus,
    Worker,
)
from apps.workers.services.common import _require

logger = logging.getLogger(__name__)

# --- health check -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthResult:
    status: str  # HealthStatus value
    latency_ms: float | None
    detail: str  # plain words, never a key


HEALTH_PROMPT = [{"role": "user", "content": "Reply with the single word: OK"}]


def _probe(worker: Worker) -> HealthResult:
    reason = worker_unavailable_reason(worker) if worker.enabled else None
    if reason:
        return HealthResult(HealthStatus.UNAVAILABLE, None, reason)
    if not worker.enabled:
        # A disabled worker can still be probed: admins test before enabling.
        worker = Worker(**{f.attname: getattr(worker, f.attname) for f in Worker._meta.concrete_fields})
        worker.enabled = True
    try:
        # No user text, but the same gate as every provider call (issue 39): the policy of the
        # provider's team (the platform's for a platform provider) reads the probe too.
        engine_worker = build_engine_worker(worker, gate=ports.outbound_gate(worker.provider.team))
    except PoolUnavailable as err:
        return HealthResult(HealthStatus.UNAVAILABLE, None, err.reason)
    started = time.perf_counter()
    try:
        engine_worker.complete(HEALTH_PROMPT, max_tokens=8, timeout=float(min(worker.timeout_s, 30)))
    except ProviderError as err:
        return HealthResult(
            HealthStatus.ERROR, round((time.perf_counter() - started) * 1000, 1), str(err)[:300]
        )
    except Exception as err:
        # The message of an unknown exception may echo request details: log the type only.
        logger.warning("health check of worker %s failed with %s", worker.slug, type(err).__name__)
        return HealthResult(
            HealthStatus.ERROR,
            round((time.perf_counter() - started) * 1000, 1),
            f"Unexpected error ({type(err).__name__}); see the server log.",
        )
    return HealthResult(HealthStatus.OK, round((time.perf_counter() - started) * 1000, 1), "Reachable")


def worker_health_check(*, actor: Actor, worker: Worker) -> HealthResult:
    """Send a tiny real request through the engine provider; store and audit the outcome."""
    if actor is not None:
        _require(selectors.can_test_worker(actor, worker), "You cannot test this worker.")
    result = _probe(worker)
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(
            health_status=result.status,
            health_detail=result.detail[:300],
            health_latency_ms=result.latency_ms,
            health_checked_at=timezone.now(),
        )
        audit_record(
            event_type=AuditEventType.WORKER_HEALTH_CHECKED,
            actor=actor,
            team=worker.provider.team,
            obj=worker,
            payload={"status": result.status, "latency_ms": result.latency_ms, "detail": result.detail},
        )
    worker.refresh_from_db(
        fields=["health_status", "health_detail", "health_latency_ms", "health_checked_at"]
    )
    return result
