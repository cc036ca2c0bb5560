"""Template helpers so ``audit/_review_panel.html`` works when included with only ``run``."""

from __future__ import annotations

from typing import Any

from django import template

from apps.audit.selectors import reviews_for_run
from apps.runs.models import Run

register = template.Library()


@register.simple_tag(takes_context=True)
def review_state(context: template.Context, run: Run) -> dict[str, Any]:
    """``reviews`` and ``can_review`` from the context if given, else from the selectors."""

    reviews = context.get("reviews")
    can_review = context.get("can_review")
    if reviews is None:
        reviews = reviews_for_run(run)
    if can_review is None:
        user = getattr(context.get("request"), "user", None)
        can_review = user is not None and Run.objects.allows(user, "review", run)
    return {"reviews": reviews, "can_review": bool(can_review)}
