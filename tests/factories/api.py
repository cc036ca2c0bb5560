"""Factories for api: keys go through ``apps.api.services.apikey_create`` (audited, hashed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apps.api.models import ApiScope
from apps.api.services import CreatedApiKey, apikey_create

# The scopes each former key role became (migration api.0003); kept so older tests read naturally.
ROLE_SCOPES: dict[str, list[str]] = {
    "run": [ApiScope.RUNS_WRITE, ApiScope.RUNS_READ],
    "read": [ApiScope.RUNS_READ],
    "admin": list(ApiScope.values),
}


def make_api_key(
    team: Any,
    *,
    name: str = "test key",
    scopes: Iterable[str] | None = None,
    role: str | None = None,
    principal: Any = None,
    **kwargs: Any,
) -> CreatedApiKey:
    """A key for ``team`` created by the system, acting for ``principal`` (default: a team admin).

    ``scopes`` default to the least-privilege default; ``role`` (run/read/admin) is shorthand for
    the scopes that role was migrated to."""
    if scopes is None and role is not None:
        scopes = ROLE_SCOPES[role]
    return apikey_create(actor=None, team=team, name=name, scopes=scopes, principal=principal, **kwargs)
