"""The conductor's planning call streams (issue 17): its text is stored and shown as plan.delta
events before plan.proposed, coalesced per round and attempt, and withheld like step output from
viewers who may not see a held run's content."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def test_planning_text_is_stored_as_plan_deltas_before_the_plan(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from apps.runs.models import RunEvent, RunStatus
    from apps.runs.selectors import withhold_event
    from apps.runs.services import run_create, run_wait
    from tests.fixtures.runs import scripted_plan

    scripted_plan(fake_pool.server)
    run = run_wait(
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="Go", source="playground").id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", "data"))
    types = [t for t, _ in events]
    proposed = next(d for t, d in events if t == "plan.proposed")
    deltas = [d for t, d in events if t == "plan.delta"]
    assert deltas, types
    assert "".join(d["text"] for d in deltas) == proposed["raw"]
    assert types.index("plan.started") < types.index("plan.delta") < types.index("plan.proposed")
    # A viewer who may not see content gets the event without its text.
    hidden = withhold_event({"type": "plan.delta", "seq": 1, "data": deltas[0]})
    assert hidden["data"]["text"] == "" and hidden["data"]["withheld"] is True
