"""The database side of the per-worker circuit breaker (issue 44; the engine's port is
``apps.engine.health.HealthPort``).

One ``WorkerBreaker`` row per worker holds the breaker; ``WorkerCall`` rows are the recent calls
(success rate, p50/p95 latency, the error rate over a window). Every change is a conditional
UPDATE with ``F()``, so two processes recording at once lose no count and only one of them claims
a half-open probe. Both runtimes use it: SQLite embedded, PostgreSQL distributed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.core.compiled import CompiledRead
from apps.workers.models import BreakerState, Worker, WorkerBreaker, WorkerCall

logger = logging.getLogger(__name__)

KEEP_CALLS = 200  # recent calls kept per worker; the figures read the last STATS_CALLS
STATS_CALLS = 100


def _cooldown() -> timedelta:
    return timedelta(seconds=float(settings.CIRCUIT_COOLDOWN_S))


# slug -> pk: a worker's pk never changes and slugs are unique, so a process looks each up once
# (a worker deleted and made again under its slug is looked up again: see ``_worker_id``).
_PKS: dict[str, int] = {}


def _worker_id(key: str, *, fresh: bool = False) -> int | None:
    if not fresh and key in _PKS:
        return _PKS[key]
    pk = Worker.objects.filter(slug=key).values_list("pk", flat=True).first()
    if pk is None:
        _PKS.pop(key, None)
    else:
        _PKS[key] = pk
    return pk


# The breaker read before every provider call, compiled once per process (apps.core.compiled):
# building and compiling the queryset each time was most of its cost.
_NOT_CLOSED = CompiledRead(
    lambda vendor, slug: (
        WorkerBreaker.objects.filter(worker__slug=slug)
        .exclude(state=BreakerState.CLOSED)
        .order_by("pk")
        .values_list("worker_id")[:1]
    ),
    placeholders=[Worker._meta.get_field("slug")],
)


class DbWorkerHealth:
    """``HealthPort`` over the database; stateless, so one instance may serve every run."""

    def unavailable(self, keys: Iterable[str]) -> set[str]:
        due = timezone.now() - _cooldown()
        rows = WorkerBreaker.objects.filter(worker__slug__in=list(keys)).filter(
            Q(state=BreakerState.OPEN, opened_at__gt=due) | Q(state=BreakerState.HALF_OPEN, probe_at__gt=due)
        )
        return set(rows.values_list("worker__slug", flat=True))

    def admit(self, key: str) -> bool:
        # One statement in the common case (closed, or no row yet: nothing is returned).
        rows = _NOT_CLOSED.rows(key)
        if not rows:
            return True
        row = rows[0][0]
        now = timezone.now()
        due = now - _cooldown()
        # One probe per cool-down: whoever's UPDATE matches first sends it (a lost probe — its run
        # cancelled — is claimable again one cool-down later).
        claimed = (
            WorkerBreaker.objects.filter(worker_id=row)
            .filter(
                Q(state=BreakerState.OPEN, opened_at__lte=due)
                | Q(state=BreakerState.HALF_OPEN, probe_at__lte=due)
            )
            .update(state=BreakerState.HALF_OPEN, probe_at=now)
        )
        if claimed:
            logger.info("circuit breaker: %s half-open, one probe goes out", key)
        return bool(claimed)

    def record(self, key: str, *, ok: bool, latency_ms: float | None) -> None:
        worker_id = _worker_id(key)
        if worker_id is None:
            return  # a worker deleted since the pool was built
        try:  # autocommit on the executor's threads: no savepoint (statements are counted)
            call = WorkerCall.objects.create(worker_id=worker_id, ok=ok, latency_ms=latency_ms)
        except IntegrityError:  # deleted, maybe made again under the same slug
            worker_id = _worker_id(key, fresh=True)
            if worker_id is None:
                return
            call = WorkerCall.objects.create(worker_id=worker_id, ok=ok, latency_ms=latency_ms)
        rows = WorkerBreaker.objects.filter(worker_id=worker_id)
        if ok:
            # Two statements per answered call (the INSERT above and this UPDATE, which matches a
            # row only after failures): the /v1 statement budget counts them.
            closed = rows.exclude(state=BreakerState.CLOSED, consecutive_failures=0).update(
                state=BreakerState.CLOSED, consecutive_failures=0, opened_at=None, probe_at=None
            )
            if closed:
                logger.info("circuit breaker: %s answered, closed", key)
        else:
            _ensure_row(worker_id)
            now = timezone.now()
            rows.update(consecutive_failures=F("consecutive_failures") + 1, last_failure_at=now)
            opened = rows.filter(state=BreakerState.HALF_OPEN).update(
                state=BreakerState.OPEN, opened_at=now, probe_at=None
            )  # the probe failed: another cool-down
            if not opened and (
                rows.filter(consecutive_failures__gte=settings.CIRCUIT_FAILURES).exists()
                or _rate_exceeded(worker_id)
            ):
                opened = rows.filter(state=BreakerState.CLOSED).update(state=BreakerState.OPEN, opened_at=now)
            if opened:
                logger.warning(
                    "circuit breaker: %s is down, open for %.0f s", key, settings.CIRCUIT_COOLDOWN_S
                )
        if call.pk % 50 == 0:
            _prune(worker_id)


def _ensure_row(worker_id: int) -> None:
    if WorkerBreaker.objects.filter(worker_id=worker_id).exists():
        return
    try:
        with transaction.atomic():
            WorkerBreaker.objects.create(worker_id=worker_id)
    except IntegrityError:
        pass  # another process created it first


def _rate_exceeded(worker_id: int) -> bool:
    window = int(settings.CIRCUIT_WINDOW)
    recent = list(
        WorkerCall.objects.filter(worker_id=worker_id).order_by("-id").values_list("ok", flat=True)[:window]
    )
    if len(recent) < window:
        return False  # too few calls to call it a rate
    return recent.count(False) / len(recent) >= float(settings.CIRCUIT_ERROR_RATE)


def _prune(worker_id: int) -> None:
    edge = (
        WorkerCall.objects.filter(worker_id=worker_id)
        .order_by("-id")
        .values_list("id", flat=True)[KEEP_CALLS:][:1]
    )
    first_old = list(edge)
    if first_old:
        WorkerCall.objects.filter(worker_id=worker_id, id__lte=first_old[0]).delete()


@dataclass(frozen=True, slots=True)
class Traffic:
    """A worker's health from its real calls (the pool page and /metrics)."""

    state: str  # closed / open / half_open
    calls: int  # in the recent window the figures are taken over
    success_rate: float
    p50_ms: float | None
    p95_ms: float | None
    consecutive_failures: int
    last_ok: bool  # the most recent call answered
    last_call_at: datetime


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    # nearest rank: an observed latency, not an interpolation between two
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def worker_traffic(worker_ids: Iterable[int]) -> dict[int, Traffic]:
    """Traffic figures for the workers that have any recorded call (no row: closed, never
    failed; the breaker row is made at a worker's first failure)."""
    ids = list(worker_ids)
    called = set(WorkerCall.objects.filter(worker_id__in=ids).values_list("worker_id", flat=True).distinct())
    breakers = {b.worker_id: b for b in WorkerBreaker.objects.filter(worker_id__in=called)}
    out: dict[int, Traffic] = {}
    for worker_id in sorted(called):
        recent = list(
            WorkerCall.objects.filter(worker_id=worker_id)
            .order_by("-id")
            .values_list("ok", "latency_ms", "at")[:STATS_CALLS]
        )
        if not recent:
            continue
        latencies = sorted(lat for ok, lat, _ in recent if ok and lat is not None)
        breaker = breakers.get(worker_id)
        out[worker_id] = Traffic(
            state=breaker.state if breaker is not None else BreakerState.CLOSED.value,
            calls=len(recent),
            success_rate=sum(1 for ok, _, _ in recent if ok) / len(recent),
            p50_ms=_percentile(latencies, 0.5),
            p95_ms=_percentile(latencies, 0.95),
            consecutive_failures=breaker.consecutive_failures if breaker is not None else 0,
            last_ok=recent[0][0],
            last_call_at=recent[0][2],
        )
    return out
