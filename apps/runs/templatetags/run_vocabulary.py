"""The run view's vocabulary, from its one definition: statuses and event types from the engine
(``apps.engine.events``), strategy labels from ``apps.runs.models``. The page hands them to
``static/js/run_view.js`` as a JSON script tag, so the JavaScript repeats no status list."""

from __future__ import annotations

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from apps.engine.events import EventType, RunStatus, StepStatus
from apps.runs.models import TERMINAL_RUN_STATUSES, Strategy

register = template.Library()


def vocabulary() -> dict[str, object]:
    return {
        "run_statuses": [s.value for s in RunStatus],
        "step_statuses": [s.value for s in StepStatus],
        "terminal": sorted(str(s) for s in TERMINAL_RUN_STATUSES),
        "event_types": {e.name: e.value for e in EventType},
        "strategies": {str(value): str(label) for value, label in Strategy.choices},
    }


@register.simple_tag
def run_vocabulary() -> SafeString:
    return json_script(vocabulary(), "run-vocabulary")
