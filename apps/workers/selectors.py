"""Reads for providers, workers and pools, on top of ``apps.governance.selectors``.

Providers and workers have no grants of their own: a team's providers/workers are configured by
that team's admins and policy admins; platform ones (no team) by superusers. A worker is visible
when it is in a visible pool or belongs to a provider the user configures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, Prefetch, Q, QuerySet

from apps.core.lru import Lru
from apps.core.types import Viewer
from apps.governance import selectors as gov
from apps.governance.access_version import AccessCache
from apps.governance.models import Team
from apps.governance.visibility import is_active_user, is_platform_admin
from apps.workers.engine_adapter import worker_unavailable_reason
from apps.workers.health import Traffic, worker_traffic
from apps.workers.models import PRESET_CONDUCTOR_FIELDS, HealthStatus, Pool, PoolWorker, Provider, Worker

can_configure_team = gov.can_configure_team


def providers_editable_by(user: Viewer) -> QuerySet[Provider]:
    if not is_active_user(user):
        return Provider.objects.none()
    if is_platform_admin(user):
        return Provider.objects.all()
    return Provider.objects.filter(team__in=gov.teams_configurable_by(user))


def providers_visible_to(user: Viewer) -> QuerySet[Provider]:
    """Providers of the user's teams, and platform providers behind pools they can see."""
    if not is_active_user(user):
        return Provider.objects.none()
    if is_platform_admin(user):
        return Provider.objects.all()
    pool_providers = Worker.objects.filter(pools__in=Pool.objects.visible_to(user, "view")).values("provider")
    return Provider.objects.filter(
        Q(team__in=gov.teams_visible_to(user)) | Q(pk__in=pool_providers)
    ).distinct()


def workers_editable_by(user: Viewer) -> QuerySet[Worker]:
    return Worker.objects.filter(provider__in=providers_editable_by(user)).select_related("provider")


def workers_visible_to(user: Viewer) -> QuerySet[Worker]:
    if not is_active_user(user):
        return Worker.objects.none()
    if is_platform_admin(user):
        return Worker.objects.select_related("provider")
    return (
        Worker.objects.filter(
            Q(pools__in=Pool.objects.visible_to(user, "view")) | Q(provider__in=providers_editable_by(user))
        )
        .distinct()
        .select_related("provider")
    )


def can_edit_provider(user: Viewer, provider: Provider) -> bool:
    return gov.can_configure_team(user, provider.team)


def can_set_key_env(user: Viewer) -> bool:
    """Naming a server environment variable as a provider's key source reads the server's
    environment: a platform decision, so platform administrators only (issue 13)."""
    return is_platform_admin(user)


def can_edit_worker(user: Viewer, worker: Worker) -> bool:
    return gov.can_configure_team(user, worker.provider.team)


def can_test_worker(user: Viewer, worker: Worker) -> bool:
    """Test connection sends a real (billed) request: only those who configure the worker or a pool using it."""
    if can_edit_worker(user, worker):
        return True
    return Pool.objects.visible_to(user, "change").filter(pool_workers__worker=worker).exists()


def pool_entries(pool: Pool) -> list[PoolWorker]:
    return list(pool.pool_workers.select_related("worker", "worker__provider").order_by("position"))


def pools_with_workers(qs: QuerySet[Pool]) -> QuerySet[Pool]:
    return qs.select_related(
        "team", "default_worker", "conductor_worker", "mini_conductor", "ultra_conductor"
    ).prefetch_related(
        Prefetch(
            "pool_workers",
            queryset=PoolWorker.objects.select_related("worker", "worker__provider").order_by("position"),
        )
    )


def teams_for_new_pool(user: Viewer) -> QuerySet[Team]:
    return gov.teams_configurable_by(user)


# --- pool health ------------------------------------------------------------------------------------
# A pool is *ready* only when at least one of its allowed workers (enabled, credentials usable)
# passed its last health check, and its conductor (when it has its own) did too. Configuration
# alone ("a key is set") is not readiness: the last real probe decides.

PASSING, FAILING, UNCHECKED, UNAVAILABLE = "passing", "failing", "unchecked", "unavailable"


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    worker: Worker
    role: str  # "worker" or "conductor"
    state: str  # passing | failing | unchecked | unavailable
    reason: str  # plain words why it does not pass ("" when it does); never a key
    traffic: Traffic | None = None  # from its real calls (issue 44); None before its first call

    @property
    def passing(self) -> bool:
        return self.state == PASSING


