"""The learned router's reads."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Count, QuerySet

from apps.learning.models import Decision, Router


def decision_for_run(run_id: UUID | str) -> Decision | None:
    return Decision.objects.filter(run_id=run_id).select_related("router").first()


def router_versions(team: Any) -> QuerySet[Router]:
    return Router.objects.filter(team=team).order_by("-version")


def recent_decisions(team: Any, limit: int = 25) -> QuerySet[Decision]:
    return Decision.objects.filter(team=team).order_by("-created_at")[:limit]


def arm_counts(team: Any) -> list[dict[str, Any]]:
    """Per arm: how often chosen, how often by exploration, rewarded count and mean reward."""
    rows = Decision.objects.filter(team=team).values("chosen_arm").annotate(n=Count("id")).order_by("-n")
    out: list[dict[str, Any]] = []
    for row in rows:
        qs = Decision.objects.filter(team=team, chosen_arm=row["chosen_arm"])
        rewards = [
            float(r) for r in qs.exclude(reward=None).values_list("reward", flat=True) if r is not None
        ]
        out.append(
            {
                "arm": row["chosen_arm"],
                "chosen": row["n"],
                "explored": qs.filter(explored=True).count(),
                "rewarded": len(rewards),
                "mean_reward": (sum(rewards) / len(rewards)) if rewards else None,
            }
        )
    return out


def explored_share(team: Any) -> float:
    total = Decision.objects.filter(team=team).count()
    return Decision.objects.filter(team=team, explored=True).count() / total if total else 0.0
