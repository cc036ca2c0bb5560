"""``{% experiments_nav as show %}``: whether the nav shows Experiments (users who may run somewhere)."""

from __future__ import annotations

from typing import Any

from django import template

from apps.governance import selectors as gov

register = template.Library()


@register.simple_tag(takes_context=True)
def experiments_nav(context: Any) -> bool:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return False
    return gov.teams_runnable_by(user).exists()
