"""Reads for providers, workers and pools, on top of ``apps.governance.selectors``.

Providers and workers have no grants of their own: a team's providers/workers are configured by
that team's admins and policy admins; platform ones (no team) by superusers. A worker is visible
when it is in a visible pool or belongs to a provider the user configures.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q, QuerySet

from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.workers.models import Pool, PoolWorker, Provider, Worker

can_configure_team = gov.can_configure_team


def providers_editable_by(user: Any) -> QuerySet[Provider]:
    if not gov._active(user):
        return Provider.objects.none()
    if gov._super(user):
        return Provider.objects.all()
    return Provider.objects.filter(team__in=gov.teams_configurable_by(user))


def providers_visible_to(user: Any) -> QuerySet[Provider]:
    """Providers of the user's teams, and platform providers behind pools they can see."""
    if not gov._active(user):
        return Provider.objects.none()
    if gov._super(user):
        return Provider.objects.all()
    pool_providers = Worker.objects.filter(pools__in=gov.pools_visible_to(user)).values("provider")
    return Provider.objects.filter(
        Q(team__in=gov.teams_visible_to(user)) | Q(pk__in=pool_providers)
    ).distinct()


def workers_editable_by(user: Any) -> QuerySet[Worker]:
    return Worker.objects.filter(provider__in=providers_editable_by(user)).select_related("provider")


def workers_visible_to(user: Any) -> QuerySet[Worker]:
    if not gov._active(user):
        return Worker.objects.none()
    if gov._super(user):
        return Worker.objects.select_related("provider")
    return (
        Worker.objects.filter(
            Q(pools__in=gov.pools_visible_to(user)) | Q(provider__in=providers_editable_by(user))
        )
        .distinct()
        .select_related("provider")
    )


def can_edit_provider(user: Any, provider: Provider) -> bool:
    return gov.can_configure_team(user, provider.team)


def can_set_key_env(user: Any) -> bool:
    """Naming a server environment variable as a provider's key source reads the server's
    environment: a platform decision, so platform administrators only (issue 13)."""
    return gov._active(user) and gov._super(user)


def can_edit_worker(user: Any, worker: Worker) -> bool:
    return gov.can_configure_team(user, worker.provider.team)


def can_test_worker(user: Any, worker: Worker) -> bool:
    """Test connection sends a real (billed) request: only those who configure the worker or a pool using it."""
    if can_edit_worker(user, worker):
        return True
    return gov.pools_editable_by(user).filter(pool_workers__worker=worker).exists()


def pool_entries(pool: Pool) -> list[PoolWorker]:
    return list(pool.pool_workers.select_related("worker", "worker__provider").order_by("position"))


def pools_with_workers(qs: QuerySet[Pool]) -> QuerySet[Pool]:
    return qs.select_related("team", "default_worker", "conductor_worker").prefetch_related(
        Prefetch(
            "pool_workers",
            queryset=PoolWorker.objects.select_related("worker", "worker__provider").order_by("position"),
        )
    )


def teams_for_new_pool(user: Any) -> QuerySet[Team]:
    return gov.teams_configurable_by(user)
