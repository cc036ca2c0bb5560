"""Ports: what audit, low in the layers, needs from the apps above it.

Each is filled in the upper app's ``AppConfig.ready()`` (governance: the visibility rule and team
lookups; runs: the run models the review desk and retention work on), so audit never imports them.
Asking for a port nobody filled is a wiring error, reported as such.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

# (queryset, user, action) -> the rows the user may ``action``: apps.governance.visibility.restrict.
Restrict = Callable[[QuerySet[Any], Any, str], QuerySet[Any]]
# (rule, user, action, obj) -> may the user ``action`` obj: apps.governance.visibility.allows.
Allows = Callable[[Any, Any, str, Any], bool]


@dataclass(frozen=True)
class GovernancePort:
    restrict: Restrict
    allows: Allows
    team_id_for_slug: Callable[[str], int | None]
    # Does the user hold ``review_team_runs`` on some team (platform administrators on all)?
    reviews_any_team: Callable[[Any], bool]
    # (team id, retention days) for every team that erases run content after a while.
    retention_policies: Callable[[], Iterable[tuple[int, int]]]


@dataclass(frozen=True)
class RunsPort:
    run: Any  # the Run model; ``run.objects.visible_to(user, action)`` is its visibility rule
    step: Any
    run_event: Any
    run_call: Any
    terminal_statuses: tuple[str, ...]
    review_none: str
    review_pending: str
    review_flagged: str


@dataclass
class _Registry:
    governance: GovernancePort | None = None
    runs: RunsPort | None = None


_registry = _Registry()


def register_governance(port: GovernancePort) -> None:
    _registry.governance = port


def register_runs(port: RunsPort) -> None:
    _registry.runs = port


def governance() -> GovernancePort:
    if _registry.governance is None:
        raise RuntimeError("apps.governance is not installed: audit has no visibility rule")
    return _registry.governance


def runs() -> RunsPort:
    if _registry.runs is None:
        raise RuntimeError("apps.runs is not installed: audit has no run models")
    return _registry.runs
