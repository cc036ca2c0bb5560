"""Factories for api: keys go through ``apps.api.services.apikey_create`` (audited, hashed)."""

from __future__ import annotations

from typing import Any

from apps.api.models import ApiKeyRole
from apps.api.services import CreatedApiKey, apikey_create


def make_api_key(
    team: Any,
    *,
    name: str = "test key",
    role: str = ApiKeyRole.RUN,
    principal: Any = None,
    **kwargs: Any,
) -> CreatedApiKey:
    """A key for ``team`` created by the system, acting for ``principal`` (default: a team admin)."""
    return apikey_create(actor=None, team=team, name=name, role=role, principal=principal, **kwargs)