@dataclass(frozen=True, slots=True)
class PoolHealth:
    state: str  # ready | failing | unchecked | unavailable
    reason: str  # "" when ready
    workers: tuple[WorkerHealth, ...]
    # (preset, why it cannot plan): a preset whose own conductor does not pass; the others run
    presets_unavailable: tuple[tuple[str, str], ...] = ()

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def not_passing(self) -> list[WorkerHealth]:
        return [w for w in self.workers if not w.passing]

    @property
    def failing(self) -> list[WorkerHealth]:
        """Failing or unusable: what the pool page calls "not passing"."""
        return [w for w in self.workers if w.state in (FAILING, UNAVAILABLE)]

    @property
    def unchecked(self) -> list[WorkerHealth]:
        """Never tested and never called: unknown, not failing (issue 42)."""
        return [w for w in self.workers if w.state == UNCHECKED]


def worker_health(worker: Worker, *, role: str = "worker", traffic: Traffic | None = None) -> WorkerHealth:
    """From the last explicit check and, since issue 44, the worker's real calls: an open circuit
    breaker fails it whatever the check said; a closed one that answered recent calls passes it
    when no check says otherwise (a pool that served runs is no longer "not checked")."""
    name = worker.display_name
    reason = worker_unavailable_reason(worker)
    if reason:
        return WorkerHealth(worker, role, UNAVAILABLE, reason, traffic)
    if traffic is not None and traffic.state != "closed":
        return WorkerHealth(
            worker,
            role,
            FAILING,
            f"“{name}” is down: its last {traffic.consecutive_failures} calls failed (circuit {traffic.state}).",
            traffic,
        )
    if worker.health_status == HealthStatus.OK:
        return WorkerHealth(worker, role, PASSING, "", traffic)
    served = traffic is not None and traffic.last_ok
    if worker.health_status == HealthStatus.UNKNOWN:
        if served:
            return WorkerHealth(worker, role, PASSING, "", traffic)
        return WorkerHealth(worker, role, UNCHECKED, f"“{name}” has not been checked yet.", traffic)
    if (
        served
        and traffic is not None
        and worker.health_checked_at
        and traffic.last_call_at > worker.health_checked_at
    ):
        return WorkerHealth(worker, role, PASSING, "", traffic)  # answered since the failed check
    detail = worker.health_detail or "no detail recorded"
    when = f" ({worker.health_checked_at:%Y-%m-%d %H:%M} UTC)" if worker.health_checked_at else ""
    return WorkerHealth(
        worker, role, FAILING, f"“{name}” failed its last health check{when}: {detail}", traffic
    )


def pool_health(pool: Pool, entries: list[PoolWorker] | None = None) -> PoolHealth:
    """The pool's readiness from its workers' last health checks and real calls (no request is
    sent here)."""
    if entries is None:
        entries = pool_entries(pool)
    if not pool.enabled:
        return PoolHealth(UNAVAILABLE, f"The pool “{pool.name}” is disabled.", ())
    if not entries:
        return PoolHealth(UNAVAILABLE, f"The pool “{pool.name}” has no workers.", ())
    presets_own = pool.own_preset_conductors()
    ids = (
        [e.worker_id for e in entries]
        + [pool.conductor_worker_id or 0]
        + [w.pk for w in presets_own.values()]
    )
    traffic = worker_traffic(ids)
    workers = [worker_health(e.worker, traffic=traffic.get(e.worker_id)) for e in entries]
    conductor = pool.conductor_worker
    cond: WorkerHealth | None = None
    if conductor is not None:
        # The conductor plans every run: when it fails, no run starts, whoever else passes.
        cond = next((w for w in workers if w.worker.pk == conductor.pk), None)
        if cond is None:
            cond = worker_health(conductor, role="conductor", traffic=traffic.get(conductor.pk))
            workers.append(cond)
    # A preset's own conductor plans that preset only: failing, it makes that preset unavailable.
    presets_unavailable: list[tuple[str, str]] = []
    for preset, own in presets_own.items():
        role = f"conductor-{preset}"
        h = next((w for w in workers if w.worker.pk == own.pk), None)
        if h is None or h.role != "worker":
            h = worker_health(own, role=role, traffic=traffic.get(own.pk))
            workers.append(h)
        if not h.passing:
            presets_unavailable.append((role, f"The conductor of {role}: {h.reason}"))
    unavailable = tuple(presets_unavailable)

    def verdict(state: str, reason: str) -> PoolHealth:
        return PoolHealth(state, reason, tuple(workers), unavailable)

    members = [w for w in workers if w.role == "worker"]
    allowed = [w for w in members if w.state != UNAVAILABLE]
    if not allowed:
        return verdict(UNAVAILABLE, f"No worker of “{pool.name}” can be called: {members[0].reason}")
    if cond is not None and not cond.passing:
        return verdict(cond.state if cond.state != PASSING else FAILING, f"The conductor: {cond.reason}")
    if any(w.passing for w in allowed):
        return verdict("ready", "")
    if all(w.state == UNCHECKED for w in allowed):
        return verdict(UNCHECKED, "No worker has passed a health check yet: test a worker's connection.")
    failing = "; ".join(w.reason for w in allowed if w.state == FAILING)
    return verdict(FAILING, f"No allowed worker passes its health check. {failing}")


