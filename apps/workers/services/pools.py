"""Pool writes: create, update (members and preset conductors), add and remove a worker, disable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.governance.models import Team
from apps.governance.services import pool_grant
from apps.workers.engine_adapter import worker_unavailable_reason
from apps.workers.models import (
    PRESET_CONDUCTOR_FIELDS,
    Pool,
    PoolWorker,
    Worker,
)
from apps.workers.services.common import (
    POOL_FIELDS,
    _check_team_config,
    _require,
    _validate_slug,
    pool_snapshot,
)

# --- pools --------------------------------------------------------------------------------------------


def _check_pool_members(
    errors: dict[str, list[str]], workers: Sequence[Worker], default: Worker | None, conductor: Worker | None
) -> None:
    slugs = [w.slug for w in workers]
    if len(set(slugs)) != len(slugs):
        errors.setdefault("workers", []).append("A worker can appear only once in a pool.")
    if default is not None and default.pk not in {w.pk for w in workers}:
        errors.setdefault("default_worker", []).append(
            "The default worker must be one of the pool's workers."
        )


def _check_preset_conductors(errors: dict[str, list[str]], chosen: dict[str, Worker | None]) -> None:
    """A preset's own conductor must be usable now (enabled, its key resolvable): saving one that
    cannot plan would silently take that preset down."""
    for field, worker in chosen.items():
        if worker is None:
            continue
        reason = worker_unavailable_reason(worker)
        if reason:
            errors.setdefault(field, []).append(reason)


def pool_create(
    *,
    actor: Actor,
    team: Team | None,
    slug: str,
    name: str,
    description: str = "",
    workers: Sequence[Worker] = (),
    default_worker: Worker | None = None,
    conductor_worker: Worker | None = None,
    mini_conductor: Worker | None = None,
    ultra_conductor: Worker | None = None,
    enabled: bool = True,
) -> Pool:
    """Create a pool owned by ``team`` (None: a platform pool) and grant it to that team."""
    _check_team_config(actor, team, "pools")
    errors: dict[str, list[str]] = {}
    _validate_slug(errors, slug, Pool)
    if not (name or "").strip():
        errors.setdefault("name", []).append("Give the pool a name.")
    _check_pool_members(errors, workers, default_worker, conductor_worker)
    _check_preset_conductors(errors, {"mini_conductor": mini_conductor, "ultra_conductor": ultra_conductor})
    if errors:
        raise ValidationError(errors)

    with transaction.atomic():
        pool = Pool.objects.create(
            team=team,
            slug=slug,
            name=name.strip(),
            description=description,
            default_worker=default_worker or (workers[0] if workers else None),
            conductor_worker=conductor_worker,
            mini_conductor=mini_conductor,
            ultra_conductor=ultra_conductor,
            enabled=enabled,
        )
        for position, w in enumerate(workers):
            PoolWorker.objects.create(pool=pool, worker=w, position=position)
        audit_record(
            event_type=AuditEventType.POOL_CREATED,
            actor=actor,
            team=team,
            obj=pool,
            after=pool_snapshot(pool),
        )
        if team is not None:
            pool_grant(actor=None, pool=pool, team=team)
    return pool


def pool_update(
    *,
    actor: Actor,
    pool: Pool,
    workers: Sequence[Worker] | None = None,
    **changes: Any,
) -> Pool:
    """Edit pool fields (any of ``POOL_FIELDS``) and/or replace its ordered worker list."""
    if actor is not None:
        _require(Pool.objects.allows(actor, "change", pool), f"You cannot change the pool {pool.name}.")
    unknown = set(changes) - set(POOL_FIELDS)
    if unknown:
        raise TypeError(f"pool_update got unknown fields: {', '.join(sorted(unknown))}")
    before = pool_snapshot(pool)
    errors: dict[str, list[str]] = {}
    if "name" in changes and not (changes["name"] or "").strip():
        errors.setdefault("name", []).append("Give the pool a name.")
    members = (
        list(workers)
        if workers is not None
        else [e.worker for e in pool.pool_workers.select_related("worker")]
    )
    default = changes.get("default_worker", pool.default_worker)
    conductor = changes.get("conductor_worker", pool.conductor_worker)
    _check_pool_members(errors, members, default, conductor)
    # Only a newly named preset conductor is checked: one that broke later stays visible in health.
    _check_preset_conductors(
        errors,
        {
            f: changes[f]
            for f in PRESET_CONDUCTOR_FIELDS.values()
            if f in changes and changes[f] is not None and changes[f].pk != getattr(pool, f"{f}_id")
        },
    )
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        for name, value in changes.items():
            setattr(pool, name, value.strip() if name == "name" else value)
        if pool.default_worker_id is None and members:
            pool.default_worker = members[0]
        pool.save()
        if workers is not None:
            _set_pool_workers(pool, members)
        disabling = before["enabled"] and not pool.enabled
        audit_record(
            event_type=AuditEventType.POOL_DISABLED if disabling else AuditEventType.POOL_UPDATED,
            actor=actor,
            team=pool.team,
            obj=pool,
            before=before,
            after=pool_snapshot(pool),
        )
    return pool


def _set_pool_workers(pool: Pool, members: Iterable[Worker]) -> None:
    # Positions are the plan ids the conductor writes; rewrite them densely in the given order.
    PoolWorker.objects.filter(pool=pool).delete()
    for position, w in enumerate(members):
        PoolWorker.objects.create(pool=pool, worker=w, position=position)


def pool_add_worker(*, actor: Actor, pool: Pool, worker: Worker) -> Pool:
    members = [e.worker for e in pool.pool_workers.select_related("worker").order_by("position")]
    if worker.pk in {w.pk for w in members}:
        raise ValidationError({"worker": [f"“{worker.display_name}” is already in this pool."]})
    return pool_update(actor=actor, pool=pool, workers=[*members, worker])


def pool_remove_worker(*, actor: Actor, pool: Pool, worker: Worker) -> Pool:
    members = [e.worker for e in pool.pool_workers.select_related("worker").order_by("position")]
    remaining = [w for w in members if w.pk != worker.pk]
    changes: dict[str, Any] = {}
    if pool.default_worker_id == worker.pk:
        changes["default_worker"] = remaining[0] if remaining else None
    return pool_update(actor=actor, pool=pool, workers=remaining, **changes)


def pool_disable(*, actor: Actor, pool: Pool) -> Pool:
    return pool_update(actor=actor, pool=pool, enabled=False)
