"""One vocabulary (issue 16): the run view's JavaScript names statuses and event types only
through the page's ``run-vocabulary`` JSON (read from the engine's and runs app's enums)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from django.template import Context, Template

from apps.engine.events import EventType, RunStatus
from apps.runs.models import TERMINAL_RUN_STATUSES, Strategy

JS = Path(__file__).resolve().parents[2] / "static" / "js" / "run_view.js"


def test_every_event_name_the_script_uses_exists_in_the_engine() -> None:
    source = JS.read_text()
    used = set(re.findall(r"\bEV\.([A-Z_]+)", source))
    assert used, "the script names no event types through EV"
    assert used <= {e.name for e in EventType}, used - {e.name for e in EventType}
    # No event type or run status spelled out as a literal any more.
    literals = re.findall(r"[\"'](?:run|plan|step|guardrail)\.[a-z_]+[\"']", source)
    assert literals == []
    assert not re.search(r"\[\s*\"succeeded\",\s*\"failed\"", source)


def test_the_page_hands_the_script_the_enums() -> None:
    html = Template("{% load run_vocabulary %}{% run_vocabulary %}").render(Context())
    body = re.search(r'<script id="run-vocabulary" type="application/json">(.*)</script>', html, re.S)
    assert body is not None
    vocab = json.loads(body.group(1))
    assert vocab["terminal"] == sorted(str(s) for s in TERMINAL_RUN_STATUSES)
    assert vocab["event_types"]["RUN_AWAITING_APPROVAL"] == "run.awaiting_approval"
    assert set(vocab["run_statuses"]) == {s.value for s in RunStatus}
    assert vocab["strategies"] == {str(v): str(label) for v, label in Strategy.choices}
    # TERMINAL in the runs app is exactly the engine's ending statuses.
    assert {str(s) for s in TERMINAL_RUN_STATUSES} == {s.value for s in RunStatus} - {
        "queued",
        "running",
        "awaiting_approval",
    }
