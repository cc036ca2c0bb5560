"""Ports: what audit, low in the layers, needs from the apps above it.

Filled in governance's ``AppConfig.ready()`` (the visibility rule, team lookups, "reviews any
team"), so audit never imports it; a run is read through the ``AuditedRun`` protocol. Runs needs
no port: reviews and retention are the runs side's own code (``apps.runs.reviews``,
``apps.runs.retention``) and write their own audit rows.
Asking for a port nobody filled is a wiring error, reported as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.db.models import QuerySet

# (queryset, user, action) -> the rows the user may ``action``: apps.governance.visibility.restrict.
Restrict = Callable[[QuerySet[Any], Any, str], QuerySet[Any]]
# (rule, user, action, obj) -> may the user ``action`` obj: apps.governance.visibility.allows.
Allows = Callable[[Any, Any, str, Any], bool]


class AuditedRun(Protocol):
    """What audit reads of a run (``apps.runs.models.Run`` is one): audit sits below runs."""

    # Read-only members: a model's fields satisfy them whatever their exact stub types.
    @property
    def pk(self) -> Any: ...
    @property
    def team(self) -> Any: ...
    @property
    def team_id(self) -> Any: ...
    @property
    def policy_version_id(self) -> Any: ...
    @property
    def created_by_id(self) -> Any: ...
    @property
    def answer_held(self) -> bool: ...


@dataclass(frozen=True)
class GovernancePort:
    restrict: Restrict
    allows: Allows
    team_id_for_slug: Callable[[str], int | None]
    # Does the user hold ``review_team_runs`` on some team (platform administrators on all)?
    reviews_any_team: Callable[[Any], bool]


@dataclass
class _Registry:
    governance: GovernancePort | None = None


_registry = _Registry()


def register_governance(port: GovernancePort) -> None:
    _registry.governance = port


def governance() -> GovernancePort:
    if _registry.governance is None:
        raise RuntimeError("apps.governance is not installed: audit has no visibility rule")
    return _registry.governance
