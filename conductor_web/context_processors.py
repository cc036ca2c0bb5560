from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

NAV_ITEMS = [
    ("playground", "Playground"),
    ("runs:list", "Runs"),
    ("insights:dashboard", "Insights"),
    ("workers:pool_list", "Pools"),
    ("policies:policy_list", "Policies"),
    ("audit:event_list", "Audit"),
    ("governance:team_list", "Teams"),
]


# Pages under /audit/ that belong to the review desk: the nav marks Review current, not Audit
# (issue 42: both were highlighted on a run's review page).
REVIEW_VIEWS = frozenset(
    {"audit:review_queue", "audit:review_bulk", "audit:run_review", "audit:flag_resolve"}
)


def navigation(request: HttpRequest) -> dict[str, Any]:
    match = getattr(request, "resolver_match", None)
    on_review = match is not None and match.view_name in REVIEW_VIEWS
    return {
        "nav_items": NAV_ITEMS,
        "execution_backend": settings.EXECUTION_BACKEND,
        "nav_on_review": on_review,
    }
