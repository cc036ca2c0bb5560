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


def navigation(request: HttpRequest) -> dict[str, Any]:
    return {"nav_items": NAV_ITEMS, "execution_backend": settings.EXECUTION_BACKEND}
