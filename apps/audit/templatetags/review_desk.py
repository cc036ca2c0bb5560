"""The nav's review badge: how many runs await the viewer's review or a plan decision."""

from __future__ import annotations

from typing import Any

from django import template

from apps.audit.selectors import reviews_any_team
from apps.runs.approvals import approvals_to_decide
from apps.runs.review_queue import awaiting_review_count

register = template.Library()


@register.simple_tag(takes_context=True)
def review_nav(context: template.Context) -> dict[str, Any]:
    """``show``: the viewer reviews some team; ``count``: runs awaiting their review, plus plans
    held for an approver they may decide (not their own)."""

    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False) or not reviews_any_team(user):
        return {"show": False, "count": 0}
    approvals = approvals_to_decide(user).count()
    return {"show": True, "count": awaiting_review_count(user) + approvals, "approvals": approvals}
