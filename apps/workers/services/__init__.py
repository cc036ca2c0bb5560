"""Provider, worker and pool writes, and the per-worker health check (a package re-exported here:
``common``, ``providers``, ``workers``, ``pools``, ``health_check``).

Each write: one transaction → permission and validation → save → ``audit_record`` with masked
before/after values (a key is represented only by ``api_key_set``/``api_key_last4``).
``actor=None`` is the system (seeding, tests).
"""

from __future__ import annotations

from apps.workers.services.common import (
    KEY_ENV_RULE,
    KIND_FIELDS,
    POOL_FIELDS,
    PROVIDER_FIELDS,
    RESERVED_POOL_SLUGS,
    WORKER_FIELDS,
    pool_snapshot,
    provider_snapshot,
    validate_provider_settings,
    worker_snapshot,
)
from apps.workers.services.health_check import HEALTH_PROMPT, HealthResult, worker_health_check
from apps.workers.services.pools import (
    pool_add_worker,
    pool_create,
    pool_disable,
    pool_remove_worker,
    pool_update,
)
from apps.workers.services.providers import provider_create, provider_update
from apps.workers.services.workers import worker_create, worker_disable, worker_update

__all__ = [
    "HEALTH_PROMPT",
    "KEY_ENV_RULE",
    "KIND_FIELDS",
    "POOL_FIELDS",
    "PROVIDER_FIELDS",
    "RESERVED_POOL_SLUGS",
    "WORKER_FIELDS",
    "HealthResult",
    "pool_add_worker",
    "pool_create",
    "pool_disable",
    "pool_remove_worker",
    "pool_snapshot",
    "pool_update",
    "provider_create",
    "provider_snapshot",
    "provider_update",
    "validate_provider_settings",
    "worker_create",
    "worker_disable",
    "worker_health_check",
    "worker_snapshot",
    "worker_update",
]
