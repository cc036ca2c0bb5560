"""One way to write a duration on every page (issue 42): milliseconds below a second, seconds
with one decimal above (``static/js/run_view.js`` ``fmtDuration`` writes the same)."""

from __future__ import annotations

from typing import Any

from django import template

from apps.runs.models import strategy_name as _strategy_name

register = template.Library()


@register.filter
def duration(ms: Any) -> str:
    """``97177`` -> ``97.2 s``; ``850`` -> ``850 ms``; nothing -> ``—``."""
    try:
        value = float(ms)
    except (TypeError, ValueError):
        return "—"
    if value < 1000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


@register.filter
def strategy_name(value: Any) -> str:
    """A strategy or experiment arm by the playground's name (``moa`` -> ``Mixture of agents``)."""
    return _strategy_name(str(value or ""))