# --- a pool's worker rows, cached by what they were read from ------------------------------------
#
# Every run reads its pool's workers (with providers and fallbacks) twice: run_create's pre-check
# and execution's engine pool. The rows change only through saves that bump ``updated_at`` (pool
# edits rewrite the membership and save the pool; worker and provider edits save those rows), so
# one aggregate query says whether the rows read earlier in this process are still the rows.
# Keys, egress rules and availability are still judged from the rows on every call.


@dataclass(frozen=True, slots=True)
class PoolRows:
    entries: tuple[PoolWorker, ...]  # position order; worker, provider, fallback loaded
    conductor: Worker | None  # the pool's own conductor (provider loaded), if it names one
    presets: tuple[tuple[str, Worker], ...] = ()  # (preset, its own conductor), provider loaded


_POOL_ROWS_MAX = 256
_pool_rows: Lru[tuple[Any, ...], PoolRows] = Lru(_POOL_ROWS_MAX)


def _conductor_ids(pool: Pool) -> list[int]:
    # The pool's conductor and each preset's own: a change of any of them changes the rows.
    ids = [pool.conductor_worker_id, pool.mini_conductor_id, pool.ultra_conductor_id]
    return [i for i in ids if i]


def _pool_rows_token(pool: Pool) -> tuple[Any, ...]:
    conductors = _conductor_ids(pool)
    members = Q(pools=pool) | Q(pk__in=conductors) if conductors else Q(pools=pool)
    seen = Worker.objects.filter(members).aggregate(
        n=Count("pk", distinct=True),
        worker=Max("updated_at"),
        provider=Max("provider__updated_at"),
        fallback=Max("fallback__updated_at"),
    )
    return (
        pool.pk,
        pool.updated_at,
        pool.conductor_worker_id,
        pool.mini_conductor_id,
        pool.ultra_conductor_id,
        seen["n"],
        seen["worker"],
        seen["provider"],
        seen["fallback"],
    )


# With an access version (read by the caller inside a query it makes anyway), no query at all: a
# write to a pool, worker, provider or membership row changes the version (access_version).
_pool_rows_by_stamp: AccessCache[PoolRows] = AccessCache(size=_POOL_ROWS_MAX)


def pool_rows(pool: Pool, stamp: int | None = None) -> PoolRows:
    """The pool's worker rows and conductors: no query while the access version ``stamp`` is
    current, one when this process read them already, else a full read."""
    if stamp is None:
        return _pool_rows_by_token(pool)
    rows = _pool_rows_by_stamp.get(stamp, pool.pk)
    if rows is None:
        # A new version: read the rows themselves. The freshness token would miss a change made
        # without touching ``updated_at`` (a bulk UPDATE, raw SQL); the version does not.
        rows = _pool_rows_read(pool)
        _pool_rows_by_stamp.put(stamp, pool.pk, rows)
    return rows


def _pool_rows_by_token(pool: Pool) -> PoolRows:
    key = _pool_rows_token(pool)
    hit = _pool_rows.get(key)
    if hit is not None:
        return hit
    rows = _pool_rows_read(pool)
    _pool_rows.put(key, rows)
    return rows


def _pool_rows_read(pool: Pool) -> PoolRows:
    entries = tuple(
        pool.pool_workers.select_related("worker", "worker__provider", "worker__fallback").order_by(
            "position"
        )
    )
    conductors = _conductor_ids(pool)
    by_pk = (
        {w.pk: w for w in Worker.objects.select_related("provider").filter(pk__in=conductors)}
        if conductors
        else {}
    )
    conductor = by_pk.get(pool.conductor_worker_id) if pool.conductor_worker_id else None
    presets = tuple(
        (preset, by_pk[getattr(pool, f"{name}_id")])
        for preset, name in PRESET_CONDUCTOR_FIELDS.items()
        if getattr(pool, f"{name}_id") in by_pk
    )
    return PoolRows(entries, conductor, presets)


def worker_labels(rows: PoolRows) -> dict[str, tuple[int, str, str]]:
    """slug -> (pk, model name, provider kind) of every worker and conductor in ``rows``: what a
    run's sink and metrics need per event, known without a read (issue #15)."""
    workers = [entry.worker for entry in rows.entries]
    workers += [w for w in (rows.conductor, *(c for _, c in rows.presets)) if w is not None]
    return {w.slug: (w.pk, w.model_name, w.provider.kind) for w in workers}


def clear_pool_rows_cache() -> None:
    _pool_rows_by_stamp.clear()
    _pool_rows.clear()
